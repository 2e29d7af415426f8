"""A simulated pool with a known service time, and a virtual clock to run it on.

One server takes up to `max_batch_size` queued queries at once and is busy for
`per_batch + per_query*n + per_token*tokens + per_squared_token*sum(L^2)` seconds (tokens summed, or
padded to the longest query when `padded`; the last term is attention). It is a real asyncio object
serving real concurrent requests; only the model is replaced by a known cost, so the algorithms'
answers can be compared with the analytic optimum (`expected_latencies`, `optimum_depth`).

`run_virtual` runs a coroutine on an event loop whose clock jumps to the next timer whenever nothing
is ready to run, instead of waiting for it: a simulated pool then answers in virtual seconds, exactly
as its service time says, however fast or loaded the machine is (and a profile of a pool that takes
minutes ends at once).
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from estimator.rounds import tail

T = TypeVar("T")


@dataclass(frozen=True)
class ServiceTime:
    per_batch: float
    per_query: float
    per_token: float = 0.0
    max_batch_size: int = 32
    padded: bool = False
    per_squared_token: float = 0.0

    def batch_seconds(self, lengths: Sequence[int]) -> float:
        sized = [max(lengths)] * len(lengths) if self.padded else lengths
        attention = self.per_squared_token * sum(length * length for length in sized)
        return self.per_batch + self.per_query * len(lengths) + self.per_token * sum(sized) + attention

    def expected_latencies(self, lengths: Sequence[int]) -> list[float]:
        """Latency of each query of one closed-loop round (all queued at time 0, FIFO)."""
        latencies: list[float] = []
        clock = 0.0
        for first in range(0, len(lengths), self.max_batch_size):
            batch = lengths[first : first + self.max_batch_size]
            clock += self.batch_seconds(batch)
            latencies.extend([clock] * len(batch))
        return latencies

    def expected_p99(self, concurrency: int, length: int) -> float:
        return tail(self.expected_latencies([length] * concurrency))[0]

    def optimum_depth(self, slo: float, length: int, limit: int = 100_000) -> int:
        """The largest C whose closed-loop p99 meets the SLO (p99 never falls as C grows)."""
        depth = 0
        while depth < limit and self.expected_p99(depth + 1, length) <= slo:
            depth += 1
        return depth


class SimulatedPool:
    """Serve `submit(sequences)` with the service time above, one batch at a time."""

    def __init__(self, service: ServiceTime) -> None:
        self.service = service
        self._queue: deque[tuple[int, float, asyncio.Future[None]]] = deque()
        self._wakeup: asyncio.Event | None = None
        self._server: asyncio.Task[None] | None = None

    async def submit(self, sequences: Sequence[np.ndarray]) -> None:
        loop = asyncio.get_running_loop()
        if self._server is None or self._server.done():
            self._wakeup = asyncio.Event()
            self._server = loop.create_task(self._serve())
        futures = []
        for sequence in sequences:
            future: asyncio.Future[None] = loop.create_future()
            self._queue.append((len(sequence), loop.time(), future))
            futures.append(future)
        assert self._wakeup is not None
        self._wakeup.set()
        await asyncio.gather(*futures)

    async def _serve(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        free_at = loop.time()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            count = min(self.service.max_batch_size, len(self._queue))
            batch = [self._queue.popleft() for _ in range(count)]
            # Busy time runs on an absolute clock from when the server was free (or the batch's last
            # query arrived), so that on a real clock a late wake-up of this task does not add up
            # over the batches of a round.
            start = max(free_at, max(arrived for _, arrived, _ in batch))
            free_at = start + self.service.batch_seconds([length for length, _, _ in batch])
            await asyncio.sleep(max(0.0, free_at - loop.time()))
            for _, _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            try:
                await self._server
            except asyncio.CancelledError:
                pass
            self._server = None
        while self._queue:
            self._queue.popleft()[2].cancel()


def constant_query(tokens: int) -> np.ndarray:
    """A query of `tokens` token ids for pools that only look at the length."""
    return np.ones(max(1, math.floor(tokens)), dtype=np.int64)


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real I/O without waiting; when there is none, moves the clock on by the loop's timeout
    (the time to its next timer) instead of sleeping it. Waits for real only when no timer is due."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            return super().select(None)
        self.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual: see `run_virtual`."""

    def __init__(self) -> None:
        self._virtual = _VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a fresh `VirtualClockLoop` (like `asyncio.run`, on virtual time)."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
