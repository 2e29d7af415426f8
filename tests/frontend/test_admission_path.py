"""The HTTP request path's admission: what two requests meeting one free slot get, and leave behind.

The queue manager, the tokenizer and the pipeline are the real ones; the instance is a test
double whose batch finishes when the test says, so the order of events is the test's.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.requests import Request as HttpRequest

from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy
from tests.collector import cycles_left
from windve.dispatcher.client import LocalDispatcher
from windve.frontend.pipeline import EmbeddingPipeline
from windve.model import ModelSpec
from windve.settings import Settings
from windve.tokenizer import TextTokenizer


class HeldInstance:
    """Embeds (unit vectors) once the test releases the batch."""

    def __init__(self) -> None:
        self.name = "cpu0"
        self.release = asyncio.Event()

    async def start(self) -> None:
        pass

    async def embed(self, sequences):
        await self.release.wait()
        return np.ones((len(sequences), 4), dtype=np.float32)

    async def restart(self) -> None:
        pass

    async def close(self) -> None:
        pass


def _staying_client() -> HttpRequest:
    async def receive() -> dict:
        await asyncio.Event().wait()  # the client never disconnects
        return {}

    return HttpRequest({"type": "http", "method": "POST", "path": "/embed", "headers": []}, receive)


@pytest.fixture(scope="module")
def tokenizer(model_spec: ModelSpec) -> TextTokenizer:
    return TextTokenizer(model_spec)


def _pipeline_over(qm: QueueManager, tokenizer: TextTokenizer, spec: ModelSpec) -> EmbeddingPipeline:
    """The HTTP path's pipeline on a ready runtime made of `qm` and the real tokenizer."""
    dispatcher = LocalDispatcher(SimpleNamespace(ready=True, queue_manager=qm))
    front_end = SimpleNamespace(settings=Settings(), tokenizer=tokenizer, spec=spec, dispatcher=dispatcher)
    return EmbeddingPipeline(front_end)


def _embed(pipeline: EmbeddingPipeline, text: str) -> asyncio.Task:
    """One /embed request of one text, from a client that stays, as a task."""
    return asyncio.create_task(pipeline.embed([text], True, None, _staying_client(), "inputs"))


def _recording_refusals(method, raised: set[int]):
    """`method`, noting the id of each Busy it raises (ids, not references, which would keep them)."""

    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Busy as exc:
            raised.add(id(exc))
            raise

    return call


def test_of_two_requests_for_one_slot_the_second_is_refused_and_leaves_no_cycles(
    tokenizer: TextTokenizer, model_spec: ModelSpec
) -> None:
    outcomes: list[object] = []
    raised: set[int] = set()

    async def scenario() -> None:
        instance = HeldInstance()
        qm = QueueManager([("cpu", 1, [instance])])
        qm.admit = _recording_refusals(qm.admit, raised)
        qm.check_room = _recording_refusals(qm.check_room, raised)
        await qm.start()
        pipeline = _pipeline_over(qm, tokenizer, model_spec)
        # The first is admitted before the second runs its room check, which refuses it.
        first, second = _embed(pipeline, "a text"), _embed(pipeline, "another")
        await asyncio.wait((second,), timeout=30)
        assert second.done() and not first.done()
        instance.release.set()
        vectors = (await first).vectors
        outcomes.append(vectors.shape)
        # The refusal described, not kept: kept, it would keep its objects alive past the collection.
        refusal = second.exception()
        status, retry_after = getattr(refusal, "status", None), getattr(refusal, "retry_after", None)
        outcomes.append((type(refusal).__name__, status, retry_after))
        await qm.close()

    with cycles_left() as found:
        asyncio.run(scenario())
    shape, (refusal, status, retry_after) = outcomes
    assert shape == (1, 4)
    assert (refusal, status) == ("ApiError", 429) and retry_after is not None
    # Refused in the same step as its room check: no task raised Busy and kept it in a cycle.
    # Only this scenario's refusals count: earlier tests may leave theirs for the collector.
    assert len(raised) == 1 and [o for o in found if isinstance(o, Busy) and id(o) in raised] == []


def test_a_cancelled_handler_frees_the_slots_its_queued_queries_held(
    tokenizer: TextTokenizer, model_spec: ModelSpec
) -> None:

    async def scenario() -> None:
        instance = HeldInstance()
        qm = QueueManager([("cpu", 2, [instance])], max_batch_size=1)
        await qm.start()
        pipeline = _pipeline_over(qm, tokenizer, model_spec)
        running, queued = _embed(pipeline, "in the batch"), _embed(pipeline, "behind it")
        for _ in range(100):  # event-loop steps, until both are admitted
            if qm.pools[0].in_flight == 2:
                break
            await asyncio.sleep(0)
        assert qm.pools[0].in_flight == 2
        queued.cancel()  # e.g. the server stopping it: its query leaves the queue, its slot is free
        await asyncio.wait((queued,))
        assert queued.cancelled() and qm.pools[0].in_flight == 1
        instance.release.set()
        vectors = (await running).vectors
        assert vectors.shape == (1, 4) and qm.pools[0].in_flight == 0
        await qm.close()

    asyncio.run(scenario())
