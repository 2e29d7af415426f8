"""The paper's closed-loop workload: rounds of single-query requests started together.

A pool is anything with an async `submit(sequences)` that returns once the request is
answered. A round at concurrency C starts C one-query requests at once and ends when all
are answered; the next round starts only then. A request that raises (BUSY/429, timeout,
a failed instance) counts as infinitely late: it misses every SLO.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Submit = Callable[[Sequence[np.ndarray]], Awaitable[Any]]
MakeQuery = Callable[[int], np.ndarray]

TAIL_PERCENTILE = 95.0


@dataclass(frozen=True)
class LevelSample:
    """Tail latency (seconds) of `rounds` rounds at one concurrency and query length."""

    concurrency: int
    tokens: int
    rounds: int
    p95: float  # nearest-rank; inf when failed requests reach the tail
    max: float
    failures: int = 0
    first_error: str | None = None

    def meets(self, slo: float) -> bool:
        return self.p95 <= slo


@dataclass(frozen=True)
class Progress:
    """One finished round; `sample` is set on the last round of a level."""

    stage: str  # profile | lengths | stress | fine-tune | layout | recheck
    pool: str
    concurrency: int
    round: int
    rounds: int
    sample: LevelSample | None = None


ProgressHook = Callable[[Progress], None]


def tail(latencies: Sequence[float]) -> tuple[float, float]:
    """(p95, max). Nearest rank, so that an infinite (failed) latency never turns into NaN."""
    values = np.asarray(latencies, dtype=float)
    if values.size == 0:
        raise ValueError("no latencies: a level needs at least one request")
    return float(np.percentile(values, TAIL_PERCENTILE, method="inverted_cdf")), float(values.max())


async def timed_request(
    submit: Submit, sequences: Sequence[np.ndarray], timeout: float | None
) -> tuple[float, str | None]:
    """(latency, None) when answered; (inf, error text) when it failed or timed out."""
    start = time.perf_counter()
    try:
        await asyncio.wait_for(submit(sequences), timeout)
    except Exception as exc:  # any failure is a miss; the text tells the user why
        return math.inf, f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - start, None


async def run_round(
    jobs: Sequence[tuple[Submit, Sequence[np.ndarray]]], timeout: float | None = None
) -> list[tuple[float, str | None]]:
    """Start every job at once and wait for all: one closed-loop round."""
    return list(await asyncio.gather(*(timed_request(submit, seqs, timeout) for submit, seqs in jobs)))


def summarize(
    concurrency: int, tokens: int, rounds: int, outcomes: Sequence[tuple[float, str | None]]
) -> LevelSample:
    p95, worst = tail([latency for latency, _ in outcomes])
    errors = [error for _, error in outcomes if error is not None]
    return LevelSample(
        concurrency=concurrency,
        tokens=tokens,
        rounds=rounds,
        p95=p95,
        max=worst,
        failures=len(errors),
        first_error=errors[0] if errors else None,
    )


async def measure_joint(
    loads: Mapping[str, tuple[Submit, int]],
    make_query: MakeQuery,
    tokens: int,
    rounds: int,
    *,
    timeout: float | None = None,
    stage: str = "profile",
    progress: ProgressHook | None = None,
) -> dict[str, LevelSample]:
    """Closed-loop rounds with several pools loaded together: {pool: (submit, concurrency)}.

    Queries are built before each round starts so that building them is not timed.
    """
    active = {name: load for name, load in loads.items() if load[1] > 0}
    outcomes: dict[str, list[tuple[float, str | None]]] = {name: [] for name in active}
    label = "+".join(active)
    total = sum(count for _, count in active.values())
    for index in range(rounds):
        owners = [name for name, (_, count) in active.items() for _ in range(count)]
        jobs = [(active[name][0], [make_query(tokens)]) for name in owners]
        for name, outcome in zip(owners, await run_round(jobs, timeout)):
            outcomes[name].append(outcome)
        if progress is not None and index + 1 < rounds:
            progress(Progress(stage, label, total, index + 1, rounds))
    samples = {
        name: summarize(active[name][1], tokens, rounds, outcomes[name]) for name in active
    }
    if progress is not None:
        # The last round's event carries the sample (of the only pool, or of the first).
        first = next(iter(samples.values()), None)
        progress(Progress(stage, label, total, rounds, rounds, first))
    return samples


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
    """`rounds` closed-loop rounds of `concurrency` queries of `tokens` tokens on one pool."""
    samples = await measure_joint(
        {pool: (submit, concurrency)}, make_query, tokens, rounds, timeout=timeout, stage=stage, progress=progress
    )
    return samples[pool]


async def measure_interleaved(
    submit: Submit,
    make_query: MakeQuery,
    levels: Sequence[int],
    tokens: int,
    rounds: int,
    *,
    timeout: float | None = None,
) -> dict[int, LevelSample]:
    """`rounds` rounds at each level, taken in turn (a, b, a, b, ...), so that every level
    meets the same machine state: comparing levels measured one after the other on a
    shared machine also compares its slow and fast minutes."""
    outcomes: dict[int, list[tuple[float, str | None]]] = {level: [] for level in levels}
    for _ in range(rounds):
        for level in outcomes:
            outcomes[level] += await run_round([(submit, [make_query(tokens)]) for _ in range(level)], timeout)
    return {level: summarize(level, tokens, rounds, results) for level, results in outcomes.items()}


async def warm_up(
    submit: Submit, make_query: MakeQuery, tokens: int, concurrency: int, timeout: float | None = None
) -> None:
    """One unrecorded round, so that first-call costs (allocations, caches) are not profiled."""
    await run_round([(submit, [make_query(tokens)]) for _ in range(concurrency)], timeout)
