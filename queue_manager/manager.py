"""Dispatch (the WindVE paper's Algorithm 1), continuous batching, bulk requests, failover, live depths.

A request the eligible pools have room for is *interactive* and admitted atomically: each of its
queries goes to the accelerator pool while it has room, the rest to the CPU pool when heterogeneous
computing is on. A larger one is *bulk* when the pools have any room at all: it waits in a FIFO
backlog and its queries take slots in parts as room frees, at most `bulk_share` of each pool's depth
at once, so that interactive requests keep finding room. With no room at all the answer is BUSY and
nothing of the request stays queued; with no instance able to serve, Unavailable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal

import numpy as np

from queue_manager import metrics
from queue_manager.batching import take_batch, worth_sending_ahead
from queue_manager.bulk import BulkBacklog
from queue_manager.depth_control import ControlSettings, DepthController, Move
from queue_manager.pool import InstanceSlot, Pool, Query, Request, TokenCharge
from queue_manager.protocol import Busy, Instance, QueryFailed, ShuttingDown, Unavailable

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # a query meets at most this many failing instances before it errors
RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0)
BULK_BACKLOG_DEPTHS = 4  # bulk queries waiting for a slot may reach this many times the pools' depths
UNAVAILABLE_RETRY_AFTER = 2.0  # seconds: about a restart's first backoff plus a model load


class QueueManager:
    def __init__(
        self,
        pools: Sequence[tuple[str, int, Sequence[Instance]]],
        *,
        heterogeneous: bool = True,
        max_batch_size: int = 32,
        max_batch_tokens: int = 16384,
        batch_limits: Mapping[str, tuple[int, int]] | None = None,
        bulk_share: float = 0.5,
        bulk_backlog: int | None = None,
        depth_control: Literal["adaptive", "static"] = "static",
        slo: float | None = None,
        depth_cap: float = 2.0,
        control_interval: float | None = 0.5,
        control: ControlSettings | None = None,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`pools` in priority order: (name, depth, instances); the first is the accelerator pool.

        `batch_limits`: per pool name, (max_batch_size, max_batch_tokens); pools not named take the
        global ones. `bulk_backlog`: most bulk queries waiting for a slot (default
        BULK_BACKLOG_DEPTHS x the eligible pools' depths). `depth_control="adaptive"` moves each depth
        toward the live SLO crossing every `control_interval` seconds (None: only when step() is
        called); it needs `slo` (or `control`, which sets every knob). `now` is the clock of every
        timestamp and of the control: tests give a virtual one.
        """
        if not pools:
            raise ValueError("the queue manager needs at least one pool")
        if not 0 < bulk_share <= 1:
            raise ValueError(f"bulk_share must be in (0, 1], got {bulk_share!r}")
        if depth_control not in ("adaptive", "static"):
            raise ValueError(f"depth_control must be 'adaptive' or 'static', got {depth_control!r}")
        if control is None and slo is not None:
            control = ControlSettings(slo=slo, cap=depth_cap)
        if depth_control == "adaptive" and control is None:
            raise ValueError("adaptive depth control needs the SLO (slo=...)")
        limits = dict(batch_limits or {})
        unknown = set(limits) - {name for name, _, _ in pools}
        if unknown:
            raise ValueError(f"batch limits for unknown pools: {sorted(unknown)}")
        self._now = now
        self.pools: list[Pool] = []
        for name, depth, instances in pools:
            batch_size, batch_tokens = limits.get(name, (max_batch_size, max_batch_tokens))
            pool = Pool(name=name, depth=int(depth), max_batch_size=batch_size, max_batch_tokens=batch_tokens)
            pool.seed_depth = pool.depth
            pool.instances = [InstanceSlot(instance=inst, pool=pool) for inst in instances]
            if not pool.instances:
                raise ValueError(f"pool {name!r} has no instances")
            # Static pools get a controller too: the live fit and tail are worth showing either way.
            pool.control = DepthController(
                control or ControlSettings(slo=1.0), pool.depth, now(), floor=len(pool.instances)
            )
            pool.metrics = metrics.PoolMetrics(pool, self)
            self.pools.append(pool)
        # Algorithm 1: with heterogeneous computing off, only the first (accelerator) pool serves.
        self.heterogeneous = heterogeneous
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.bulk_share = bulk_share
        self.bulk_backlog = bulk_backlog
        self.depth_control = depth_control
        self.control_interval = control_interval
        self._measured = control is not None  # without an SLO there is nothing to fit against
        self._backlog = BulkBacklog()
        metrics.BULK_WAITING.set_function(lambda: self._backlog.waiting)
        self.draining = False
        self.serving = False  # its depths are set for clients (the owner says so once it has set them)
        self.in_flight = 0  # over all pools: drain() waits for zero, and for no bulk query waiting
        self._idle = asyncio.Event()
        self._idle.set()
        self._restarts: set[asyncio.Task] = set()
        self._control_task: asyncio.Task | None = None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start (load and warm) every instance concurrently, then their batchers and the control."""
        slots = [slot for pool in self.pools for slot in pool.instances]
        await asyncio.gather(*(slot.instance.start() for slot in slots))
        for slot in slots:
            slot.healthy = True
        if self._measured and self.control_interval:
            self._control_task = asyncio.create_task(self._control_loop(), name="depth-control")

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop admitting (BUSY from now on) and wait until every admitted query is answered,
        bulk queries still waiting for a slot included."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        self.draining = True
        if self._control_task:
            self._control_task.cancel()
        for task in list(self._restarts):
            task.cancel()
        for pool in self.pools:
            for slot in pool.instances:
                self._abandon_batches(slot, QueryFailed("the service is shutting down"))
        for request in self._backlog.clear():
            request.fail(QueryFailed("the service is shutting down"))
        for pool in self.pools:
            for slot in pool.instances:
                self._fail_queued(slot, QueryFailed("the service is shutting down"))
        self._note_if_idle()
        await asyncio.gather(
            *(slot.instance.close() for pool in self.pools for slot in pool.instances),
            return_exceptions=True,
        )

    # ---- admission -------------------------------------------------------------------

    def eligible_pools(self) -> list[Pool]:
        return self.pools if self.heterogeneous else self.pools[:1]

    def serving_pools(self) -> list[Pool]:
        """The eligible pools with an instance able to serve (none, possibly)."""
        return [pool for pool in self.eligible_pools() if pool.serving()]

    def _serving_pools(self) -> list[Pool]:
        """The eligible pools with an instance able to serve; Unavailable when there is none."""
        pools = self.serving_pools()
        if not pools:
            metrics.UNAVAILABLE.inc()
            raise Unavailable(retry_after=UNAVAILABLE_RETRY_AFTER)
        return pools

    def check_room(self, wanted: int, promised: int = 0) -> None:
        """Raise what admission would for `wanted` queries whatever their lengths: ShuttingDown while
        draining, Unavailable when no eligible pool can serve, Busy when they have no room at all or
        (for a request larger than their room, which would be bulk) when the bulk backlog is full.
        `promised`: room already let to requests that have not reached admission yet.

        The HTTP path asks before it tokenizes, so an overloaded service answers BUSY without that
        work (and without the tasks a submission starts), which under a flood of retries was most
        of what a refusal cost. Passing promises nothing: admission decides, and a token budget may
        still refuse.
        """
        self._refuse_if_draining(wanted)
        room = sum(pool.room() for pool in self._serving_pools()) - promised
        if wanted <= room or (room > 0 and self._backlog.allows(wanted, self._backlog_bound())):
            return
        self.lacked_room()
        raise Busy(retry_after=self.retry_after(wanted))  # the front end's refusal: it counts it

    def live_tail(self) -> float | None:
        """The slowest live p99 (seconds) of the eligible pools that can serve, None before any
        answer: what an admitted request may expect at worst, for the front ends' lane budget."""
        tails = [
            pool.control.current_p99
            for pool in self.serving_pools()
            if pool.control is not None and pool.control.current_p99 is not None
        ]
        return max(tails) if tails else None

    def lacked_room(self) -> None:
        """A request was refused for want of room, counting the room promised to requests on
        their way to admission: depth control's sign that the eligible pools were full. The
        promised requests may never bring a pool to its depth (a batch answered meanwhile frees
        room), and a pool whose refusals were all made here held its depth for seconds under
        clients enough to fill it (bench/DEPTH_CONTROL.md). Remote front ends refuse from the
        state board and say so with their next request (dispatcher/server.py)."""
        now = self._now()
        for pool in self.serving_pools():
            pool.note_full(now)

    def _refuse_if_draining(self, wanted: int) -> None:
        if self.draining:
            raise ShuttingDown(retry_after=self.retry_after(wanted), message="the service is shutting down")

    def _backlog_bound(self) -> int:
        if self.bulk_backlog is not None:
            return self.bulk_backlog
        return BULK_BACKLOG_DEPTHS * sum(pool.depth for pool in self.eligible_pools())

    def _plan(self, sequences: Sequence[np.ndarray], pools: list[Pool]) -> tuple[list[tuple[Pool, int]], int]:
        """Algorithm 1: how many of the request's queries each pool takes now, and their total."""
        shares: list[tuple[Pool, int]] = []
        left = len(sequences)
        start = 0
        for pool in pools:
            take = min(left, pool.room())
            if pool.token_budget is not None and take:
                take = pool.fit_tokens(sequences[start : start + take])
            if take < left:
                pool.note_full(self._now())
            if take:
                shares.append((pool, take))
                left -= take
                start += take
            if left == 0:
                break
        return shares, start

    async def submit(self, sequences: Sequence[np.ndarray], pool: str | None = None) -> np.ndarray:
        """Embed one request's token-id sequences: float32 [n, dim] in input order.

        Raises Busy, Unavailable or ShuttingDown as admit does. With `pool`, the request goes to
        that pool only and its depth is not enforced: the estimator uses this to profile a pool.
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
        """The synchronous half of submit: admit the request whole (interactive) or into the bulk
        backlog, or raise ShuttingDown, Unavailable or Busy. Its future resolves to every vector."""
        wanted = len(sequences)
        self._refuse_if_draining(wanted)
        if pool is not None:
            return self._admit_whole(sequences, [(self._pool_named(pool), wanted)])
        pools = self._serving_pools()
        shares, taken = self._plan(sequences, pools)
        if taken == wanted:
            return self._admit_whole(sequences, shares)
        # Room for some but not all: bulk. Room for none: the queues are full of other work.
        if taken and self._backlog.allows(wanted, self._backlog_bound()):
            return self._admit_bulk(sequences)
        metrics.BUSY.inc()
        raise Busy(retry_after=self.retry_after(wanted))

    def _admit_whole(self, sequences: Sequence[np.ndarray], shares: list[tuple[Pool, int]]) -> Request:
        now = self._now()
        request = Request(len(sequences), asyncio.get_running_loop(), now)
        index = 0
        for target, count in shares:
            for _ in range(count):
                query = Query(request, index, sequences[index], target)
                query.enqueued = now
                request.queries.append(query)
                self._admit(query)
                index += 1
            target.metrics.dispatched.inc(count)
            request.loads.append((target, target.in_flight))
            target.track(request, target.in_flight)
            if target.in_flight >= target.depth:
                # Filled: what comes next is refused, maybe by a front end that never asks here.
                target.note_full(now)
        request.admitted = index
        if len(shares) > 1:
            request.finished = {}
        self._idle.clear()
        return request

    def _admit_bulk(self, sequences: Sequence[np.ndarray]) -> Request:
        request = Request(len(sequences), asyncio.get_running_loop(), self._now())
        request.bulk = True
        request.sequences = sequences
        self._backlog.add(request)
        metrics.BULK_REQUESTS.inc()
        self._idle.clear()
        self._admit_waiting_bulk()
        return request

    def _admit_waiting_bulk(self) -> None:
        """Give the oldest bulk requests the slots they may take now (see Pool.bulk_room)."""
        backlog = self._backlog
        while backlog:
            request = backlog.head
            taken = self._admit_bulk_part(request)
            backlog.took(request, taken)
            if request.admitted < request.n:
                return  # FIFO: nothing passes the oldest

    def _admit_bulk_part(self, request: Request) -> int:
        sequences = request.sequences
        start = request.admitted
        left = request.n - start
        now = self._now()
        for pool in self.eligible_pools():
            if not pool.serving():
                continue
            take = min(left, pool.bulk_room(self.bulk_share))
            if pool.token_budget is not None and take:
                take = pool.fit_tokens(sequences[start : start + take])
            if take < left:
                pool.note_full(now)
            for index in range(start, start + take):
                query = Query(request, index, sequences[index], pool, bulk=True)
                query.enqueued = now
                request.queries.append(query)
                self._admit(query)
            if take:
                pool.metrics.dispatched.inc(take)
            start += take
            left -= take
            if not left:
                break
        return start - request.admitted

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
        if query.bulk:
            pool.bulk_in_flight += 1
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
        if not slot.fill_due:
            # At the loop's next step, not now: the queries admitted in this step (one per request
            # read) join one batch rather than each leaving alone.
            slot.fill_due = True
            asyncio.get_running_loop().call_soon(self._fill_due, slot)

    def _finish(self, query: Query) -> None:
        """Free the query's slot in its pool: exactly once per admitted query."""
        if query.done:
            return
        query.done = True
        pool = query.pool
        pool.in_flight -= 1
        pool.tokens_in_flight -= query.charge
        if query.bulk:
            pool.bulk_in_flight -= 1
        self.in_flight -= 1
        if self.in_flight == 0 and not self._backlog:
            self._idle.set()

    def _note_if_idle(self) -> None:
        if self.in_flight == 0 and not self._backlog:
            self._idle.set()

    def _freed(self) -> None:
        """Slots were freed or pools came back: the oldest bulk requests may take some."""
        if self._backlog:
            self._admit_waiting_bulk()

    def cancel(self, request: Request) -> None:
        """Drop the request's queued queries and its bulk queries not yet admitted, and free their
        slots (its caller has gone). Queries already in a running batch keep their slots until the
        batch ends, and are not failed over if their instance fails.
        """
        request.abandoned = True
        for query in self._drop_queued(request):
            query.pool.metrics.cancelled.inc()
        self._freed()

    def _drop_queued(self, request: Request) -> list[Query]:
        """Take the request's still-queued queries off their queues and free their slots, and take it
        out of the bulk backlog: no one will read its answers. Returns the dropped queries."""
        if self._backlog.discard(request):
            self._note_if_idle()
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

    def _fill_due(self, slot: InstanceSlot) -> None:
        slot.fill_due = False
        self._fill(slot)

    def _fill(self, slot: InstanceSlot) -> None:
        """Hand the slot's queue to its instance in batches, up to `slot.pipeline` at once.

        Called in the loop step that admits queries or learns of an answer, with no task between:
        where the event loop is busy (thousands of refusals a second), every step between an
        engine's answer and its next batch is an engine idle (bench/SERVED.md).
        """
        while slot.healthy and slot.queue and len(slot.running) < slot.pipeline:
            if slot.running and not worth_sending_ahead(slot):
                break  # the instance computes: its answer fills the next batch (_batch_answered)
            batch = take_batch(slot.queue, slot.pool.max_batch_size, slot.pool.max_batch_tokens)
            slot.in_batch += len(batch)
            slot.running.append(batch)
            if slot.pool.token_budget is not None:
                slot.pool.note_padding(batch)
            sent = self._now()
            for query in batch:
                slot.pool.metrics.queue_time.observe(sent - query.enqueued)
            slot.pool.metrics.batch_tokens.observe(len(batch) * max(query.tokens for query in batch))
            self._launch(slot, batch, sent)

    def _launch(self, slot: InstanceSlot, batch: list[Query], sent: float) -> None:
        """Start the batch on the instance. An instance with `submit` starts it in this call and its
        answer lands in the loop's next step; one with only `embed` runs in a task."""
        generation, sequences = slot.generation, [query.ids for query in batch]
        submit = getattr(slot.instance, "submit", None)
        if submit is None:
            task = asyncio.create_task(self._embed_batch(slot, batch, generation, sent), name=f"batch-{slot.name}")
            slot.batch_tasks.add(task)
            task.add_done_callback(slot.batch_tasks.discard)
            return
        loop = asyncio.get_running_loop()

        def settled(future: concurrent.futures.Future) -> None:  # on the instance's thread
            try:
                loop.call_soon_threadsafe(self._batch_settled, slot, batch, generation, sent, future)
            except RuntimeError:
                pass  # the loop has closed: nothing waits for these answers any more

        try:
            future = submit(sequences)
        except Exception as error:  # noqa: BLE001 - a stopped instance refuses at once
            future = concurrent.futures.Future()
            future.set_exception(error)
        future.add_done_callback(settled)

    async def _embed_batch(self, slot: InstanceSlot, batch: list[Query], generation: int, sent: float) -> None:
        try:
            vectors = await slot.instance.embed([query.ids for query in batch])
        except asyncio.CancelledError:
            if slot.generation == generation:  # cancelled by close(), not by a take-down
                self._forget_batch(slot, batch)
                self._fail_batch(batch, QueryFailed("the service is shutting down"))
            raise
        except Exception as error:  # noqa: BLE001 - any instance error triggers failover
            if slot.generation == generation:
                self._take_down(slot, error)
            return
        self._batch_answered(slot, batch, generation, sent, vectors)

    def _batch_settled(
        self, slot: InstanceSlot, batch: list[Query], generation: int, sent: float, future: concurrent.futures.Future
    ) -> None:
        if slot.generation != generation:
            return  # the instance was declared down (or closed): its queries were moved or failed
        error = future.exception()
        if error is not None:
            self._take_down(slot, error)
            return
        self._batch_answered(slot, batch, generation, sent, future.result())

    def _batch_answered(
        self, slot: InstanceSlot, batch: list[Query], generation: int, sent: float, vectors: np.ndarray
    ) -> None:
        if slot.generation != generation:
            return  # answers of an instance declared down: its queries were moved and run elsewhere
        if len(vectors) != len(batch):
            wrong = f"instance {slot.name} returned {len(vectors)} vectors for {len(batch)} queries"
            self._take_down(slot, QueryFailed(wrong))
            return
        answered = self._now()
        # A pipelined batch waited in the engine's pipe for the one before: its own compute
        # started when that one was answered.
        started = max(sent, slot.last_answer)
        elapsed = answered - started
        slot.last_answer = answered
        for query in batch:
            if not query.done:
                request = query.request
                request.note_answered(slot.pool.name, started - request.created, elapsed)
        self._forget_batch(slot, batch)
        slot.batches += 1
        slot.note_batch(len(batch), elapsed)
        slot.pool.metrics.inference_time.observe(elapsed)
        slot.pool.metrics.batch_size.observe(len(batch))
        self._complete(batch, vectors)
        self._fill(slot)  # room in the pipeline

    def _abandon_batches(self, slot: InstanceSlot, error: Exception) -> None:
        """Fail the slot's running batches and let go of their answers (closing)."""
        batches, slot.running, slot.in_batch = slot.running, [], 0
        slot.generation += 1
        for task in list(slot.batch_tasks):
            task.cancel()
        for batch in batches:
            self._fail_batch(batch, error)

    @staticmethod
    def _forget_batch(slot: InstanceSlot, batch: list[Query]) -> None:
        slot.running = [running for running in slot.running if running is not batch]
        slot.in_batch -= len(batch)

    def _complete(self, batch: list[Query], vectors: np.ndarray) -> None:
        now = None
        for query, vector in zip(batch, vectors):
            if not query.done:
                self._finish(query)
                request = query.request
                if request.finished is not None:
                    now = self._now() if now is None else now
                    request.finished[query.pool.name] = now
                request.deliver(query.index, vector)
        self._freed()

    # ---- failures --------------------------------------------------------------------

    def _take_down(self, slot: InstanceSlot, error: Exception) -> None:
        """The instance failed: stop its batcher and batches, move their queries, restart it."""
        batches, slot.running, slot.in_batch = slot.running, [], 0
        slot.generation += 1
        for task in list(slot.batch_tasks):
            if task is not asyncio.current_task():
                task.cancel()
        computing = batches[0] if batches else []
        waiting = [query for batch in batches[1:] for query in batch]
        self._on_instance_failure(slot, computing, waiting, error)

    def _on_instance_failure(
        self, slot: InstanceSlot, computing: list[Query], waiting: list[Query], error: Exception
    ) -> None:
        """Move the failed instance's queries to the pool's others. Only the queries of the batch it
        was computing count an attempt: the batches behind it and the queued queries never ran
        there, so the failure says nothing of them."""
        slot.healthy = False
        slot.failures += 1
        log.error("instance %s failed (%s); moving its queries and restarting it", slot.name, error)
        queued = list(slot.queue)
        slot.queue.clear()
        for query in computing:
            if not query.done:
                query.attempts += 1
        for query in computing + waiting + queued:
            if query.done:
                continue
            if query.request.future.done() or query.request.abandoned:  # no one waits for its answer
                self._finish(query)
                continue
            target = slot.pool.least_loaded(exclude=slot)
            if query.attempts >= MAX_ATTEMPTS or (target is None and not self._move_to_another_pool(query)):
                self._fail_query(query, QueryFailed(f"instance {slot.name} failed: {error}"))
                continue
            slot.pool.metrics.failovers.inc()
            if target is not None:
                self._enqueue(target, query)
        self._freed()
        task = asyncio.create_task(self._restart(slot), name=f"restart-{slot.name}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def _move_to_another_pool(self, query: Query) -> bool:
        """Admit `query` again to another eligible pool that serves and has room for it (bulk room for a
        bulk query), when its own pool has no other instance (a one-GPU accelerator pool whose engine
        died): its request was admitted, and the CPU pool answering it late beats a 503. False when
        no pool can take it.

        The moved query keeps its attempts, and its request's latency is not sampled for the pool it
        moved to: that time includes the failure, not the pool's own tail."""
        for pool in self.serving_pools():
            room = pool.bulk_room(self.bulk_share) if query.bulk else pool.room()
            if pool is query.pool or room < 1:
                continue
            if pool.token_budget is not None and not pool.fit_tokens([query.ids]):
                continue
            self._finish(query)
            moved = Query(query.request, query.index, query.ids, pool, bulk=query.bulk)
            moved.attempts, moved.enqueued = query.attempts, self._now()
            query.request.queries.append(moved)
            self._admit(moved)
            self._idle.clear()  # _finish may have set it: the query is in flight still
            pool.metrics.dispatched.inc()
            return True
        return False

    def instance_down(self, instance: Instance, reason: str = "it stopped answering") -> None:
        """Treat `instance` as failed now (e.g. its process missed its heartbeats): stop its batcher,
        move its queries as on an embed error, and restart it. No-op while it is already down."""
        slot = next((s for pool in self.pools for s in pool.instances if s.instance is instance), None)
        if slot is None:
            raise KeyError(f"no instance {getattr(instance, 'name', instance)!r} in this queue manager")
        if not slot.healthy:
            return
        self._take_down(slot, RuntimeError(reason))

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
        self._fill(slot)
        self._freed()  # bulk requests may have waited for any pool to serve again

    def _fail_query(self, query: Query, error: Exception) -> None:
        """Fail the query's request, and drop its other queries still queued (and its bulk queries
        still waiting): computing them would only spend an instance on answers no one reads."""
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

    # ---- depth control ---------------------------------------------------------------

    def record_latency(self, request: Request, seconds: float) -> None:
        """The caller's end-to-end time for an answered interactive request: one live sample per pool
        it used, at that pool's in-flight queries when it was admitted.

        A request split over two pools waited for the slower: each pool is charged the reported time
        less how long the request still waited after that pool's last answer. Bulk requests are not
        samples: their time is their own size and the backlog, not the depth.
        """
        if request.bulk or not request.loads or not request.future.done() or request.future.cancelled():
            return
        if request.future.exception() is not None:
            return
        finished = request.finished
        last = max(finished.values()) if finished else 0.0
        for pool, concurrency in request.loads:
            own = seconds - (last - finished.get(pool.name, last)) if finished else seconds
            pool.control.observe(concurrency, own, request.created, self._now())

    async def _control_loop(self) -> None:
        while True:
            await asyncio.sleep(self.control_interval)
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a control bug must not stop the depths' updates for good
                log.exception("depth control step failed")

    def step(self) -> list[tuple[str, Move]]:
        """One control step: refit every pool; in adaptive mode move the depths. Returns the moves."""
        now = self._now()
        moves = []
        for pool in self.pools:
            control = pool.control
            overdue = pool.overdue(now - control.settings.slo)
            if self.depth_control != "adaptive":
                control.refresh(now)
                continue
            move = control.step(pool.depth, pool.full_since, now, overdue)
            if move is not None:
                self._apply(pool, move)
                moves.append((pool.name, move))
        self._freed()
        return moves

    def _apply(self, pool: Pool, move: Move) -> None:
        log.info("pool %s: depth %d -> %d (%s)", pool.name, pool.depth, move.depth, move.reason)
        pool.depth = move.depth
        if pool.seed_token_budget is not None:
            # The token budget bounds the same latency as the depth: it follows in proportion.
            pool.token_budget = max(1, round(pool.seed_token_budget * move.depth / max(1, pool.seed_depth)))
        pool.full_since = None
        pool.metrics.moved(move.direction, move.cause)

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
        """Apply a new depth live (calibration or probe); admitted queries are unaffected.

        With a token budget, each query is charged `token_charge(length)` tokens against it. The depth
        is also the depth control's new seed: it restarts from it, within [1, depth x depth_cap].
        """
        target = self._pool_named(pool)
        target.depth = target.seed_depth = int(depth)
        target.token_budget = target.seed_token_budget = token_budget
        target.token_charge = token_charge
        target.control.reseed(target.depth, self._now())
        target.metrics.seeded()
        self._freed()

    def healthy(self) -> bool:
        """Every pool has at least one instance able to serve."""
        return all(pool.least_loaded() is not None for pool in self.pools)

    def all_instances_healthy(self) -> bool:
        return all(slot.healthy for pool in self.pools for slot in pool.instances)

    def snapshot(self) -> dict:
        now = self._now()
        return {
            "heterogeneous": self.heterogeneous,
            "draining": self.draining,
            "depth_control": self.depth_control,
            "bulk": {
                "share": self.bulk_share,
                "requests_waiting": len(self._backlog),
                "queries_waiting": self._backlog.waiting,
                "backlog_bound": self._backlog_bound(),
            },
            "pools": [pool.snapshot(now) for pool in self.pools],
        }
