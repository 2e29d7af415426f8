"""The paper's closed-loop workload: rounds of single-query requests started together.

A pool is anything with an async `submit(sequences)` that returns once the request is answered (one that
also has `prepare(concurrency)` does its set-up, an HTTP pool's connections, before a round's clock). A round
at concurrency C starts C one-query requests at once and ends when all are answered; the next round
starts only then. A level is `rounds` such rounds, and its tail is the p99 of their end-to-end latencies
(nearest rank), the tail the load test holds against the SLO. A request that raises (BUSY/429, a timeout,
a failed instance) counts as infinitely late: it misses every SLO.

Time is read from the running event loop's clock, so that a simulated pool on a virtual clock
(`estimator.simulated.run_virtual`) is measured exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

Submit = Callable[[Sequence[np.ndarray]], Awaitable[Any]]
MakeQuery = Callable[[int], np.ndarray]

TAIL_PERCENTILE = 99.0


@runtime_checkable
class Prepares(Protocol):
    """A submit with set-up to do before a round's clock starts (an HTTP pool opens its connections)."""

    async def prepare(self, concurrency: int) -> None: ...


@dataclass(frozen=True)
class LevelSample:
    """The tail latency (seconds) of `rounds` rounds at one concurrency and query length."""

    concurrency: int
    tokens: int
    rounds: int
    p99: float  # nearest rank; inf when failed requests reach the tail
    max: float
    failures: int = 0
    first_error: str | None = None

    def meets(self, slo: float) -> bool:
        return self.p99 <= slo


@dataclass(frozen=True)
class Progress:
    """One finished round; `sample` is set on the last round of a level."""

    stage: str  # profile | lengths | stress | layout | recheck
    pool: str
    concurrency: int
    round: int
    rounds: int
    sample: LevelSample | None = None


ProgressHook = Callable[[Progress], None]


def tail(latencies: Sequence[float]) -> tuple[float, float]:
    """(p99, max). Nearest rank, so that an infinite (failed) latency never turns into NaN."""
    values = np.asarray(latencies, dtype=float)
    if values.size == 0:
        raise ValueError("no latencies: a level needs at least one request")
    return float(np.percentile(values, TAIL_PERCENTILE, method="inverted_cdf")), float(values.max())


async def timed_request(
    submit: Submit, sequences: Sequence[np.ndarray], timeout: float | None
) -> tuple[float, str | None]:
    """(latency, None) when answered; (inf, error text) when it failed or timed out."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        await asyncio.wait_for(submit(sequences), timeout)
    except Exception as exc:  # any failure is a miss; the text tells the user why
        return math.inf, f"{type(exc).__name__}: {exc}"
    return loop.time() - start, None


async def run_round(
    submit: Submit, queries: Sequence[np.ndarray], timeout: float | None = None
) -> list[tuple[float, str | None]]:
    """Send every query as a request of its own, all at once, and wait for all: one closed-loop round."""
    if isinstance(submit, Prepares):
        # What fails here (no connection) fails again in the round's requests, which count it as misses.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(submit.prepare(len(queries)), timeout)
    return list(await asyncio.gather(*(timed_request(submit, [query], timeout) for query in queries)))


def summarize(
    concurrency: int, tokens: int, rounds: int, outcomes: Sequence[tuple[float, str | None]]
) -> LevelSample:
    p99, worst = tail([latency for latency, _ in outcomes])
    errors = [error for _, error in outcomes if error is not None]
    return LevelSample(concurrency, tokens, rounds, p99, worst, len(errors), errors[0] if errors else None)


async def measure_level(
    submit: Submit,
    make_query: MakeQuery,
    concurrency: int,
    tokens: int,
    rounds: int,
    *,
    timeout: float | None = None,
    stage: str = "profile",
    pool: str = "pool",
    progress: ProgressHook | None = None,
) -> LevelSample:
    """`rounds` closed-loop rounds of `concurrency` queries of `tokens` tokens.

    Each round's queries are built before it starts, so that building them is not timed.
    """
    outcomes: list[tuple[float, str | None]] = []
    for index in range(rounds):
        outcomes += await run_round(submit, [make_query(tokens) for _ in range(concurrency)], timeout)
        if progress is not None and index + 1 < rounds:
            progress(Progress(stage, pool, concurrency, index + 1, rounds))
    sample = summarize(concurrency, tokens, rounds, outcomes)
    if progress is not None:
        progress(Progress(stage, pool, concurrency, rounds, rounds, sample))
    return sample


async def measure_interleaved(
    submit: Submit,
    make_query: MakeQuery,
    levels: Sequence[int],
    tokens: int,
    rounds: int,
    *,
    timeout: float | None = None,
) -> dict[int, LevelSample]:
    """`rounds` rounds at each level, taken in turn (a, b, a, b, ...).

    Levels measured one after the other on a shared machine also compare its slow and fast minutes;
    taken in turn, every level meets the same machine states.
    """
    outcomes: dict[int, list[tuple[float, str | None]]] = {level: [] for level in levels}
    for _ in range(rounds):
        for level in outcomes:
            outcomes[level] += await run_round(submit, [make_query(tokens) for _ in range(level)], timeout)
    return {level: summarize(level, tokens, rounds, results) for level, results in outcomes.items()}


async def warm_up(
    submit: Submit, make_query: MakeQuery, tokens: int, concurrency: int, timeout: float | None = None
) -> None:
    """One unrecorded round, so that first-call costs (allocations, caches) are not profiled."""
    await run_round(submit, [make_query(tokens) for _ in range(concurrency)], timeout)
