"""Virtual time for the queue manager: a pool whose speed changes, run exactly and deterministically.

`VirtualTimeLoop` is an asyncio event loop whose clock jumps to the next timer instead of waiting
for it, so the real QueueManager (admission, batchers, the depth control's task) runs unchanged in
simulated seconds, as fast as the CPU allows, and the same scenario gives the same run to the bit.
`run_scenario` drives one pool with open-loop one-query requests (Poisson arrivals from a seeded
generator) while its service time grows by `slowdown` between `slow_at` and `recover_at`; the tests
and bench/depth_control.py read its record.
"""

from __future__ import annotations

import asyncio
import math
import random
import selectors
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from queue_manager.depth_control import p99
from queue_manager.manager import QueueManager
from queue_manager.protocol import Busy


class _JumpingSelector:
    """A real selector (the loop's self-pipe needs one) that never blocks: where the loop would
    wait `timeout` seconds for I/O, nothing can arrive in a simulation, so the clock jumps instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._selector = selectors.DefaultSelector()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        ready = self._selector.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("virtual time: every task waits and no timer is set, so nothing can happen")
        self._loop.advance(timeout)
        return []

    def __getattr__(self, name: str):
        return getattr(self._selector, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a simulated clock that starts at 0 and moves only from timer to timer."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


@dataclass(frozen=True)
class Scenario:
    """One pool, one instance batching up to `max_batch_size` queries in per_batch + per_query*n seconds
    (times `slowdown` while slow), and more one-query requests than it can serve."""

    slo: float = 1.0
    per_batch: float = 0.02
    per_query: float = 0.01
    max_batch_size: int = 8
    # What calibration gives this pool: at 56 in flight an arrival waits for 7 batches of 0.1 s and
    # its own, 0.8-0.9 s, inside the 1 s SLO; slowed down, the same depth takes 1.6-1.8 s.
    seed_depth: int = 56
    arrival_rate: float = 200.0  # requests per second, 2.5x what the pool serves at full speed
    slow_at: float = 30.0
    recover_at: float = 60.0
    end: float = 100.0
    slowdown: float = 2.0
    random_seed: int = 7
    control_interval: float = 0.5

    def batch_seconds(self, queries: int, at: float) -> float:
        slow = self.slow_at <= at < self.recover_at
        return (self.per_batch + self.per_query * queries) * (self.slowdown if slow else 1.0)


class SimulatedInstance:
    """Embeds a batch in the scenario's service time for the simulated moment the batch starts."""

    def __init__(self, name: str, scenario: Scenario) -> None:
        self.name = name
        self.scenario = scenario

    async def start(self) -> None: ...

    async def embed(self, sequences: Sequence[np.ndarray]) -> np.ndarray:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.scenario.batch_seconds(len(sequences), loop.time()))
        return np.zeros((len(sequences), 4), dtype=np.float32)

    async def restart(self) -> None: ...

    async def close(self) -> None: ...


@dataclass
class Record:
    """What happened: each answer (arrived, answered), each refusal's time, the depth over time."""

    answers: list[tuple[float, float]] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    depths: list[tuple[float, int]] = field(default_factory=list)  # after every control period

    def depth_at(self, moment: float) -> int:
        """The depth in force at `moment` (the last one recorded at or before it)."""
        return [depth for at, depth in self.depths if at <= moment][-1]

    def p99_answered(self, start: float, stop: float) -> float | None:
        """p99 of the answer times of requests answered in [start, stop)."""
        seconds = [answered - arrived for arrived, answered in self.answers if start <= answered < stop]
        return p99(seconds) if seconds else None

    def accepted_rate(self, start: float, stop: float) -> float:
        return sum(start <= arrived < stop for arrived, _ in self.answers) / (stop - start)


async def _drive(scenario: Scenario, mode: str) -> Record:
    loop = asyncio.get_running_loop()
    qm = QueueManager(
        [("accelerator", scenario.seed_depth, [SimulatedInstance("sim0", scenario)])],
        max_batch_size=scenario.max_batch_size,
        depth_control=mode,
        slo=scenario.slo,
        control_interval=scenario.control_interval,
        now=loop.time,
    )
    await qm.start()
    qm.set_depth("accelerator", scenario.seed_depth)
    record = Record()
    pool = qm.pools[0]

    def answered(arrived: float, future: asyncio.Future) -> None:
        request = pending.pop(future)
        seconds = loop.time() - arrived
        qm.record_latency(request, seconds)
        record.answers.append((arrived, loop.time()))

    async def watch_depth() -> None:
        while True:
            record.depths.append((loop.time(), pool.depth))
            await asyncio.sleep(scenario.control_interval)

    watcher = asyncio.create_task(watch_depth())
    pending: dict[asyncio.Future, object] = {}
    query = [np.ones(16, dtype=np.int64)]
    arrivals = random.Random(scenario.random_seed)
    at = arrivals.expovariate(scenario.arrival_rate)
    while at < scenario.end:
        await asyncio.sleep(at - loop.time())
        try:
            request = qm.admit(query)
        except Busy:
            record.refused.append(at)
        else:
            pending[request.future] = request
            request.future.add_done_callback(lambda future, arrived=at: answered(arrived, future))
        at += arrivals.expovariate(scenario.arrival_rate)
    await qm.drain()
    watcher.cancel()
    await qm.close()
    return record


def run_scenario(scenario: Scenario = Scenario(), mode: str = "adaptive") -> Record:
    """Run `scenario` on a fresh virtual-time loop with depth control `mode` ("adaptive" or "static")."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(_drive(scenario, mode))
    finally:
        loop.close()


def windows(scenario: Scenario, width: float) -> list[tuple[float, float]]:
    count = math.ceil(scenario.end / width)
    return [(i * width, (i + 1) * width) for i in range(count)]
