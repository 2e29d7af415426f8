"""A simulated pool with a known service time, for testing and benchmarking the estimator.

One server takes up to `max_batch_size` queued queries at once and is busy for
`per_batch + per_query*n + per_token*tokens + per_squared_token*sum(L^2)` seconds (tokens
summed, or padded to the longest query when `padded`; the last term is attention). It is a real
asyncio object serving real concurrent requests; only the model is replaced by a known cost, so
the algorithms' answers can be compared with the analytic optimum (`expected_latencies`,
`optimum_depth`).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from estimator.rounds import tail


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

    def expected_p95(self, concurrency: int, length: int) -> float:
        return tail(self.expected_latencies([length] * concurrency))[0]

    def optimum_depth(self, slo: float, length: int, limit: int = 100_000) -> int:
        """The largest C whose closed-loop p95 meets the SLO (p95 never falls as C grows)."""
        depth = 0
        while depth < limit and self.expected_p95(depth + 1, length) <= slo:
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
            # Busy time is scheduled on an absolute clock from the moment the server was
            # free (or the batch's last query arrived), so a late wake-up of this task does
            # not add up over the batches of a round.
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
