"""Was the machine as fast at the end of a calibration as during its profile?

A machine that shares its cores, caches or memory bandwidth with other tenants changes
speed for seconds to minutes at a time (the development machine: a state 20-29% slower).
A depth profiled in the fast state misses the SLO in the slow one, and nothing in the
profile shows it. Measuring one profiled level again, after the other stages, tells
whether the speed moved during this calibration; the report says so and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_level

# A level measured again within this share of its profile tail: the same machine state.
# Round-to-round noise of one state here stays within ~5%; the states differ by 20-29%.
SPEED_TOLERANCE = 0.10


def same_speed(ratio: float) -> bool:
    """A tail measured at `ratio` times what was expected came from the same machine state."""
    return abs(ratio - 1) <= SPEED_TOLERANCE


@dataclass(frozen=True)
class SpeedCheck:
    """A profiled level's tail then (`profile_p95`) and again after the other stages."""

    concurrency: int
    profile_p95: float
    recheck_p95: float

    @property
    def ratio(self) -> float:
        return self.recheck_p95 / self.profile_p95

    @property
    def steady(self) -> bool:
        return same_speed(self.ratio)

    def describe(self) -> str:
        said = (
            f"C={self.concurrency} took {self.ratio:.2f}x its profile tail "
            f"({self.recheck_p95:.3f} s against {self.profile_p95:.3f} s)"
        )
        if self.steady:
            return f"{said}: the machine held its speed"
        slower = "slower" if self.ratio > 1 else "faster"
        return (
            f"{said}: the machine ran {abs(self.ratio - 1):.0%} {slower} than during the profile. A machine "
            "that changes speed needs more margin: calibrate again, or use --headroom 0.2"
        )


def reference_level(samples: Sequence[LevelSample], settled: int | None = None) -> LevelSample | None:
    """The deepest answered level among those the profile measured with its full rounds, or the
    `settled` crossing (which a shallow profile measures with fewer: `estimator.profile.settle_rounds`).

    That is the level aimed past the SLO crossing (with `scout_aims`, the settled crossing):
    nearest to the depth, and measured as well as the recheck measures it. A scouted level (one
    round) is no reference: its tail alone moved by up to 1.3x against six rounds of the same
    level in the same minute.
    """
    answered = [sample for sample in samples if math.isfinite(sample.p95) and sample.p95 > 0]
    return max(measured_in_full(answered, settled), key=lambda s: s.concurrency, default=None)


def measured_in_full(samples: Sequence[LevelSample], settled: int | None) -> list[LevelSample]:
    """The levels measured with the profile's full rounds, and the settled crossing whatever its
    rounds: every level but the scouted ones."""
    most = max((sample.rounds for sample in samples), default=0)
    crossing = settled_sample(samples, settled)
    return [s for s in samples if s.rounds == most or s is crossing]


def settled_sample(samples: Sequence[LevelSample], settled: int | None) -> LevelSample | None:
    """The settled crossing's sample: of the levels at its concurrency, the one with the most rounds
    (not a scout of it)."""
    at_crossing = [s for s in samples if settled is not None and s.concurrency == settled]
    return max(at_crossing, key=lambda s: s.rounds, default=None)


@dataclass(frozen=True)
class CrossingCheck:
    """The level the fit put at the SLO (the settled crossing), as it measured.

    Its tail lands near the SLO when the machine held its speed: within 0.92-1.02x in 24 steady
    profiles here. Far from it, the machine changed speed between the levels that predicted it
    and its own measurement, or the tail is not linear there; either way the depth read with it
    is that uncertain (on a swinging machine, 4 of 6 profiles at 1.14-1.33x, their estimates
    -21 % to +12 % off). Near it proves less: the machine may change speed after the profile
    (`recheck_speed` sees that).
    """

    concurrency: int
    p95: float
    slo: float

    @property
    def ratio(self) -> float:
        return self.p95 / self.slo

    @property
    def steady(self) -> bool:
        return same_speed(self.ratio)

    def describe(self) -> str:
        return (
            f"the fitted crossing C={self.concurrency} took {self.p95:.3f} s, {self.ratio:.2f}x the "
            f"{self.slo:g} s SLO the fit put it at: the machine changed speed during the profile, or the "
            "tail is not linear there, and the depth may be off by as much. Calibrate again (--recheck "
            "tells whether the speed moves), or use --headroom 0.2"
        )


def crossing_check(samples: Sequence[LevelSample], settled: int | None, slo: float) -> CrossingCheck | None:
    """The settled crossing against the SLO; None when the profile settled none."""
    sample = settled_sample(samples, settled)
    return None if sample is None else CrossingCheck(sample.concurrency, sample.p95, slo)


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
        submit,
        make_query,
        reference.concurrency,
        reference.tokens,
        reference.rounds,
        timeout=timeout,
        stage="recheck",
        pool=pool,
        progress=progress,
    )
    return SpeedCheck(reference.concurrency, reference.p95, again.p95)
