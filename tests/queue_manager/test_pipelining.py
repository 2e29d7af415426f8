"""Instances that take the next batch while the current one computes (`pipeline` > 1)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from queue_manager.manager import QueueManager
from queue_manager.protocol import QueryFailed
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
        with pytest.raises(QueryFailed, match="shutting down"):
            await request.future
        assert qm.in_flight == 0
        engine.complete()  # a late answer after close changes nothing
        await settle()
        assert qm.in_flight == 0

    asyncio.run(scenario())


@PIPELINED
def test_a_batch_waits_in_the_queue_rather_than_in_the_pipe_until_half_a_batch_is_there(kind):
    """Sent ahead while the instance computes, a batch is committed as it is: one of a query or two
    would cost nearly a full batch's time while the queries behind it could have joined it."""

    async def scenario():
        engine = kind("cpu0", pipeline=2)
        engine.ahead_fill = 0.5  # as CPU engine processes say
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=4)
        await qm.start()
        first = qm.admit(queries([1]))
        await settle()
        assert engine.batches() == [[1]]  # an idle instance takes whatever there is, at once
        second = qm.admit(queries([2]))
        await settle()
        assert engine.batches() == [[1]]  # one query is a quarter of a batch: it stays queued
        third = qm.admit(queries([3]))
        await settle()
        assert engine.batches() == [[1], [2, 3]]  # two are half of one: sent ahead
        fourth = qm.admit(queries([4]))
        await settle()
        engine.complete()
        await settle()
        assert engine.batches() == [[2, 3]]  # [2, 3] computes now: [4] alone would be ahead again
        engine.complete()
        await settle()
        assert engine.batches() == [[4]]  # the instance is idle: what waits leaves, however little
        engine.complete()
        answers = [markers_of(await request.future) for request in (first, second, third, fourth)]
        assert answers == [[1], [2], [3], [4]] and qm.in_flight == 0
        await qm.close()

    asyncio.run(scenario())


@PIPELINED
def test_an_instance_that_says_nothing_gets_the_next_batch_at_once_however_small(kind):
    async def scenario():
        engine = kind("cpu0", pipeline=2)  # no ahead_fill: accelerators, and instances of other kinds
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=32)
        await qm.start()
        first = qm.admit(queries([1]))
        await settle()
        second = qm.admit(queries([2]))
        await settle()
        assert engine.batches() == [[1], [2]]
        engine.complete()
        await settle()
        engine.complete()
        assert [markers_of(await first.future), markers_of(await second.future)] == [[1], [2]]
        await qm.close()

    asyncio.run(scenario())


def test_a_long_query_fills_half_a_batch_by_its_tokens():
    async def scenario():
        engine = SubmittingInstance("cpu0", pipeline=2)
        engine.ahead_fill = 0.5
        # 8 queries or 64 tokens a batch: four 16-token queries fill one, so two are half.
        qm = QueueManager([("cpu", 64, [engine])], max_batch_size=8, max_batch_tokens=64)
        await qm.start()
        requests = [qm.admit([np.full(16, 1)])]
        await settle()
        requests.append(qm.admit([np.full(16, 2)]))
        await settle()
        assert engine.batches() == [[1]]
        requests.append(qm.admit([np.full(16, 3)]))
        await settle()
        assert engine.batches() == [[1], [2, 3]]  # by their count alone (8 a batch), two would wait
        engine.complete()
        engine.complete()
        assert [markers_of(await request.future) for request in requests] == [[1], [2], [3]]
        await qm.close()

    asyncio.run(scenario())


def test_a_request_knows_its_queries_time_in_a_queue_and_in_their_batch():
    """TEI's x-queue-time and x-inference-time: a batch sent while the one before it computes
    waits in the engine's pipe, and that wait is queue time, not its own compute."""
    clock = [0.0]

    async def scenario():
        engine = PipelinedInstance("cpu0", pipeline=2)
        qm = QueueManager([("cpu", 16, [engine])], max_batch_size=1, now=lambda: clock[0])
        await qm.start()
        first, second = qm.admit(queries([1])), qm.admit(queries([2, 3]))  # admitted at 0
        await settle()
        assert engine.batches() == [[1], [2]]  # both sent at 0: [2] waits in the pipe
        clock[0] = 1.0
        engine.complete()  # [1] took 1 s; [3] is sent now
        await settle()
        clock[0] = 3.0
        engine.complete()  # [2]: in the pipe 0 -> 1, computed 1 -> 3
        await settle()
        clock[0] = 6.0
        engine.complete()  # [3]: sent at 1, computed 3 -> 6
        await first.future
        await second.future
        assert first.timing() == (0.0, 1.0, "cpu")
        assert second.timing() == ((1.0 + 3.0) / 2, (2.0 + 3.0) / 2, "cpu")
        await qm.close()

    asyncio.run(scenario())
