"""Choose the CPU layout (which cores, how many instances, TP or replicas) by measuring.

After "Sandwich": which cores an engine uses matters as much as how many, and the best
layout differs between machines, models and query lengths. So each candidate the topology
allows is built and profiled briefly, and the one with the largest CPU depth is kept.
The candidates are opaque here; the caller knows how to build a pool from one.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class NamedLayout(Protocol):
    name: str


L = TypeVar("L", bound=NamedLayout)


@dataclass(frozen=True)
class LayoutTrial:
    name: str
    depth: int | None  # None: unusable at the SLO, or the layout could not be built
    seconds: float
    error: str | None = None


@dataclass(frozen=True)
class LayoutChoice(Generic[L]):
    best: L | None  # None when no candidate gave a usable depth
    trials: tuple[LayoutTrial, ...]


async def choose_layout(
    candidates: Sequence[L],
    evaluate: Callable[[L], Awaitable[int | None]],
    on_trial: Callable[[LayoutTrial], None] | None = None,
) -> LayoutChoice[L]:
    """Evaluate each candidate (build its pool, profile it, return its depth); keep the deepest.

    A candidate that fails to build or profile is recorded with its error and skipped. Ties
    go to the earlier candidate, so list them in order of preference.
    """
    best: L | None = None
    best_depth = 0
    trials: list[LayoutTrial] = []
    for candidate in candidates:
        started = time.perf_counter()
        try:
            depth, error = await evaluate(candidate), None
        except Exception as exc:  # one broken layout must not end the search
            depth, error = None, f"{type(exc).__name__}: {exc}"
        trial = LayoutTrial(candidate.name, depth, time.perf_counter() - started, error)
        trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        if depth is not None and depth > best_depth:
            best, best_depth = candidate, depth
    return LayoutChoice(best, tuple(trials))
