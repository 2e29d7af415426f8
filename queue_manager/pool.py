"""Pools, their instances' queues, and the bookkeeping of admitted queries.

Everything here runs on the event loop thread only, so plain integers and deques are
safe without locks; that keeps dispatch at a few microseconds per query.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from queue_manager.protocol import Instance

PADDING_DECAY = 0.95  # per batch: the padding ratio remembers the last few dozen batches


@dataclass(frozen=True)
class TokenCharge:
    """What one query counts against a pool's token budget, in token-equivalents.

    Its length, plus `per_query` tokens for the fixed cost of a query, plus
    `per_squared_token * length^2` for attention, which grows with the square of the length
    (both from the estimator's length-aware fit). The default charges the bare length.
    """

    per_query: int = 0
    per_squared_token: float = 0.0

    def __call__(self, tokens: int) -> int:
        return tokens + self.per_query + math.ceil(self.per_squared_token * tokens * tokens)


class Request:
    """One admitted HTTP request: its queries' results land here, in input order.

    An interactive request has all its queries admitted at once. A bulk request (more queries
    than the pools had room for) keeps its token-id sequences and admits them in parts as room
    frees: `admitted` counts those handed to pools so far.
    """

    __slots__ = (
        "n",
        "remaining",
        "vectors",
        "future",
        "error",
        "queries",
        "created",
        "bulk",
        "sequences",
        "admitted",
        "loads",
        "finished",
        "abandoned",
        "queued",
        "computed",
        "served",
    )

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop, created: float = 0.0) -> None:
        self.n = n
        self.remaining = n
        self.vectors: np.ndarray | None = None
        self.future: asyncio.Future = loop.create_future()
        self.error: BaseException | None = None
        self.queries: list[Query] = []
        self.created = created
        self.bulk = False
        self.sequences: Sequence[np.ndarray] | None = None  # bulk only, until every part is admitted
        self.admitted = 0
        # Per pool it used: (pool, the pool's in-flight queries right after this request's own were
        # admitted), the C of the latency model, for the depth control's live fit.
        self.loads: list[tuple[Pool, int]] = []
        # Per pool name, when its last query there was answered; only for requests split over pools,
        # so that a pool's sample is not charged the time its request waited on the other pool.
        self.finished: dict[str, float] | None = None
        self.abandoned = False  # its caller left: no one reads its answers
        # Summed over its answered queries: seconds from admission to their batch's start, and their
        # batch's seconds on the instance; and the pools that answered them ("cpu", "accelerator+cpu").
        self.queued = 0.0
        self.computed = 0.0
        self.served = ""

    def note_answered(self, pool: str, queued: float, computed: float) -> None:
        """One of its queries was answered by `pool`, after `queued` seconds and a batch of `computed`."""
        self.queued += queued
        self.computed += computed
        if not self.served:
            self.served = pool
        elif pool != self.served and pool not in self.served.split("+"):  # one pool, mostly: no split
            self.served += "+" + pool

    def timing(self) -> tuple[float, float, str]:
        """The mean over its queries of their time in a queue and of their batch's time, as TEI's
        x-queue-time and x-inference-time say them, and the pools that answered."""
        return self.queued / self.n, self.computed / self.n, self.served

    def deliver(self, index: int, vector: np.ndarray) -> None:
        if self.vectors is None:
            self.vectors = np.empty((self.n, vector.shape[-1]), dtype=np.float32)
        self.vectors[index] = vector
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.vectors)
            # Each query points back at its request: the list left in place would make every
            # answered request a reference cycle, freed only by the garbage collector.
            self.queries.clear()

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


def _settled(request: Request) -> bool:
    """Answered, failed, or abandoned by its caller: an abandoned request's queued queries were
    dropped (QueueManager.cancel), so its answer may never come."""
    return request.abandoned or request.future.done()


class Query:
    """One input text of a request, admitted to a pool and queued on one of its instances."""

    __slots__ = ("request", "index", "ids", "tokens", "charge", "pool", "slot", "enqueued", "attempts", "done", "bulk")

    def __init__(self, request: Request, index: int, ids: np.ndarray, pool: Pool, bulk: bool = False) -> None:
        self.request = request
        self.index = index
        self.ids = ids
        self.tokens = len(ids)
        self.charge = pool.token_charge(self.tokens)  # fixed at admission: depths may change live
        self.pool = pool
        self.slot: InstanceSlot | None = None
        self.enqueued = 0.0
        self.attempts = 0
        self.done = False
        self.bulk = bulk  # holds one of the pool's bulk slots (Pool.bulk_in_flight)


@dataclass(eq=False)
class InstanceSlot:
    """An instance plus its own FIFO queue, which the queue manager hands to it in batches."""

    instance: Instance
    pool: Pool
    queue: deque = field(default_factory=deque)
    in_batch: int = 0  # queries in running batches
    # The batches handed to the instance and not yet answered, oldest (the one computing) first:
    # up to the instance's `pipeline` of them, for instance_down and failover.
    running: list = field(default_factory=list)
    batch_tasks: set = field(default_factory=set)
    last_answer: float = 0.0  # when the instance last answered: the next batch's compute starts there
    generation: int = 0  # bumped by instance_down: the batcher it replaced must let go quietly
    healthy: bool = False
    restarting: bool = False
    fill_due: bool = False  # a fill is scheduled for the loop's next step
    batches: int = 0
    failures: int = 0
    # Queries per second of busy time, exponentially weighted: feeds Retry-After.
    rate: float = 0.0

    @property
    def name(self) -> str:
        return self.instance.name

    @property
    def load(self) -> int:
        return len(self.queue) + self.in_batch

    @property
    def pipeline(self) -> int:
        """Batches the instance takes at once (protocol.Instance.pipeline; 1 when it says nothing)."""
        return max(1, int(getattr(self.instance, "pipeline", 1)))

    @property
    def ahead_fill(self) -> float:
        """Share of a full batch queued before one is handed over while another computes
        (protocol.Instance.ahead_fill; 0, at once, when it says nothing)."""
        return min(1.0, max(0.0, float(getattr(self.instance, "ahead_fill", 0.0))))

    def note_batch(self, queries: int, seconds: float) -> None:
        if seconds > 0:
            rate = queries / seconds
            self.rate = rate if self.rate == 0 else 0.8 * self.rate + 0.2 * rate

    def snapshot(self) -> dict:
        return {
            "name": self.name,
            "healthy": self.healthy,
            "restarting": self.restarting,
            "load": self.load,
            "batches": self.batches,
            "pipeline": self.pipeline,  # batches it holds at once
            "failures": self.failures,
        }


@dataclass(eq=False)
class Pool:
    """A device pool: its queue depth C_max bounds queries waiting plus being processed."""

    name: str
    depth: int
    instances: list[InstanceSlot] = field(default_factory=list)
    token_budget: int | None = None  # optional length-aware bound: tokens in flight
    token_charge: TokenCharge = TokenCharge()
    max_batch_size: int = 32
    max_batch_tokens: int = 16384  # padded: queries x the longest one
    in_flight: int = 0
    tokens_in_flight: int = 0
    bulk_in_flight: int = 0  # of in_flight, queries of bulk requests
    # The depth and token budget the last set_depth gave (calibration or probe): what the depth
    # control starts from and scales the token budget by.
    seed_depth: int = 0
    seed_token_budget: int | None = None
    # When the pool first filled up or could not take all a request offered it since its depth last
    # moved (None: not since): a deeper queue only matters, and only shows its latency, where the
    # pool was full, so only requests admitted from then on vouch for a rise.
    full_since: float | None = None
    metrics: object = None  # queue_manager.metrics.PoolMetrics, set by the manager
    control: object = None  # queue_manager.depth_control.DepthController, set by the manager
    # Recent batches' charge when padded to their longest query over their charge by own
    # length (decayed sums, so that the ratio follows the traffic's length mix).
    padded_charge: float = 0.0
    own_charge: float = 0.0
    # Interactive requests in admission order, with the pool's in-flight queries at their admission,
    # until answered or abandoned: depth control counts those unanswered after an SLO (`overdue`).
    pending: deque[tuple[Request, int]] = field(default_factory=deque)

    def note_full(self, now: float) -> None:
        if self.full_since is None:
            self.full_since = now

    def track(self, request: Request, concurrency: int) -> None:
        """Note an admitted interactive request for `overdue`. The settled ones at the front are
        forgotten here too, so that the queue stays as long as what is in flight whether or not
        a control step ever reads it (no SLO, or no control loop)."""
        self._forget_settled()
        self.pending.append((request, concurrency))

    def overdue(self, admitted_before: float) -> list[tuple[float, int]]:
        """(admitted, concurrency) of the requests admitted before `admitted_before` and not yet
        settled; forgets the settled ones at the front."""
        self._forget_settled()
        late = []
        for request, concurrency in self.pending:
            if request.created >= admitted_before:
                break
            if not _settled(request):
                late.append((request.created, concurrency))
        return late

    def _forget_settled(self) -> None:
        pending = self.pending
        while pending and _settled(pending[0][0]):
            pending.popleft()

    @property
    def padding(self) -> float:
        """How much more the recent batches cost than their queries' charges: >= 1."""
        return self.padded_charge / self.own_charge if self.own_charge > 0 else 1.0

    def note_padding(self, batch: list[Query]) -> None:
        longest = max(query.tokens for query in batch)
        self.padded_charge = PADDING_DECAY * self.padded_charge + len(batch) * self.token_charge(longest)
        self.own_charge = PADDING_DECAY * self.own_charge + sum(query.charge for query in batch)

    def room(self) -> int:
        return max(0, self.depth - self.in_flight)

    def fit_tokens(self, sequences: Sequence[np.ndarray]) -> int:
        """How many of `sequences` fit the token budget, in order.

        The budget shrinks by the recent padding (`padding`): charges count each query's own
        length, but a batch costs its longest query's for every member. An idle pool takes one
        query whatever its charge: a query too long to meet the SLO even alone would otherwise be
        refused forever, and serving it late beats that.
        """
        budget = self.token_budget / self.padding - self.tokens_in_flight
        taken = 0
        for seq in sequences:
            budget -= self.token_charge(len(seq))
            if budget < 0 and (taken or self.tokens_in_flight):
                break
            taken += 1
        return taken

    def bulk_room(self, share: float) -> int:
        """Slots bulk queries may take now: at most `share` of the depth (at least one, or a
        shallow pool would never serve bulk), and never what the pool has not free."""
        limit = max(1, math.floor(self.depth * share))
        return max(0, min(self.room(), limit - self.bulk_in_flight))

    def serving(self) -> bool:
        """Some instance of the pool can take queries."""
        for slot in self.instances:
            if slot.healthy:
                return True
        return False

    def healthy_slots(self) -> list[InstanceSlot]:
        return [slot for slot in self.instances if slot.healthy]

    def least_loaded(self, exclude: InstanceSlot | None = None) -> InstanceSlot | None:
        best = None
        for slot in self.instances:
            if slot.healthy and slot is not exclude and (best is None or slot.load < best.load):
                best = slot
        return best

    def drain_rate(self) -> float:
        return sum(slot.rate for slot in self.instances if slot.healthy)

    def snapshot(self, now: float) -> dict:
        """The pool's state for /info, its depth control's included."""
        return {
            "name": self.name,
            "depth": self.depth,
            "seed_depth": self.seed_depth,
            "token_budget": self.token_budget,
            "padding": round(self.padding, 4),
            "token_charge": {
                "per_query": self.token_charge.per_query,
                "per_squared_token": self.token_charge.per_squared_token,
            },
            "max_batch_size": self.max_batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "in_flight": self.in_flight,
            "bulk_in_flight": self.bulk_in_flight,
            "queued": sum(len(slot.queue) for slot in self.instances),
            "control": self.control.snapshot(now),
            "instances": [slot.snapshot() for slot in self.instances],
        }
