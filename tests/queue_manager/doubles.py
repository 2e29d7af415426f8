"""Test doubles for the queue manager's instances: batches finish or fail when the test says so."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter

import numpy as np

from queue_manager.protocol import InstanceFailed

DIM = 4


class ControlledInstance:
    """Each embed call waits until the test completes or fails it.

    Every query's first token id is its marker, and comes back in column 0 of its row. `completed`
    counts, per marker, the batches that returned it; `forbidden` markers must never start a batch:
    one that does is kept in `violations` (the manager reads the raised error as the instance's
    failure and goes on, so the test must look there).
    """

    def __init__(self, name: str, forbidden: set[int] | None = None) -> None:
        self.name = name
        self.pending: asyncio.Future | None = None
        self.batch: list[np.ndarray] = []
        self.calls = 0
        self.completed: Counter[int] = Counter()
        self.forbidden = forbidden if forbidden is not None else set()
        self.violations: list[int] = []

    async def start(self) -> None:
        pass

    async def embed(self, sequences):
        self.calls += 1
        self.batch = list(sequences)
        started = {int(seq[0]) for seq in self.batch} & self.forbidden
        self.violations.extend(sorted(started))
        assert not started, f"{self.name} was given queries no one waits for: {sorted(started)}"
        self.pending = asyncio.get_running_loop().create_future()
        try:
            return await self.pending
        finally:
            self.pending = None

    def complete(self) -> None:
        vectors = np.zeros((len(self.batch), DIM), dtype=np.float32)
        vectors[:, 0] = [seq[0] for seq in self.batch]  # the query's marker comes back in its row
        self.completed.update(int(seq[0]) for seq in self.batch)
        self.pending.set_result(vectors)

    def fail(self) -> None:
        self.pending.set_exception(InstanceFailed(f"{self.name} died"))

    async def restart(self) -> None:
        pass

    async def close(self) -> None:
        pass


class InstantInstance:
    """Answers every batch on the next loop tick, and checks its pool's depth as each batch starts."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[int] = []  # sizes
        self.check = lambda: None

    async def start(self) -> None:
        pass

    async def embed(self, sequences):
        self.check()
        self.batches.append(len(sequences))
        await asyncio.sleep(0)
        vectors = np.zeros((len(sequences), DIM), dtype=np.float32)
        vectors[:, 0] = [seq[0] for seq in sequences]
        return vectors

    async def restart(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def settle() -> None:
    """Let every ready task run until nothing more can happen without the test's next event."""
    for _ in range(20):
        await asyncio.sleep(0)


def markers_of(vectors: np.ndarray) -> list[int]:
    return [int(v) for v in vectors[:, 0]]


def queries(markers) -> list[np.ndarray]:
    return [np.array([m]) for m in markers]


class PipelinedInstance(ControlledInstance):
    """Takes up to `pipeline` batches at once, answered oldest first as the test says."""

    def __init__(self, name: str, pipeline: int = 2) -> None:
        super().__init__(name)
        self.pipeline = pipeline
        self.waiting: list[tuple[list[np.ndarray], asyncio.Future]] = []  # oldest first
        self.most_at_once = 0

    async def embed(self, sequences):
        self.calls += 1
        pending = asyncio.get_running_loop().create_future()
        self.waiting.append((list(sequences), pending))
        self.most_at_once = max(self.most_at_once, len(self.waiting))
        try:
            return await pending
        finally:
            self.waiting = [(batch, future) for batch, future in self.waiting if future is not pending]

    def batches(self) -> list[list[int]]:
        return [[int(seq[0]) for seq in batch] for batch, _ in self.waiting]

    def complete(self) -> None:
        batch, pending = self.waiting[0]
        vectors = np.zeros((len(batch), DIM), dtype=np.float32)
        vectors[:, 0] = [seq[0] for seq in batch]
        self.completed.update(int(seq[0]) for seq in batch)
        pending.set_result(vectors)

    def fail(self) -> None:
        self.waiting[0][1].set_exception(InstanceFailed(f"{self.name} died"))


class SubmittingInstance(PipelinedInstance):
    """A pipelined instance that starts batches with `submit`, as engine processes do: each batch is
    a concurrent future, settled from another thread (the engine's receiver thread) when the test
    completes or fails it."""

    async def embed(self, sequences):
        raise AssertionError("the queue manager must use submit when an instance offers it")

    def submit(self, sequences) -> concurrent.futures.Future:
        self.calls += 1
        pending: concurrent.futures.Future = concurrent.futures.Future()
        self.waiting.append((list(sequences), pending))
        self.most_at_once = max(self.most_at_once, len(self.waiting))
        return pending

    def _settle_oldest(self, settle_it) -> None:
        batch, pending = self.waiting.pop(0)
        thread = threading.Thread(target=settle_it, args=(batch, pending))
        thread.start()
        thread.join()  # its answer is on its way to the loop (call_soon_threadsafe) when this returns

    def complete(self) -> None:
        def answer(batch, pending):
            vectors = np.zeros((len(batch), DIM), dtype=np.float32)
            vectors[:, 0] = [seq[0] for seq in batch]
            self.completed.update(int(seq[0]) for seq in batch)
            pending.set_result(vectors)

        self._settle_oldest(answer)

    def fail(self) -> None:
        self._settle_oldest(lambda batch, pending: pending.set_exception(InstanceFailed(f"{self.name} died")))
