"""Profile one pool: closed-loop rounds at rising concurrency until the tail passes the SLO.

While the fit so far says the SLO is far away, levels grow by `growth`. Once the next growth step
would pass the predicted crossing, the next level is aimed past it (`overshoot`), so that the
last, well-measured points straddle the boundary where the depth is read off. Levels are
weighted by their rounds in every fit.

With `scout_rounds` below `rounds` (what `windve calibrate` does by default) the growth levels
(1, 4, 16, ...) get `scout_rounds` rounds and only find the slope and where to aim; the first
level (one query, cheap, it anchors the intercept) and the aimed ones get the full rounds, and
so does the last scout before the aim, measured again (C = 64 at a depth of ~200), unless
`scout_aims` (below). Without scouting, levels double (1, 2, 4, ...), each with the full rounds.
A level costs its rounds times its latency, and the levels below the crossing add up to about
as much as the crossing level itself, so what a profile costs is mostly how many aimed levels it
needs: an aimed level that still meets needs another, as costly. The aim is 15 % past the
predicted crossing because the slope read from C = 64 moves by +-20 % here with the machine's
speed: 5 % past it, 5 of 7 scouted profiles needed a second aimed level (median 14.2 s); 15 %
past it, 1 of 7 (9.0 s).

With `settle` (what `windve calibrate` does by default), once a level measured in full has
missed, the level the fit says crosses the SLO is measured too, in full, and joins the fit. The
aimed levels lie past the crossing and the others far below it, so without it the depth is read
off a line between points none of which is near it; near the crossing the latency here rises
more steeply than that line, and the depth came out low. In 24 profiles on a steady evening,
each read without and with its settled level (a step-1 sweep between blocks of 8 found 253-255):
within 5 % of 254 in 16 and 20, mean error -3.7 % and -2.5 %, for one more level (~6 s).

With `scout_aims` too (`windve calibrate --scout-aims`), the settled level is the only one
measured in full near the crossing: the aimed levels are scouted as well, the last growth scout
is not measured again, and the first scout that misses brackets the crossing. Only C = 1 and
the settled level get the full rounds, which halves what a profile costs, but the depth then
rests on one level in full near the crossing rather than three, and a one-round scout that
misses by 20 % puts the settled level that much low. In 12 interleaved pairs on a noisy morning
here (README, Calibration): at 1 s, 9.4 s against 21.3 s (medians) and within 5 % of 254 in 7
against 11 of 12; at 0.5 s, 4.4 s against 8.7 s and within 5 % of 126 in 6 against 4 of 12.
A scouted miss with no fitted crossing between it and what met is measured again in full.

`scout_aims=None` (what `windve calibrate` does by default) chooses between the two on the
first aimed level, scouted, whose one round puts a point near the crossing into the fit (or on a
growth scout that already missed): the aims stay scouted when the fit then puts the crossing
below `FULL_AIMS_MIN_DEPTH`; otherwise the last growth scout and that aim are measured again in
full and the profile goes on as with its aims in full, for one round more. (Read off the growth
scouts alone, the crossing of a pool that crossed 1 s at ~250 was once predicted at 173.) Three
levels in full near a crossing at depth D cost about 3 x rounds x SLO; a stress test in steps of
8 up to D, about rounds x SLO x D / 16 (its levels average half the SLO), so below D = 192 the
three cost more than a quarter of that sweep (33-51 % measured at D ~ 125). There they bought no
accuracy either (the pairs above, 4 against 6 of 12 at 0.5 s); at 254 they did (11 against 7).

With scouting, a shallow settled crossing gets fewer rounds (`settle_rounds`): at most an eighth
of what a step-8 stress test up to it costs, so 3 of 5 rounds at a depth of ~80 and 2 at ~60.
Measured in full there, it alone cost a fifth to a quarter of that sweep, and its profiles
23-37 % of it. With 3 of 5 rounds, profiles at 0.5 s here cost 10-21 % (within 5 % of a step-1
sweep in 9 of 13 runs); with 2 of 3, the simulated shallow pool's cost 25 %. The scouts that
brought the profile there cost the same at any rounds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from estimator.fit import DEFAULT_DEPTH_CAP, LinearFit, fit_linear
from estimator.rounds import (
    LevelSample,
    MakeQuery,
    ProgressHook,
    Submit,
    measure_level,
    warm_up,
)
from estimator.stress import DEFAULT_STEP

# Stop after this many levels whatever happens: every plan below makes progress, this only
# bounds a pool whose latency jumps about so much that the aim keeps moving.
MAX_LEVELS = 32

# With `scout_aims=None`, a crossing predicted below this depth gets scouted aims (module doc).
FULL_AIMS_MIN_DEPTH = 192

# With scouting, the settled crossing costs at most this share of a stress test in steps of
# DEFAULT_STEP up to it (`settle_rounds`, module doc).
SETTLE_SHARE = 1 / 8


@dataclass(frozen=True)
class Profile:
    samples: tuple[LevelSample, ...]
    seconds: float
    stop_reason: str
    settled: int | None = None  # the fitted crossing, measured last (`settle`)


@dataclass(frozen=True)
class NextLevel:
    concurrency: int
    scout: bool  # far below the predicted crossing: a cheap look, measured with fewer rounds


def finite_samples(samples: Sequence[LevelSample]) -> list[LevelSample]:
    return [sample for sample in samples if math.isfinite(sample.p95)]


def fit_samples(samples: Sequence[LevelSample]) -> LinearFit | None:
    """The weighted fit of the answered levels; None with fewer than two distinct levels."""
    usable = finite_samples(samples)
    if len({sample.concurrency for sample in usable}) < 2:
        return None
    return fit_linear(
        [s.concurrency for s in usable], [s.p95 for s in usable], weights=[s.rounds for s in usable]
    )


def next_level(samples: Sequence[LevelSample], slo: float, overshoot: float, growth: int = 4) -> NextLevel:
    """Grow and scout while the SLO is far; else aim just past the predicted crossing.

    The aim never falls back to a level that already met (a pessimistic fit must still make
    progress: at least 1.25x the deepest level that met) and never goes beyond the lowest
    level above it that missed (a scout that missed is measured again with full rounds).
    """
    current = samples[-1].concurrency
    deepest_met = max((s.concurrency for s in samples if s.meets(slo)), default=0)
    missed_above = [s.concurrency for s in samples if not s.meets(slo) and s.concurrency > deepest_met]
    crossing = fitted_crossing(samples, slo)
    if crossing is None:
        if missed_above:
            return NextLevel(max(deepest_met + 1, min(missed_above) // 2) if deepest_met else current * 2, False)
        return NextLevel(current * growth, True)
    aimed = math.ceil(crossing * (1 + overshoot))
    if not missed_above and aimed > current * growth:
        return NextLevel(current * growth, True)
    level = max(aimed, math.ceil(deepest_met * 1.25), deepest_met + 1)
    if missed_above:
        level = min(level, min(missed_above))
    return NextLevel(level, False)


def fitted_crossing(samples: Sequence[LevelSample], slo: float) -> float | None:
    """The concurrency at which the fit of the levels so far reaches `slo`; None without a fit or a slope."""
    fit = fit_samples(samples)
    return None if fit is None else fit.crossing(slo)


def predicted_depth(samples: Sequence[LevelSample], slo: float) -> int | None:
    """Where the fit of the levels so far crosses `slo`, rounded down; None without a fit or a slope."""
    crossing = fitted_crossing(samples, slo)
    return None if crossing is None else math.floor(crossing)


def settle_level(samples: Sequence[LevelSample], slo: float, scouted_miss: bool = False) -> int | None:
    """The level the fit says crosses `slo`, when it lies between the deepest level that met and
    the shallowest one above it that missed (measured in full, or at all with `scouted_miss`),
    and has not been measured in full.

    None when there is nothing to settle: no fit, no slope, no miss above what met, or the
    crossing falls on or outside the measured bracket (the depth is then read off those levels).
    """
    level = predicted_depth(samples, slo)
    if level is None:
        return None
    full = max(sample.rounds for sample in samples)
    deepest_met = max((s.concurrency for s in samples if s.meets(slo)), default=0)
    missed = [
        s.concurrency for s in samples
        if (scouted_miss or s.rounds == full) and not s.meets(slo) and s.concurrency > deepest_met
    ]
    if not missed:
        return None
    measured = {s.concurrency for s in samples if s.rounds == full}
    if not deepest_met < level < min(missed) or level in measured:
        return None
    return level


def settle_rounds(crossing: int, rounds: int, scout_rounds: int) -> int:
    """The rounds the settled crossing gets: `rounds`, unless that level alone would cost more than
    `SETTLE_SHARE` of a stress test up to it, which happens below a depth of 128 at this share.

    A stress test in steps of 8 up to depth D measures D/8 levels whose tails average half the SLO
    T: rounds x T x D/16; the settled level costs its rounds x T. So at D = 64 a settled level in
    full alone costs a quarter of that sweep. Never fewer than 2 rounds (one round's tail moved by
    up to 1.3x against six of the same level here) nor as few as a scout's; without scouting
    (`scout_rounds` equal to `rounds`) every level, this one too, gets `rounds`.
    """
    if scout_rounds >= rounds:
        return rounds
    stress_cost_in_slos = rounds * crossing / (2 * DEFAULT_STEP)
    affordable = math.floor(SETTLE_SHARE * stress_cost_in_slos)
    return min(rounds, max(affordable, scout_rounds + 1, 2))


async def profile_pool(
    submit: Submit,
    make_query: MakeQuery,
    slo: float,
    *,
    query_tokens: int = 75,
    rounds: int = 5,
    scout_rounds: int | None = None,
    growth: int | None = None,
    max_concurrency: int = DEFAULT_DEPTH_CAP,
    min_levels: int = 2,
    overshoot: float = 0.15,
    warmup_concurrency: int = 4,
    request_timeout: float | None = None,
    settle: bool = False,
    scout_aims: bool | None = False,
    pool: str = "pool",
    stage: str = "profile",
    progress: ProgressHook | None = None,
) -> Profile:
    """Measure levels until one measured with full rounds misses `slo` (after `min_levels` levels).

    `scout_rounds` None (the default) scouts nothing: every level gets `rounds` and levels
    double. With fewer scout rounds, levels grow 4x (`growth`) while scouting. With `settle`,
    the fitted crossing is measured last (`settle_level`). With `scout_aims` as well (and
    scouting), the aims are scouted too and the first scout that misses ends the profile,
    followed by the crossing below it; `scout_aims=None` scouts them when the crossing predicted
    with the first aim lies below `FULL_AIMS_MIN_DEPTH` (it then needs `settle` and scouting, else
    the aims are measured in full).
    """
    scout_rounds = rounds if scout_rounds is None else min(scout_rounds, rounds)
    if growth is None:
        growth = 4 if scout_rounds < rounds else 2
    if slo <= 0 or rounds < 1 or scout_rounds < 1 or max_concurrency < 1 or query_tokens < 1 or growth < 2:
        raise ValueError("slo, rounds, scout_rounds, max_concurrency and query_tokens must be positive, growth >= 2")
    if scout_aims is True and not settle:
        raise ValueError("scout_aims needs settle: the settled crossing is then the only level in full near it")
    started = time.perf_counter()
    await warm_up(submit, make_query, query_tokens, min(warmup_concurrency, max_concurrency), request_timeout)

    async def measure(concurrency: int, level_rounds: int) -> LevelSample:
        return await measure_level(
            submit, make_query, concurrency, query_tokens, level_rounds,
            timeout=request_timeout, stage=stage, pool=pool, progress=progress,
        )

    run = _ProfileRun(
        measure, slo, rounds, scout_rounds, growth=growth, overshoot=overshoot,
        max_concurrency=max_concurrency, min_levels=min_levels, settle=settle, scout_aims=scout_aims,
    )
    reason, crossing = await run.levels()
    if crossing is not None:
        crossing_rounds = settle_rounds(crossing, rounds, scout_rounds)
        run.samples.append(await measure(crossing, crossing_rounds))
        reason += f"; the fitted crossing C={crossing} measured too"
        if crossing_rounds < rounds:
            reason += f" ({crossing_rounds} rounds: shallow)"
    return Profile(tuple(run.samples), time.perf_counter() - started, reason + run.aims_note, settled=crossing)


@dataclass
class _ProfileRun:
    """The levels one profile has measured, and how it measures the next (`profile_pool`)."""

    measure: Callable[[int, int], Awaitable[LevelSample]]  # (concurrency, rounds) -> the level's sample
    slo: float
    rounds: int
    scout_rounds: int
    growth: int
    overshoot: float
    max_concurrency: int
    min_levels: int
    settle: bool
    scout_aims: bool | None
    samples: list[LevelSample] = field(default_factory=list)
    # Lean: the settled crossing is the level measured in full near the boundary; the aimed levels
    # only find a miss past it. With `scout_aims=None` it is chosen once (`choose_aims`).
    lean: bool = field(init=False)
    undecided: bool = field(init=False)
    aims_note: str = ""  # how the aims were chosen, for the stop reason

    def __post_init__(self) -> None:
        scouting = self.scout_rounds < self.rounds
        self.undecided = self.scout_aims is None and self.settle and scouting
        self.lean = (self.scout_aims is True or self.undecided) and scouting

    async def levels(self) -> tuple[str, int | None]:
        """Measure levels until the profile ends: why it ended, and the crossing left to settle."""
        plan = NextLevel(1, scout=False)
        aiming = False  # the level being measured is aimed at the crossing (not a growth step)
        for _ in range(MAX_LEVELS):
            sample = await self.measure(plan.concurrency, self.scout_rounds if plan.scout else self.rounds)
            self.samples.append(sample)
            meets = sample.meets(self.slo)
            if self.undecided and plan.scout and (aiming or not meets):
                sample, plan = await self.choose_aims(sample, plan, aiming)
                meets = sample.meets(self.slo)
            if self.lean and plan.scout and not meets and self.enough_levels():
                # Past the SLO by one round: the crossing below it is what remains to measure in full.
                crossing = settle_level(self.samples, self.slo, scouted_miss=True)
                if crossing is not None:
                    return f"{self.missed(sample)} (scouted)", crossing
                # No fitted crossing between what met and this miss: the miss is measured again in full.
            if plan.scout and meets and not self.lean and not self.plan_next().scout:
                # The last scout before the aim is measured again in full: with C = 1 and the aimed
                # levels it carries the fit, so the depth does not rest on the aimed level alone. If
                # in full it misses, it is the aimed level: the profile ends on it.
                sample = await self.measure_again(len(self.samples) - 1)
                plan = NextLevel(sample.concurrency, scout=False)
                meets = sample.meets(self.slo)
            if not plan.scout and self.enough_levels() and not meets:
                return self.missed(sample), settle_level(self.samples, self.slo) if self.settle else None
            if not plan.scout and plan.concurrency >= self.max_concurrency:
                return f"reached max concurrency {self.max_concurrency} within the SLO", None
            planned = next_level(self.samples, self.slo, self.overshoot, self.growth)
            aiming = not planned.scout
            plan = self.as_measured(planned)
        return f"measured {MAX_LEVELS} levels and the aim kept moving", None

    async def choose_aims(self, sample: LevelSample, plan: NextLevel, aiming: bool) -> tuple[LevelSample, NextLevel]:
        """Scouted aims or in full, chosen once: on the first aim, scouted, whose one round puts a
        level near the crossing into the fit (the best guess of its depth), or on a growth scout
        that already missed. Returns the sample and plan that now stand for the level measured.
        """
        self.undecided = False
        depth = predicted_depth(self.samples, self.slo)
        self.lean = depth is not None and depth < FULL_AIMS_MIN_DEPTH
        predicted = "no slope" if depth is None else f"crossing predicted at C={depth}"
        self.aims_note = f"; aims {'scouted' if self.lean else 'in full'} ({predicted})"
        if self.lean or not aiming:
            # Scouted aims go on as they are; in full, the next aim (no further than a growth scout
            # that missed) is measured in full.
            return sample, plan
        # Deep: what a profile with its aims in full measures, the last growth scout and this aim in
        # full; a last scout that misses in full is the miss it ends on, as there.
        growth_scouts = [i for i, s in enumerate(self.samples[:-1]) if s.rounds < self.rounds]
        if growth_scouts and not (again := await self.measure_again(growth_scouts[-1])).meets(self.slo):
            sample = again
        else:
            sample = await self.measure_again(len(self.samples) - 1)
        return sample, NextLevel(sample.concurrency, scout=False)

    def plan_next(self) -> NextLevel:
        return self.as_measured(next_level(self.samples, self.slo, self.overshoot, self.growth))

    def as_measured(self, plan: NextLevel) -> NextLevel:
        # A growth level is a scout only when it gets fewer rounds: one measured in full that
        # misses ends the profile (measuring it again would only repeat it). The deepest level
        # allowed is always measured in full: the profile may end there.
        scouted = plan.scout or (self.lean and not self.missed_by_scout())
        scout = scouted and self.scout_rounds < self.rounds and plan.concurrency < self.max_concurrency
        return NextLevel(min(self.max_concurrency, plan.concurrency), scout)

    def missed_by_scout(self) -> bool:
        return any(s.rounds < self.rounds and not s.meets(self.slo) for s in self.samples)

    def enough_levels(self) -> bool:
        return len(self.samples) >= self.min_levels

    def missed(self, sample: LevelSample) -> str:
        return f"p95 {sample.p95:.3f} s > SLO {self.slo:g} s at C={sample.concurrency}"

    async def measure_again(self, index: int) -> LevelSample:
        """The level at `index` measured again with full rounds, in its place."""
        self.samples[index] = await self.measure(self.samples[index].concurrency, self.rounds)
        return self.samples[index]
