"""Property-based tests of the queue manager's invariants under random event sequences.

The instances are test doubles whose batches finish or fail when the test says so: the
queue manager under test is real, and the test controls the order of every event.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from queue_manager.manager import QueueManager
from queue_manager.pool import Request, TokenCharge
from queue_manager.protocol import Busy, QueryFailed, Unavailable
from tests.collector import cycles_left
from tests.queue_manager.doubles import ControlledInstance, markers_of, queries, settle


class DispatchMachine(RuleBasedStateMachine):
    markers = itertools.count(1)

    @initialize(
        acc_depth=st.integers(1, 6),
        cpu_depth=st.integers(1, 6),
        acc_instances=st.integers(1, 2),
        cpu_instances=st.integers(1, 2),
        heterogeneous=st.booleans(),
        max_batch=st.integers(1, 4),
    )
    def setup(self, acc_depth, cpu_depth, acc_instances, cpu_instances, heterogeneous, max_batch):
        self.loop = asyncio.new_event_loop()
        self.forbidden: set[int] = set()  # markers of requests whose caller left
        self.acc = [ControlledInstance(f"acc{i}", self.forbidden) for i in range(acc_instances)]
        self.cpu = [ControlledInstance(f"cpu{i}", self.forbidden) for i in range(cpu_instances)]
        self.qm = QueueManager(
            [("accelerator", acc_depth, self.acc), ("cpu", cpu_depth, self.cpu)],
            heterogeneous=heterogeneous,
            max_batch_size=max_batch,
        )
        self.loop.run_until_complete(self.qm.start())
        self.admitted: list[Request] = []
        admit = self.qm.admit

        def recorded(*args, **kwargs) -> Request:
            self.admitted.append(admit(*args, **kwargs))
            return self.admitted[-1]

        self.qm.admit = recorded
        admit_one = self.qm._admit

        def within_depth(query) -> None:
            # Every admission finds room: the depth bounds what is taken, whatever was in flight.
            pool = query.pool
            assert pool.in_flight < pool.depth, f"{pool.name}: admitted at {pool.in_flight}, depth {pool.depth}"
            admit_one(query)

        self.qm._admit = within_depth
        # (task or request, markers, abandoned): submit() runs in a task; admit() is the dispatcher's way.
        self.requests: list[list] = []

    def settle(self) -> None:
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))

    def in_loop(self, function, *args):
        """`function(*args)` called on the running loop, as the dispatcher calls admit and cancel;
        its result, or the Busy or Unavailable it raised."""

        async def call():
            try:
                return function(*args)
            except (Busy, Unavailable) as refusal:
                return refusal

        return self.loop.run_until_complete(call())

    def pools(self):
        return {pool.name: pool for pool in self.qm.pools}

    def eligible(self):
        return self.qm.pools if self.qm.heterogeneous else self.qm.pools[:1]

    @rule(size=st.integers(1, 12), via_admit=st.booleans())
    def submit(self, size, via_admit):
        pools = self.pools()
        acc, cpu = pools["accelerator"], pools["cpu"]
        acc_room, cpu_room = max(0, acc.depth - acc.in_flight), max(0, cpu.depth - cpu.in_flight)
        acc_before, cpu_before = acc.in_flight, cpu.in_flight
        acc_up = any(slot.healthy for slot in acc.instances)
        cpu_up = self.qm.heterogeneous and any(slot.healthy for slot in cpu.instances)
        capacity = (acc_room if acc_up else 0) + (cpu_room if cpu_up else 0)
        waiting = self.qm.snapshot()["bulk"]["queries_waiting"]
        bound = 4 * sum(pool.depth for pool in self.eligible())
        if not (acc_up or cpu_up):
            expected = Unavailable
        elif size <= capacity:
            expected = "interactive"
        elif capacity and (waiting == 0 or waiting + size <= bound):
            expected = "bulk"
        else:
            expected = Busy
        event(f"admission: {expected if isinstance(expected, str) else expected.__name__}")
        # The early check the HTTP path makes before tokenizing refuses exactly what admission
        # would (this machine sets no token budget, the one thing it cannot see).
        try:
            self.qm.check_room(size)
            early = None
        except (Busy, Unavailable) as refusal:
            early = type(refusal)
        assert early == (expected if expected in (Busy, Unavailable) else None)
        markers = [next(self.markers) for _ in range(size)]
        if via_admit:
            handle = self.in_loop(self.qm.admit, queries(markers))
        else:
            handle = self.loop.create_task(self.qm.submit(queries(markers)))
        self.settle()
        if expected in (Busy, Unavailable):
            # Refused, and nothing of the request stays behind.
            refusal = handle if via_admit else handle.exception()
            assert type(refusal) is expected
            assert (acc.in_flight, cpu.in_flight) == (acc_before, cpu_before)
            assert self.qm.snapshot()["bulk"]["queries_waiting"] == waiting
            return
        assert not isinstance(handle, Exception)
        if expected == "interactive":
            assert not self.admitted[-1].bulk
            to_acc = min(size, acc_room) if acc_up else 0
            # The accelerator pool takes all it has room for; the CPU pool only the rest.
            assert acc.in_flight - acc_before == to_acc
            assert cpu.in_flight - cpu_before == size - to_acc
        else:
            assert self.admitted[-1].bulk and self.admitted[-1].n == size
        if not self.qm.heterogeneous:
            assert cpu.in_flight == 0
        self.requests.append([handle, markers, False])

    def busy_instances(self):
        return [inst for inst in self.acc + self.cpu if inst.pending is not None]

    @precondition(lambda self: self.busy_instances())
    @rule(data=st.data())
    def complete_batch(self, data):
        data.draw(st.sampled_from(self.busy_instances())).complete()
        self.settle()

    @precondition(lambda self: self.busy_instances())
    @rule(data=st.data())
    def fail_batch(self, data):
        data.draw(st.sampled_from(self.busy_instances())).fail()
        self.settle()

    def open_requests(self):
        return [entry for entry in self.requests if not entry[2] and not done(entry[0])]

    @precondition(lambda self: self.open_requests())
    @rule(data=st.data())
    def cancel_request(self, data):
        entry = data.draw(st.sampled_from(self.open_requests()))
        handle, markers = entry[0], entry[1]
        entry[2] = True
        self.forbidden.update(markers)  # no batch may start with them from now on
        if isinstance(handle, asyncio.Task):
            handle.cancel()
        else:
            self.in_loop(self.qm.cancel, handle)
        self.settle()

    @rule(data=st.data(), depth=st.integers(1, 6))
    def set_depth(self, data, depth):
        # A calibration (or the depth control) moves a depth while queries are in flight.
        pool = data.draw(st.sampled_from(self.qm.pools))
        self.in_loop(self.qm.set_depth, pool.name, depth)
        self.settle()

    @rule(data=st.data())
    def declare_an_instance_down(self, data):
        self.in_loop(self.qm.instance_down, data.draw(st.sampled_from(self.acc + self.cpu)))
        self.settle()

    @invariant()
    def depths_hold(self):
        # Over its depth only after the depth fell under what was in flight, and then only draining.
        seen = getattr(self, "seen", {})
        for pool in self.qm.pools:
            before_in_flight, before_bulk = seen.get(pool.name, (0, 0))
            assert 0 <= pool.in_flight <= max(pool.depth, before_in_flight)
            bulk_limit = max(1, pool.depth // 2)  # bulk_share 0.5
            assert 0 <= pool.bulk_in_flight <= max(bulk_limit, before_bulk)
            seen[pool.name] = (pool.in_flight, pool.bulk_in_flight)
        self.seen = seen

    @invariant()
    def every_slot_taken_is_a_query_in_a_queue_or_batch(self):
        for pool in self.qm.pools:
            held = sum(len(slot.queue) + slot.in_batch for slot in pool.instances)
            assert pool.in_flight == held

    @invariant()
    def waiting_bulk_takes_every_slot_it_may(self):
        backlog = self.qm._backlog
        if backlog:
            for pool in self.eligible():
                if pool.least_loaded() is not None:
                    assert pool.bulk_room(self.qm.bulk_share) == 0
            # FIFO: only the oldest bulk request has queries admitted while others wait.
            assert all(request.admitted == 0 for request in list(backlog.requests)[1:])

    @invariant()
    def no_batch_starts_with_a_query_whose_caller_left(self):
        assert not [inst.violations for inst in self.acc + self.cpu if inst.violations]

    @invariant()
    def each_query_is_answered_at_most_once(self):
        answered = sum((inst.completed for inst in self.acc + self.cpu), Counter())
        assert all(count == 1 for count in answered.values())

    @invariant()
    def answers_are_right_and_whole(self):
        for handle, markers, _ in self.requests:
            if done(handle) and outcome(handle) is None:
                assert markers_of(result(handle)) == markers

    def teardown(self):
        # Finish every batch until nothing is pending: every admitted request must end, the bulk
        # ones included (bulk never starves).
        for _ in range(500):
            busy = self.busy_instances()
            if not busy:
                break
            for inst in busy:
                inst.complete()
            self.settle()
        assert not self.qm._backlog, "bulk requests still wait with every instance idle"
        answered = sum((inst.completed for inst in self.acc + self.cpu), Counter())
        for handle, markers, abandoned in self.requests:
            if abandoned and not done(handle):
                continue  # qm.cancel() leaves the future to its caller, who has gone
            assert done(handle), "an admitted request never ended"
            error = outcome(handle)
            if abandoned and isinstance(error, asyncio.CancelledError):
                continue
            assert error is None or isinstance(error, QueryFailed), error
            if error is None:
                assert markers_of(result(handle)) == markers
                assert all(answered[m] == 1 for m in markers)
        for pool in self.qm.pools:
            assert pool.in_flight == 0 and pool.tokens_in_flight == 0 and pool.bulk_in_flight == 0
        self.loop.run_until_complete(self.qm.close())
        self.loop.close()


def _future(handle) -> asyncio.Future:
    return handle if isinstance(handle, asyncio.Task) else handle.future


def done(handle) -> bool:
    return _future(handle).done()


def outcome(handle) -> BaseException | None:
    future = _future(handle)
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()


def result(handle):
    return _future(handle).result()


DispatchMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_dispatch_invariants = DispatchMachine.TestCase


async def started_budget_pool(
    token_budget: int, charge: TokenCharge = TokenCharge()
) -> tuple[ControlledInstance, QueueManager]:
    """One controlled CPU instance in a started queue manager, its pool limited by `token_budget`."""
    inst = ControlledInstance("cpu0")
    qm = QueueManager([("cpu", 100, [inst])], max_batch_size=8)
    await qm.start()
    qm.set_depth("cpu", 100, token_budget=token_budget, token_charge=charge)
    return inst, qm


def test_token_budget_bounds_tokens_in_flight():
    async def scenario():
        inst, qm = await started_budget_pool(10)
        first = asyncio.create_task(qm.submit([np.arange(6), np.arange(4)]))
        await settle()
        with pytest.raises(Busy):
            await qm.submit([np.arange(2)])
        assert qm.pools[0].tokens_in_flight == 10
        inst.complete()
        await first
        assert qm.pools[0].tokens_in_flight == 0
        await qm.close()

    asyncio.run(scenario())


def test_token_budget_charges_overhead_and_attention_per_query():
    charge = TokenCharge(per_query=2, per_squared_token=0.05)
    assert (charge(20), charge(4)) == (20 + 2 + 20, 4 + 2 + 1)  # ceil(0.05 * 16) = 1

    async def scenario():
        inst, qm = await started_budget_pool(100, charge)
        first = asyncio.create_task(qm.submit([np.arange(20), np.arange(20)]))  # 84 of 100
        await settle()
        with pytest.raises(Busy):
            await qm.submit([np.arange(20)])  # 42 more would pass the budget
        short = asyncio.create_task(qm.submit([np.arange(4)]))  # 7 more still fits
        await settle()
        assert qm.pools[0].tokens_in_flight == 91
        for _ in range(3):  # at most one batch per query
            if inst.pending is not None:
                inst.complete()
            await settle()
        assert first.done() and short.done()
        assert qm.pools[0].tokens_in_flight == 0
        # Idle, the pool takes one query even when its charge alone passes the budget.
        alone = asyncio.create_task(qm.submit([np.arange(60)]))  # 60 + 2 + 180 = 242
        await settle()
        assert qm.pools[0].tokens_in_flight == 242
        with pytest.raises(Busy):
            await qm.submit([np.arange(1)])
        inst.complete()
        await alone
        await qm.close()

    asyncio.run(scenario())


def test_token_budget_shrinks_by_the_padding_of_recent_batches():
    async def scenario():
        inst, qm = await started_budget_pool(1000)
        pool = qm.pools[0]
        assert pool.padding == 1.0
        first = asyncio.create_task(qm.submit([np.arange(10), np.arange(14)]))  # one batch, padded to 14
        await settle()
        assert inst.pending is not None and pool.padding == pytest.approx(28 / 24)
        # 1000 / (28/24) = 857 tokens: 24 in flight + 833 fit, one more token does not
        # (it would without the padding: 24 + 833 + 1 <= 1000).
        second = asyncio.create_task(qm.submit([np.arange(833)]))
        await settle()
        with pytest.raises(Busy):
            await qm.submit([np.arange(1)])
        assert qm.snapshot()["pools"][0]["padding"] == pytest.approx(28 / 24, abs=1e-4)
        for _ in range(2):
            inst.complete()
            await settle()
        await asyncio.gather(first, second)
        await qm.close()

    asyncio.run(scenario())


def test_batches_respect_size_and_padded_tokens():
    async def scenario():
        inst = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 100, [inst])], max_batch_size=3, max_batch_tokens=64)
        await qm.start()
        lengths = [10, 10, 10, 10, 40, 40]
        tasks = [asyncio.create_task(qm.submit([np.full(n, i + 1)])) for i, n in enumerate(lengths)]
        sizes = []
        for _ in range(10):
            await settle()
            if inst.pending is None:
                if all(task.done() for task in tasks):
                    break
                continue
            batch = inst.batch
            sizes.append(len(batch))
            assert len(batch) <= 3 and len(batch) * max(len(seq) for seq in batch) <= 64
            inst.complete()
        await asyncio.gather(*tasks)
        # FIFO up to 3 queries; a 40-token query cannot join a 10-token one (2 x 40 > 64 padded).
        assert sizes == [3, 1, 1, 1]
        await qm.close()

    asyncio.run(scenario())


def test_batches_group_similar_lengths_oldest_first():
    async def scenario():
        inst = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 100, [inst])], max_batch_size=8, max_batch_tokens=4096)
        await qm.start()
        lengths = [16, 256, 20, 240, 16, 200, 18]
        tasks = [asyncio.create_task(qm.submit([np.full(n, i + 1)])) for i, n in enumerate(lengths)]
        batches = []
        while not all(task.done() for task in tasks):
            await settle()
            if inst.pending is not None:
                batches.append([int(seq[0]) - 1 for seq in inst.batch])
                inst.complete()
        await asyncio.gather(*tasks)
        # The oldest query leads each batch; companions within 1.5x of its length join it.
        assert batches == [[0, 2, 4, 6], [1, 3, 5]]
        await qm.close()

    asyncio.run(scenario())


def test_drain_waits_for_admitted_and_refuses_new():
    async def scenario():
        inst = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 10, [inst])])
        await qm.start()
        admitted = asyncio.create_task(qm.submit([np.array([7])]))
        await settle()
        drain = asyncio.create_task(qm.drain(timeout=5))
        await settle()
        with pytest.raises(Busy, match="shutting down"):
            await qm.submit([np.array([8])])
        assert not drain.done()
        inst.complete()
        assert (await admitted)[0, 0] == 7
        assert await drain
        await qm.close()

    asyncio.run(scenario())


def test_failover_moves_queries_to_a_healthy_instance():
    async def scenario():
        a, b = ControlledInstance("a"), ControlledInstance("b")
        qm = QueueManager([("cpu", 10, [a, b])], max_batch_size=8)
        await qm.start()
        first = asyncio.create_task(qm.submit([np.array([1])]))
        await settle()
        busy = a if a.pending else b
        other = b if busy is a else a
        busy.fail()
        await settle()
        assert other.pending is not None and other.batch[0][0] == 1
        other.complete()
        assert (await first)[0, 0] == 1
        await qm.close()

    asyncio.run(scenario())


def record_requests(qm: QueueManager, created: list[int]) -> None:
    """Note the id of every request `qm` admits (ids, not references: a reference would keep it alive).
    A list: a request freed at once, as these tests want, may leave its id to the next one."""
    admit = qm.admit

    def recorded(*args, **kwargs) -> Request:
        request = admit(*args, **kwargs)
        created.append(id(request))
        return request

    qm.admit = recorded


def test_answered_and_cancelled_requests_are_freed_without_the_garbage_collector():
    created: list[int] = []

    async def scenario():
        inst = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 10, [inst])], max_batch_size=8)
        record_requests(qm, created)
        await qm.start()
        answered = asyncio.create_task(qm.submit([np.array([1]), np.array([2])]))
        await settle()
        waiting = asyncio.create_task(qm.submit([np.array([3])]))  # queued behind the running batch
        await settle()
        waiting.cancel()
        await settle()
        inst.complete()
        await answered
        last = asyncio.create_task(qm.submit([np.array([4])]))  # the batcher lets go of the batch before
        await settle()
        inst.complete()
        await last
        await qm.close()

    with cycles_left() as found:
        asyncio.run(scenario())
    # Only this scenario's requests: earlier tests may leave theirs for the collector.
    assert len(created) == 3 and [o.n for o in found if isinstance(o, Request) and id(o) in created] == []


def test_a_failed_request_drops_its_queued_queries_and_is_freed_without_the_garbage_collector():
    created: list[int] = []
    outcome: dict[str, object] = {}

    async def scenario():
        a, b = ControlledInstance("a"), ControlledInstance("b")
        qm = QueueManager([("cpu", 10, [a, b])], max_batch_size=1)
        record_requests(qm, created)
        await qm.start()
        request = asyncio.create_task(qm.submit([np.array([1]), np.array([2]), np.array([3])]))
        await settle()  # 1 running on a, 2 on b, 3 queued behind 1 on a
        a.fail()  # 1 (one attempt) and 3 (none: it never ran) move to b; a restarts
        await settle()
        b.complete()  # 2 answered; b runs 1
        await settle()
        b.fail()  # 1 meets its second failing instance: the request fails
        await settle()
        with pytest.raises(QueryFailed):
            await request
        # Query 3, queued on b, was dropped, not moved to the restarted a and computed for no one.
        outcome.update(calls=(a.calls, b.calls), in_flight=qm.in_flight, pending=(a.pending, b.pending))
        await qm.close()

    with cycles_left() as found:
        asyncio.run(scenario())
    assert outcome == {"calls": (1, 2), "in_flight": 0, "pending": (None, None)}
    assert len(created) == 1 and [o.n for o in found if isinstance(o, Request) and id(o) in created] == []
