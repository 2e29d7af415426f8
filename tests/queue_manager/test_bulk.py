"""Bulk requests: more queries than the pools have room for, admitted in parts as room frees."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy
from tests.queue_manager.doubles import ControlledInstance, InstantInstance, markers_of, queries, settle


def bounded_pools(qm: QueueManager, instances: list[InstantInstance]) -> None:
    """Make every instance check, as each batch starts, that no pool holds more than its depth and
    bulk queries no more than their share."""

    def check() -> None:
        for pool in qm.pools:
            assert pool.in_flight <= pool.depth
            assert pool.bulk_in_flight <= max(1, int(pool.depth * qm.bulk_share))

    for instance in instances:
        instance.check = check


async def instant_manager(depths: dict[str, int], **kwargs) -> QueueManager:
    instances = {name: [InstantInstance(f"{name}{i}") for i in range(2)] for name in depths}
    qm = QueueManager([(name, depth, instances[name]) for name, depth in depths.items()], **kwargs)
    bounded_pools(qm, [inst for members in instances.values() for inst in members])
    await qm.start()
    return qm


def test_a_64_input_request_at_depth_8_completes_in_order():
    async def scenario():
        qm = await instant_manager({"cpu": 8}, max_batch_size=4)
        vectors = await qm.submit(queries(range(1, 65)))
        assert markers_of(vectors) == list(range(1, 65))
        assert qm.in_flight == 0 and qm.snapshot()["bulk"]["queries_waiting"] == 0
        await qm.close()

    asyncio.run(scenario())


def test_a_2048_input_request_completes_in_order():
    async def scenario():
        qm = await instant_manager({"accelerator": 16, "cpu": 8}, batch_limits={"accelerator": (1024, 16384)})
        vectors = await qm.submit(queries(range(1, 2049)))
        assert markers_of(vectors) == list(range(1, 2049))
        assert qm.in_flight == 0
        await qm.close()

    asyncio.run(scenario())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    acc_depth=st.integers(1, 12),
    cpu_depth=st.integers(1, 12),
    bulk_share=st.sampled_from([0.25, 0.5, 1.0]),
    max_batch=st.integers(1, 6),
)
def test_concurrent_requests_of_any_size_end_whole_within_depths(sizes, acc_depth, cpu_depth, bulk_share, max_batch):
    async def scenario():
        qm = await instant_manager(
            {"accelerator": acc_depth, "cpu": cpu_depth}, bulk_share=bulk_share, max_batch_size=max_batch
        )
        first = 1
        batches = []
        for size in sizes:
            batches.append(list(range(first, first + size)))
            first += size
        results = await asyncio.gather(*(qm.submit(queries(m)) for m in batches), return_exceptions=True)
        for index, (markers, result) in enumerate(zip(batches, results)):
            if isinstance(result, Busy):
                # Refused whole, and only where the requests before it left no room or a bulk
                # backlog (one of them did not fit): never while everything fits the depths.
                assert sum(sizes[: index + 1]) > acc_depth + cpu_depth
                continue
            assert markers_of(result) == markers
        # All requests arrive in one tick: the first always finds room, bulk or not.
        assert not isinstance(results[0], Exception)
        assert qm.in_flight == 0 and all(pool.bulk_in_flight == 0 for pool in qm.pools)
        await qm.close()

    asyncio.run(scenario())


async def controlled(depth: int, max_batch: int = 2, **kwargs) -> tuple[ControlledInstance, QueueManager]:
    inst = ControlledInstance("cpu0")
    qm = QueueManager([("cpu", depth, [inst])], max_batch_size=max_batch, **kwargs)
    await qm.start()
    return inst, qm


async def finish_all(inst: ControlledInstance, *futures) -> None:
    while not all(future.done() for future in futures):
        await settle()
        if inst.pending is not None:
            inst.complete()


def test_interactive_requests_find_room_beside_a_bulk_request():
    async def scenario():
        inst, qm = await controlled(8)
        pool = qm.pools[0]
        bulk = qm.admit(queries(range(1, 65)))
        await settle()
        assert bulk.bulk and pool.bulk_in_flight == 4 and pool.in_flight == 4  # half the depth
        small = qm.admit(queries([101, 102, 103, 104]))
        assert not small.bulk and pool.in_flight == 8
        with pytest.raises(Busy):
            qm.check_room(1)
        with pytest.raises(Busy):  # no room at all: the queues are full of other work
            qm.admit(queries([105, 106]))
        await finish_all(inst, bulk.future, small.future)
        assert markers_of(bulk.future.result()) == list(range(1, 65))
        assert markers_of(small.future.result()) == [101, 102, 103, 104]
        await qm.close()

    asyncio.run(scenario())


def test_bulk_requests_are_served_in_arrival_order():
    async def scenario():
        inst, qm = await controlled(4)
        first = qm.admit(queries(range(1, 9)))
        second = qm.admit(queries(range(9, 17)))  # 6 + 8 waiting, within 4 x 4
        order = []
        while not (first.future.done() and second.future.done()):
            await settle()
            if inst.pending is not None:
                order.extend(int(seq[0]) for seq in inst.batch)
                inst.complete()
        assert order == list(range(1, 17))  # nothing of the second before all of the first
        await qm.close()

    asyncio.run(scenario())


def test_the_bulk_backlog_is_bounded_but_never_refuses_a_request_for_its_size_alone():
    async def scenario():
        inst, qm = await controlled(2)  # backlog bound: 4 x 2 = 8 waiting queries
        huge = qm.admit(queries(range(1, 101)))  # nothing waits: accepted, one query admitted
        assert huge.bulk and qm.snapshot()["bulk"]["queries_waiting"] == 99
        with pytest.raises(Busy):
            qm.check_room(3)
        with pytest.raises(Busy):
            qm.admit(queries([201, 202, 203]))
        alone = qm.admit(queries([301]))  # an interactive request still fits the free slot
        await finish_all(inst, huge.future, alone.future)
        assert markers_of(huge.future.result()) == list(range(1, 101))
        assert markers_of(alone.future.result()) == [301] and not alone.bulk
        await qm.close()

    asyncio.run(scenario())


def test_cancelling_a_partly_admitted_bulk_request_frees_everything():
    async def scenario():
        inst, qm = await controlled(8)
        bulk = qm.admit(queries(range(1, 65)))
        await settle()  # 4 admitted: a batch of 2 running, 2 queued; 60 waiting
        assert (qm.pools[0].in_flight, inst.pending is not None) == (4, True)
        inst.forbidden.update(range(1, 65))  # no batch may start with them from now on
        qm.cancel(bulk)
        assert qm.pools[0].in_flight == 2 and qm.snapshot()["bulk"]["queries_waiting"] == 0
        drained = asyncio.create_task(qm.drain())
        inst.complete()  # the running batch ends: its slots free too
        await settle()
        assert qm.in_flight == 0 and drained.done() and inst.pending is None and not inst.violations
        await qm.close()

    asyncio.run(scenario())


def test_drain_waits_for_bulk_queries_not_yet_admitted():
    async def scenario():
        inst, qm = await controlled(2, max_batch=1)
        bulk = qm.admit(queries(range(1, 6)))
        drained = asyncio.create_task(qm.drain())
        await finish_all(inst, bulk.future)
        assert markers_of(bulk.future.result()) == [1, 2, 3, 4, 5]
        await settle()
        assert drained.done() and drained.result()
        await qm.close()

    asyncio.run(scenario())


def test_room_promised_to_requests_not_yet_admitted_counts_as_taken():
    async def scenario():
        inst, qm = await controlled(4)
        qm.check_room(1, promised=3)  # one of four slots is not promised
        with pytest.raises(Busy):
            qm.check_room(1, promised=4)
        with pytest.raises(Busy):  # nor does promised room leave any for a bulk request
            qm.check_room(8, promised=4)
        qm.check_room(8, promised=3)  # some room: a larger request is admitted in parts
        await qm.close()

    asyncio.run(scenario())


def test_busy_counts_refused_admissions_not_room_checks():
    """windve_busy_requests_total is what the dispatcher refused: a front end's check before it
    tokenizes is its own refusal (windve_errors_total), and with one front end it had counted in
    both series, with several in one."""
    from prometheus_client import REGISTRY

    def busy() -> float:
        return REGISTRY.get_sample_value("windve_busy_requests_total") or 0.0

    async def scenario():
        inst, qm = await controlled(1)
        held = qm.admit(queries([1]))
        before = busy()
        with pytest.raises(Busy):
            qm.check_room(1)
        assert busy() == before
        with pytest.raises(Busy):
            qm.admit(queries([2]))
        assert busy() == before + 1
        await finish_all(inst, held.future)
        await qm.close()

    asyncio.run(scenario())
