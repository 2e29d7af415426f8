"""Instances that take the next batch while the current one computes (`pipeline` > 1)."""

from __future__ import annotations

import asyncio

import pytest

from queue_manager.manager import QueueManager
from tests.queue_manager.doubles import (
    ControlledInstance,
    PipelinedInstance,
    SubmittingInstance,
    markers_of,
    queries,
    settle,
)

PIPELINED = pytest.mark.parametrize("kind", [PipelinedInstance, SubmittingInstance], ids=["embed", "submit"])


@PIPELINED
def test_the_next_batch_is_handed_over_while_the_current_one_computes(kind):
    async def scenario():
        engine = kind("cpu0", pipeline=2)
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=2)
        await qm.start()
        requests = [qm.admit(queries([marker])) for marker in range(1, 8)]
        await settle()
        # Two batches at once, never a third: the rest waits in the dispatcher's queue.
        assert engine.batches() == [[1, 2], [3, 4]]
        engine.complete()
        await settle()
        assert engine.batches() == [[3, 4], [5, 6]]  # the freed place is taken at once
        for _ in range(3):
            engine.complete()
            await settle()
        assert [markers_of(await request.future) for request in requests] == [[m] for m in range(1, 8)]
        assert engine.most_at_once == 2 and qm.in_flight == 0
        await qm.close()

    asyncio.run(scenario())


def test_an_instance_without_pipeline_gets_one_batch_at_a_time():
    async def scenario():
        engine = ControlledInstance("cpu0")
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=2)
        await qm.start()
        requests = [qm.admit(queries([marker])) for marker in range(1, 5)]
        await settle()
        assert engine.calls == 1
        engine.complete()
        await settle()
        assert engine.calls == 2
        engine.complete()
        assert [markers_of(await request.future) for request in requests] == [[1], [2], [3], [4]]
        await qm.close()

    asyncio.run(scenario())


@PIPELINED
def test_a_failure_moves_every_batch_in_flight_and_counts_an_attempt_only_for_the_computing_one(kind):
    async def scenario():
        failing, other = kind("cpu0"), kind("cpu1")
        qm = QueueManager([("cpu", 16, [failing, other])], max_batch_size=1)
        await qm.start()
        request = qm.admit(queries([1, 2, 3, 4]))  # to the least loaded instance in turn
        held = {int(query.ids[0]): query for query in request.queries}
        await settle()
        assert failing.batches() == [[1], [3]] and other.batches() == [[2], [4]]
        failing.fail()  # while computing [1], with [3] waiting in its pipe
        await settle()
        assert held[1].attempts == 1 and held[3].attempts == 0  # [3] never ran there
        assert other.batches() == [[2], [4]]  # the moved ones queue behind the two it holds
        for _ in range(4):
            other.complete()
            await settle()
        assert markers_of(await request.future) == [1, 2, 3, 4]
        assert failing.completed.total() == 0 and qm.in_flight == 0
        await qm.close()

    asyncio.run(scenario())


def test_with_submit_the_next_batch_leaves_in_the_loop_step_that_learns_of_the_answer():
    """Where the event loop is busy, every step between an engine's answer and its next batch is
    time the engine idles: the queue manager must not put a task (or two) in between."""

    async def scenario():
        engine = SubmittingInstance("cpu0", pipeline=1)
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=2)
        await qm.start()
        first = qm.admit(queries([1, 2]))
        await asyncio.sleep(0)  # one step: the admitted queries leave as one batch
        assert engine.batches() == [[1, 2]]
        second = qm.admit(queries([3, 4]))
        await asyncio.sleep(0)
        assert engine.batches() == [[1, 2]]  # the pipeline is full: [3, 4] waits in the queue
        engine.complete()  # answered on another thread
        await asyncio.sleep(0)  # the one step in which the loop learns of it
        assert engine.batches() == [[3, 4]]
        assert first.future.done()
        engine.complete()
        assert markers_of(await second.future) == [3, 4]
        await qm.close()

    asyncio.run(scenario())


def test_closing_fails_the_batches_a_submitting_instance_still_holds():
    async def scenario():
        engine = SubmittingInstance("cpu0", pipeline=2)
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=1)
        await qm.start()
        request = qm.admit(queries([1, 2, 3]))
        await settle()
        assert engine.batches() == [[1], [2]]
        await qm.close()
        with pytest.raises(Exception, match="shutting down"):
            await request.future
        assert qm.in_flight == 0
        engine.complete()  # a late answer after close changes nothing
        await settle()
        assert qm.in_flight == 0

    asyncio.run(scenario())
