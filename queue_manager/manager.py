"""Dispatch (the WindVE paper's Algorithm 1), continuous batching and failover.

Admission of a request is atomic: each of its queries goes to the accelerator pool while
it has room, the rest to the CPU pool when heterogeneous computing is on and it has room
for all of them; otherwise the request is BUSY and nothing of it stays queued.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from queue_manager import metrics
from queue_manager.pool import InstanceSlot, Pool, Query, Request, TokenCharge
from queue_manager.protocol import Busy, Instance, QueryFailed, ShuttingDown

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # a query meets at most this many failing instances before it errors
LOOKAHEAD = 128  # queued queries a batch looks past the oldest for companions of similar length
MAX_LENGTH_SPREAD = 1.5  # longest / shortest query in one batch
RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)


class QueueManager:
    def __init__(
        self,
        pools: Sequence[tuple[str, int, Sequence[Instance]]],
        *,
        heterogeneous: bool = True,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
    ) -> None:
        """`pools` in priority order: (name, depth, instances); the first is the accelerator pool."""
        if not pools:
            raise ValueError("the queue manager needs at least one pool")
        self.pools: list[Pool] = []
        for name, depth, instances in pools:
            pool = Pool(name=name, depth=int(depth))
            pool.instances = [InstanceSlot(instance=inst, pool=pool) for inst in instances]
            if not pool.instances:
                raise ValueError(f"pool {name!r} has no instances")
            pool.metrics = metrics.PoolMetrics(pool)
            self.pools.append(pool)
        # Algorithm 1: with heterogeneous computing off, only the first (accelerator) pool serves.
        self.heterogeneous = heterogeneous
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.draining = False
        self.in_flight = 0  # over all pools: drain() waits for zero
        self._idle = asyncio.Event()
        self._idle.set()
        self._restarts: set[asyncio.Task] = set()

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start (load and warm) every instance concurrently, then their batchers."""
        slots = [slot for pool in self.pools for slot in pool.instances]
        await asyncio.gather(*(slot.instance.start() for slot in slots))
        for slot in slots:
            slot.healthy = True
            slot.task = asyncio.create_task(self._batcher(slot), name=f"batcher-{slot.name}")

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop admitting (BUSY from now on) and wait until every admitted query is answered."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        self.draining = True
        for task in list(self._restarts):
            task.cancel()
        for pool in self.pools:
            for slot in pool.instances:
                if slot.task:
                    slot.task.cancel()
        for pool in self.pools:
            for slot in pool.instances:
                self._fail_queued(slot, QueryFailed("the service is shutting down"))
        await asyncio.gather(
            *(slot.instance.close() for pool in self.pools for slot in pool.instances),
            return_exceptions=True,
        )

    # ---- admission -------------------------------------------------------------------

    def eligible_pools(self) -> list[Pool]:
        return self.pools if self.heterogeneous else self.pools[:1]

    def check_room(self, wanted: int) -> None:
        """Raise Busy (ShuttingDown while draining) when the eligible pools cannot take `wanted`
        queries whatever their lengths, as admission would.

        The HTTP path asks before it tokenizes, so an overloaded service answers BUSY without that
        work (and without the tasks a submission starts), which under a flood of retries was most
        of what a refusal cost. Passing promises nothing: admission decides, and a token budget may
        still refuse.
        """
        self._refuse_if_draining(wanted)
        room = sum(pool.room() for pool in self.eligible_pools() if pool.least_loaded() is not None)
        if room < wanted:
            metrics.BUSY.inc()
            raise Busy(retry_after=self.retry_after(wanted))

    def _refuse_if_draining(self, wanted: int) -> None:
        if self.draining:
            raise ShuttingDown(retry_after=self.retry_after(wanted), message="the service is shutting down")

    def _plan(self, sequences: Sequence[np.ndarray], only: Pool | None) -> list[tuple[Pool, int]]:
        """How many of the request's queries each pool takes, or raise Busy."""
        wanted = len(sequences)
        self._refuse_if_draining(wanted)
        if only is not None:
            return [(only, wanted)]
        shares: list[tuple[Pool, int]] = []
        left = wanted
        start = 0
        for pool in self.eligible_pools():
            take = min(left, pool.room())
            if pool.token_budget is not None and take:
                take = self._fit_tokens(pool, sequences[start : start + take])
            if take and pool.least_loaded() is not None:
                shares.append((pool, take))
                left -= take
                start += take
            if left == 0:
                return shares
        metrics.BUSY.inc()
        raise Busy(retry_after=self.retry_after(wanted))

    @staticmethod
    def _fit_tokens(pool: Pool, sequences: Sequence[np.ndarray]) -> int:
        """How many of `sequences` fit the pool's token budget, in order.

        The budget shrinks by the pool's recent padding (`Pool.padding`): charges count each
        query's own length, but a batch costs its longest query's for every member. An idle
        pool takes one query whatever its charge: a query too long to meet the SLO even
        alone would otherwise be refused forever, and serving it late beats that.
        """
        budget = pool.token_budget / pool.padding - pool.tokens_in_flight
        taken = 0
        for seq in sequences:
            budget -= pool.token_charge(len(seq))
            if budget < 0 and (taken or pool.tokens_in_flight):
                break
            taken += 1
        return taken

    async def submit(self, sequences: Sequence[np.ndarray], pool: str | None = None) -> np.ndarray:
        """Embed one request's token-id sequences: float32 [n, dim] in input order.

        Raises Busy when no eligible pool has room. With `pool`, the request goes to that
        pool only and its depth is not enforced: the estimator uses this to profile a pool.
        A cancelled caller (client gone) drops its queued queries and frees their slots.
        """
        if not sequences:
            return np.empty((0, 0), dtype=np.float32)
        request = self.admit(sequences, pool)
        try:
            return await request.future
        except asyncio.CancelledError:
            self.cancel(request)
            raise

    def admit(self, sequences: Sequence[np.ndarray], pool: str | None = None) -> Request:
        """The synchronous half of submit: Algorithm 1 and the bookkeeping, or raise Busy."""
        only = self._pool_named(pool) if pool is not None else None
        shares = self._plan(sequences, only)
        request = Request(len(sequences), asyncio.get_running_loop())
        index = 0
        now = time.perf_counter()
        for target, count in shares:
            for _ in range(count):
                query = Query(request, index, sequences[index], target)
                query.enqueued = now
                request.queries.append(query)
                self._admit(query)
                index += 1
            target.metrics.dispatched.inc(count)
        self._idle.clear()
        return request

    def pool_submitter(self, pool: str) -> Callable[[Sequence[np.ndarray]], Awaitable[np.ndarray]]:
        target = self._pool_named(pool).name

        async def submit(sequences: Sequence[np.ndarray]) -> np.ndarray:
            return await self.submit(sequences, pool=target)

        return submit

    def _pool_named(self, name: str) -> Pool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no pool named {name!r} (pools: {[p.name for p in self.pools]})")

    def _admit(self, query: Query) -> None:
        pool = query.pool
        pool.in_flight += 1
        pool.tokens_in_flight += query.charge
        self.in_flight += 1
        slot = pool.least_loaded()
        if slot is None:  # only reachable with pool= on a pool whose instances all failed
            self._finish(query)
            query.request.fail(QueryFailed(f"pool {pool.name} has no healthy instance"))
            return
        self._enqueue(slot, query)

    def _enqueue(self, slot: InstanceSlot, query: Query) -> None:
        query.slot = slot
        slot.queue.append(query)
        slot.wakeup.set()

    def _finish(self, query: Query) -> None:
        """Free the query's slot in its pool: exactly once per admitted query."""
        if query.done:
            return
        query.done = True
        pool = query.pool
        pool.in_flight -= 1
        pool.tokens_in_flight -= query.charge
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def cancel(self, request: Request) -> None:
        """Drop the request's queued queries and free their slots (its caller has gone).

        Queries already in a running batch keep their slots until the batch ends.
        """
        for query in self._drop_queued(request):
            query.pool.metrics.cancelled.inc()

    def _drop_queued(self, request: Request) -> list[Query]:
        """Take the request's still-queued queries off their queues and free their slots: no one
        will read their answers. Returns them."""
        dropped = []
        for query in request.queries:
            slot = query.slot
            if query.done or slot is None:
                continue
            try:
                slot.queue.remove(query)
            except ValueError:
                continue  # in a running batch (its slot frees when the batch ends), or being failed over
            self._finish(query)
            dropped.append(query)
        request.queries.clear()  # see Request.deliver
        return dropped

    # ---- batching --------------------------------------------------------------------

    def _take_batch(self, slot: InstanceSlot) -> list[Query]:
        """The oldest query, joined by queued queries of similar length.

        Up to max_batch_size queries and max_batch_tokens padded tokens. A batch is padded
        to its longest query, so a 16-token query batched with a 256-token one costs 256:
        companions are taken in FIFO order from the next LOOKAHEAD queries, skipping those
        whose length would stretch the batch's longest/shortest ratio past MAX_LENGTH_SPREAD.
        The oldest query always goes first, so nothing waits behind more than a few batches.
        """
        queue = slot.queue
        head = queue.popleft()
        batch = [head]
        longest = shortest = head.tokens
        skipped = 0
        while skipped < min(len(queue), LOOKAHEAD) and len(batch) < self.max_batch_size:
            candidate = queue[skipped]
            tokens = candidate.tokens
            wider_longest, wider_shortest = max(longest, tokens), min(shortest, tokens)
            fits = (len(batch) + 1) * wider_longest <= self.max_batch_tokens
            if fits and wider_longest <= MAX_LENGTH_SPREAD * wider_shortest:
                del queue[skipped]
                batch.append(candidate)
                longest, shortest = wider_longest, wider_shortest
            elif not fits and tokens <= longest:
                break  # the batch is full of tokens: nothing queued can join it
            else:
                skipped += 1
        return batch

    async def _batcher(self, slot: InstanceSlot) -> None:
        pool_metrics = slot.pool.metrics
        while True:
            if not slot.queue:
                slot.wakeup.clear()
                await slot.wakeup.wait()
                continue
            batch = self._take_batch(slot)
            slot.in_batch = len(batch)
            if slot.pool.token_budget is not None:
                slot.pool.note_padding(batch)
            started = time.perf_counter()
            for query in batch:
                pool_metrics.queue_time.observe(started - query.enqueued)
            try:
                vectors = await slot.instance.embed([query.ids for query in batch])
                if len(vectors) != len(batch):
                    raise QueryFailed(f"instance {slot.name} returned {len(vectors)} vectors for {len(batch)} queries")
            except asyncio.CancelledError:
                slot.in_batch = 0
                self._fail_batch(batch, QueryFailed("the service is shutting down"))
                raise
            except Exception as error:  # noqa: BLE001 - any instance error triggers failover
                slot.in_batch = 0
                self._on_instance_failure(slot, batch, error)
                return  # the restart task starts a new batcher for this slot
            elapsed = time.perf_counter() - started
            slot.in_batch = 0
            slot.batches += 1
            slot.note_batch(len(batch), elapsed)
            pool_metrics.inference_time.observe(elapsed)
            pool_metrics.batch_size.observe(len(batch))
            self._complete(batch, vectors)

    def _complete(self, batch: list[Query], vectors: np.ndarray) -> None:
        for query, vector in zip(batch, vectors):
            if not query.done:
                self._finish(query)
                query.request.deliver(query.index, vector)

    # ---- failures --------------------------------------------------------------------

    def _on_instance_failure(self, slot: InstanceSlot, batch: list[Query], error: Exception) -> None:
        slot.healthy = False
        slot.failures += 1
        log.error("instance %s failed (%s); moving its queries and restarting it", slot.name, error)
        orphans = batch + list(slot.queue)
        slot.queue.clear()
        for query in orphans:
            if query.done:
                continue
            if query.request.future.done():  # its request failed or its caller left: no one waits
                self._finish(query)
                continue
            query.attempts += 1
            target = slot.pool.least_loaded(exclude=slot)
            if query.attempts >= MAX_ATTEMPTS or target is None:
                self._fail_query(query, QueryFailed(f"instance {slot.name} failed: {error}"))
                continue
            slot.pool.metrics.failovers.inc()
            self._enqueue(target, query)
        task = asyncio.create_task(self._restart(slot), name=f"restart-{slot.name}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, slot: InstanceSlot) -> None:
        slot.restarting = True
        attempt = 0
        while True:
            try:
                await slot.instance.restart()
                break
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001
                delay = RESTART_BACKOFF[min(attempt, len(RESTART_BACKOFF) - 1)]
                log.error("restarting %s failed (%s); retrying in %.1fs", slot.name, error, delay)
                attempt += 1
                await asyncio.sleep(delay)
        slot.restarting = False
        slot.healthy = True
        log.info("instance %s is back", slot.name)
        slot.task = asyncio.create_task(self._batcher(slot), name=f"batcher-{slot.name}")

    def _fail_query(self, query: Query, error: Exception) -> None:
        """Fail the query's request, and drop its other queries still queued: computing them would
        only spend an instance on answers no one reads."""
        if query.done:
            return
        self._finish(query)
        query.pool.metrics.failed.inc()
        query.request.fail(error)
        self._drop_queued(query.request)

    def _fail_batch(self, batch: list[Query], error: Exception) -> None:
        for query in batch:
            self._fail_query(query, error)

    def _fail_queued(self, slot: InstanceSlot, error: Exception) -> None:
        queued = list(slot.queue)
        slot.queue.clear()
        self._fail_batch(queued, error)

    # ---- introspection ---------------------------------------------------------------

    def retry_after(self, queries: int) -> float:
        """Seconds until the eligible pools should have drained enough for `queries`."""
        pools = self.eligible_pools()
        rate = sum(pool.drain_rate() for pool in pools)
        backlog = sum(pool.in_flight for pool in pools)
        if rate <= 0:
            return 1.0
        return float(max(1, math.ceil(backlog / rate)))

    def set_depth(
        self, pool: str, depth: int, token_budget: int | None = None, token_charge: TokenCharge = TokenCharge()
    ) -> None:
        """Apply a new depth live (calibration update); admitted queries are unaffected.

        With a token budget, each query is charged `token_charge(length)` tokens against it.
        """
        target = self._pool_named(pool)
        target.depth = int(depth)
        target.token_budget = token_budget
        target.token_charge = token_charge

    def healthy(self) -> bool:
        """Every pool has at least one instance able to serve."""
        return all(pool.least_loaded() is not None for pool in self.pools)

    def all_instances_healthy(self) -> bool:
        return all(slot.healthy for pool in self.pools for slot in pool.instances)

    def snapshot(self) -> dict:
        return {
            "heterogeneous": self.heterogeneous,
            "draining": self.draining,
            "pools": [
                {
                    "name": pool.name,
                    "depth": pool.depth,
                    "token_budget": pool.token_budget,
                    "padding": round(pool.padding, 4),
                    "token_charge": {
                        "per_query": pool.token_charge.per_query,
                        "per_squared_token": pool.token_charge.per_squared_token,
                    },
                    "in_flight": pool.in_flight,
                    "queued": sum(len(slot.queue) for slot in pool.instances),
                    "instances": [
                        {
                            "name": slot.name,
                            "healthy": slot.healthy,
                            "restarting": slot.restarting,
                            "load": slot.load,
                            "batches": slot.batches,
                            "failures": slot.failures,
                        }
                        for slot in pool.instances
                    ],
                }
                for pool in self.pools
            ],
        }
