"""Did the machine keep its speed while a pool was calibrated?

A machine that shares its cores, caches or memory bandwidth changes speed for seconds to minutes at a
time, and a depth profiled in a fast spell misses the SLO in a slow one. Two checks tell:

- `CrossingCheck` (free): the settled crossing is the level the fit put at the profile's target (the SLO,
  less the headroom in `windve calibrate`); its measured tail lands near that target when the machine
  held its speed during the profile.
- `SpeedCheck` (`--recheck`, one level more): a profiled level measured again after the other stages.

Either one more than `SPEED_TOLERANCE` off says the depth is that uncertain; the report says so, and
`windve serve` warns when the crossing measured slower than the fit put it (a depth that may be too deep).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_level

# Within this share, a tail measured again comes from the same machine state (figures: bench/ESTIMATOR.md).
SPEED_TOLERANCE = 0.10

_MORE_MARGIN = "calibrate again, or use --headroom 0.2"


def same_speed(ratio: float) -> bool:
    """A tail measured at `ratio` times what was expected came from the same machine state."""
    return abs(ratio - 1) <= SPEED_TOLERANCE


@dataclass(frozen=True)
class SpeedCheck:
    """A profiled level's tail in the profile and again after the other stages."""

    concurrency: int
    profile_p99: float
    recheck_p99: float

    @property
    def ratio(self) -> float:
        return self.recheck_p99 / self.profile_p99

    @property
    def steady(self) -> bool:
        return same_speed(self.ratio)

    def describe(self) -> str:
        said = (
            f"C={self.concurrency} took {self.ratio:.2f}x its profile tail "
            f"({self.recheck_p99:.3f} s against {self.profile_p99:.3f} s)"
        )
        if self.steady:
            return f"{said}: the machine held its speed"
        slower = "slower" if self.ratio > 1 else "faster"
        return f"{said}: the machine ran {abs(self.ratio - 1):.0%} {slower} than during the profile; {_MORE_MARGIN}"


@dataclass(frozen=True)
class CrossingCheck:
    """The level the fit put at the profile's target tail (the settled crossing), as it measured."""

    concurrency: int
    p99: float
    target: float

    @property
    def ratio(self) -> float:
        return self.p99 / self.target

    @property
    def steady(self) -> bool:
        return same_speed(self.ratio)

    @property
    def slower(self) -> bool:
        """Off and slower than the fit put it: the depth may be too deep for the SLO. Off and faster
        (a tail flat up to where the queue starts to tell, as a GPU's served over HTTP is, bends up
        under the line through it), the depth errs shallow, and more headroom would be the wrong
        advice."""
        return not self.steady and self.ratio > 1

    def describe(self) -> str:
        measured = (
            f"the fitted crossing C={self.concurrency} took {self.p99:.3f} s, {self.ratio:.2f}x the "
            f"{self.target:.4g} s tail the fit put it at"
        )
        if self.ratio < 1:
            return (
                f"{measured}: the tail is not linear there, or the machine sped up during the profile; the "
                "profile then narrowed the levels around the target, and the depth errs shallow by at most the "
                "gap between them (a stress test, --stress-test, tells)"
            )
        return (
            f"{measured}: the machine changed speed during the profile, or the tail is not linear there, "
            f"and the depth may be off by as much; {_MORE_MARGIN}"
        )


def settled_sample(samples: Sequence[LevelSample], settled: int | None) -> LevelSample | None:
    """The settled crossing's sample (the last one at that concurrency); None when nothing was settled."""
    return next((s for s in reversed(samples) if settled is not None and s.concurrency == settled), None)


def reference_level(samples: Sequence[LevelSample], settled: int | None = None) -> LevelSample | None:
    """The level a recheck measures again: the settled crossing, else the deepest answered level."""
    answered = [sample for sample in samples if math.isfinite(sample.p99) and sample.p99 > 0]
    crossing = settled_sample(answered, settled)
    return crossing or max(answered, key=lambda s: s.concurrency, default=None)


def crossing_check(samples: Sequence[LevelSample], settled: int | None, target: float) -> CrossingCheck | None:
    """The settled crossing against the tail the profile aimed at; None when the profile settled
    none, or the server refused it (no tail to read: the refusals are reported, and "took inf s"
    had then blamed the machine's speed)."""
    sample = settled_sample(samples, settled)
    if sample is None or not math.isfinite(sample.p99):
        return None
    return CrossingCheck(sample.concurrency, sample.p99, target)


async def recheck_speed(
    submit: Submit,
    make_query: MakeQuery,
    samples: Sequence[LevelSample],
    settled: int | None = None,
    *,
    timeout: float | None = None,
    pool: str = "pool",
    progress: ProgressHook | None = None,
) -> SpeedCheck | None:
    """Measure the reference level again, with the rounds it had; None when no level was answered."""
    reference = reference_level(samples, settled)
    if reference is None:
        return None
    again = await measure_level(
        submit, make_query, reference.concurrency, reference.tokens, reference.rounds,
        timeout=timeout, stage="recheck", pool=pool, progress=progress,
    )
    return SpeedCheck(reference.concurrency, reference.p99, again.p99)
