"""Pools with no instance able to serve, failover's attempts, and instances declared down."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy, QueryFailed, Unavailable
from tests.queue_manager.doubles import ControlledInstance, markers_of, queries, settle


class SlowRestartInstance(ControlledInstance):
    """Its restart waits until the test lets it finish."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.back = asyncio.Event()
        self.restarts = 0

    async def restart(self) -> None:
        self.restarts += 1
        await self.back.wait()


def test_unavailable_is_not_a_busy():
    # A handler written for Busy (429) must not catch it and answer "retry soon, here".
    assert not issubclass(Unavailable, Busy) and Unavailable(retry_after=2.0).retry_after == 2.0


@pytest.mark.parametrize("heterogeneous", [True, False])
def test_no_eligible_pool_able_to_serve_is_unavailable(heterogeneous):
    async def scenario():
        acc, cpu = SlowRestartInstance("acc0"), ControlledInstance("cpu0")
        qm = QueueManager([("accelerator", 4, [acc]), ("cpu", 4, [cpu])], heterogeneous=heterogeneous)
        await qm.start()
        first = qm.admit(queries([1]))
        await settle()
        acc.fail()  # its only instance: it restarts (slowly)
        await settle()
        if heterogeneous:  # the CPU pool answers the query, and serves on
            assert not first.future.done() and markers_of(np.array(cpu.batch)) == [1]
            cpu.complete()
            assert markers_of(await first.future) == [1]
            qm.check_room(4)
            request = qm.admit(queries([2]))
            await settle()
            cpu.complete()
            assert markers_of(await request.future) == [2]
        else:  # only the accelerator pool is eligible, and it has no instance: the query fails
            with pytest.raises(QueryFailed):
                await first.future
            with pytest.raises(Unavailable) as refused:
                qm.check_room(1)
            assert refused.value.retry_after > 0
            with pytest.raises(Unavailable):
                qm.admit(queries([2]))
        acc.back.set()
        await settle()
        request = qm.admit(queries([3]))  # back: admitted again
        await settle()
        acc.complete()
        assert markers_of(await request.future) == [3]
        await qm.close()

    asyncio.run(scenario())


def test_a_query_that_never_ran_keeps_its_attempts():
    async def scenario():
        a, b = ControlledInstance("a"), ControlledInstance("b")
        qm = QueueManager([("cpu", 10, [a, b])], max_batch_size=1)
        await qm.start()
        requests = [qm.admit(queries([m])) for m in (1, 2, 3)]
        await settle()  # 1 running on a, 2 on b, 3 queued behind 1 on a
        a.fail()  # 1 and 3 move to b; only 1 was in the failing batch
        await settle()
        for _ in range(2):  # b answers 2, then 1
            b.complete()
            await settle()
        assert [int(seq[0]) for seq in b.batch] == [3]
        b.fail()  # 3's first failing batch: it moves to the restarted a rather than failing
        await settle()
        a.complete()
        assert [markers_of(await request.future) for request in requests] == [[1], [2], [3]]
        await qm.close()

    asyncio.run(scenario())


def test_a_pool_with_no_other_instance_hands_its_queries_to_another_pool_as_far_as_it_has_room():
    async def scenario():
        acc, cpu = SlowRestartInstance("acc0"), ControlledInstance("cpu0")
        qm = QueueManager([("accelerator", 4, [acc]), ("cpu", 2, [cpu])])
        await qm.start()
        requests = [qm.admit(queries([m])) for m in (1, 2, 3)]
        await settle()
        accelerator, cpu_pool = qm.pools
        assert accelerator.in_flight == 3 and markers_of(np.array(acc.batch)) == [1, 2, 3]
        acc.fail()  # the one-GPU pool's engine died: the CPU pool has room for two of its queries
        await settle()
        assert (accelerator.in_flight, cpu_pool.in_flight, qm.in_flight) == (0, 2, 2)
        assert markers_of(np.array(cpu.batch)) == [1, 2]
        with pytest.raises(QueryFailed):
            await requests[2].future
        cpu.complete()
        assert [markers_of(await request.future) for request in requests[:2]] == [[1], [2]]
        assert (cpu_pool.in_flight, qm.in_flight) == (0, 0)
        # Their time includes the failure: it is sampled for the pool they were admitted to only.
        assert [[pool.name for pool, _ in request.loads] for request in requests] == [["accelerator"]] * 3
        acc.back.set()
        await qm.close()

    asyncio.run(scenario())


def test_failover_leaves_behind_queries_whose_client_left():
    async def scenario():
        a, b = ControlledInstance("a"), ControlledInstance("b")
        qm = QueueManager([("cpu", 10, [a, b])], max_batch_size=4)
        await qm.start()
        gone = qm.admit(queries([1]))
        await settle()
        busy, other = a, b
        qm.cancel(gone)  # its query is running: it keeps its slot until the batch ends
        assert qm.in_flight == 1 and busy.pending is not None
        other.forbidden.add(1)
        busy.fail()  # no one waits for them: freed, not moved
        await settle()
        assert qm.in_flight == 0 and other.pending is None and not gone.future.done()
        assert other.calls == 0 and not other.violations
        await qm.close()

    asyncio.run(scenario())


def test_an_instance_declared_down_hands_its_queries_over_and_restarts():
    async def scenario():
        a, b = SlowRestartInstance("a"), ControlledInstance("b")
        qm = QueueManager([("cpu", 10, [a, b])], max_batch_size=1)
        await qm.start()
        requests = [qm.admit(queries([m])) for m in (1, 2, 3)]
        await settle()  # 1 running on a, 2 on b, 3 queued on a
        qm.instance_down(a, "missed its heartbeats")
        await settle()
        assert qm.healthy() and not qm.all_instances_healthy()  # b still serves the pool
        assert a.restarts == 1 and qm.pools[0].instances[0].load == 0
        qm.instance_down(a)  # already down: nothing more happens
        for _ in range(3):
            b.complete()
            await settle()
        assert [markers_of(await request.future) for request in requests] == [[1], [2], [3]]
        a.back.set()
        await settle()
        assert qm.all_instances_healthy()
        with pytest.raises(KeyError):
            qm.instance_down(ControlledInstance("elsewhere"))
        await qm.close()

    asyncio.run(scenario())


def test_the_estimators_pool_path_is_unchanged_by_bulk_and_depth():
    async def scenario():
        inst = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 2, [inst])], max_batch_size=8)
        await qm.start()
        profiled = asyncio.create_task(qm.submit([np.array([m]) for m in range(1, 7)], pool="cpu"))
        await settle()
        assert qm.pools[0].in_flight == 6 and qm.pools[0].bulk_in_flight == 0  # depth not enforced
        inst.complete()
        assert markers_of(await profiled) == list(range(1, 7))
        await qm.close()

    asyncio.run(scenario())


def test_a_pool_counts_as_demand_only_while_it_serves_clients():
    """The autoscaling signal weighs in-flight queries by windve_pool_serving: the warm-up probe's
    queries (occupancy 0.25-0.5 for ~20 s) had read as demand, and each starting pod asked for
    most of another. Serving from when the owner has set the depths until the drain."""
    from prometheus_client import REGISTRY

    def gauges() -> tuple[float | None, float | None, float | None]:
        labels = {"pool": "cpu"}
        return tuple(REGISTRY.get_sample_value(name, labels) for name in (
            "windve_pool_serving", "windve_queue_occupancy", "windve_pool_in_flight"))  # fmt: skip

    async def scenario():
        cpu = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 4, [cpu])])
        await qm.start()
        first = qm.admit(queries([1]))
        await settle()
        assert gauges() == (0.0, 0.0, 1.0)  # the probe's query: in flight, not demand
        qm.serving = True
        assert gauges() == (1.0, 0.25, 1.0)
        drained = asyncio.ensure_future(qm.drain(timeout=30))
        await settle()
        assert gauges() == (0.0, 0.0, 1.0)
        cpu.complete()
        assert markers_of(await first.future) == [1] and await drained
        await qm.close()

    asyncio.run(scenario())
