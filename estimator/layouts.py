"""Choose the CPU layout (which cores, how many instances, TP or replicas) by measuring.

After "Sandwich": which cores an engine uses matters as much as how many, and the best layout differs
between machines, models and query lengths. So each candidate the topology allows is built and profiled
briefly, and the one with the largest CPU depth is kept. The candidates are opaque here (anything with a
`name`); the caller knows how to build a pool from one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayoutTrial:
    name: str
    depth: int | None  # None: unusable at the SLO, or the layout could not be built
    seconds: float
    error: str | None = None


@dataclass(frozen=True)
class LayoutChoice:
    best: Any  # the deepest candidate; None when none gave a usable depth
    trials: tuple[LayoutTrial, ...]


async def choose_layout(candidates: Sequence[Any], evaluate: Callable[[Any], Awaitable[int | None]]) -> LayoutChoice:
    """Evaluate each candidate (build its pool, profile it, return its depth); keep the deepest.

    A candidate that fails to build or profile is recorded with its error and skipped. Ties go to the
    earlier candidate, so list them in order of preference.
    """
    loop = asyncio.get_running_loop()
    best, best_depth = None, 0
    trials: list[LayoutTrial] = []
    for candidate in candidates:
        started = loop.time()
        try:
            depth, error = await evaluate(candidate), None
        except Exception as exc:  # one broken layout must not end the search
            depth, error = None, f"{type(exc).__name__}: {exc}"
        trials.append(LayoutTrial(candidate.name, depth, loop.time() - started, error))
        if depth is not None and depth > best_depth:
            best, best_depth = candidate, depth
    return LayoutChoice(best, tuple(trials))
