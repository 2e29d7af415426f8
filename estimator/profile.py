"""Profile one pool: closed-loop levels at rising concurrency until the tail passes the SLO.

After one unrecorded warm-up round, every level gets the same `rounds`:

1. Growth: C = 1, then `growth` times the last level, while the line (`fit_samples`) puts the SLO
   crossing beyond the next step.
2. An aimed level, `aim_past` beyond the crossing that line predicts (at least 1.25x the deepest level
   so far). Growth and aims go on until a level misses the SLO (or the cap is reached): an aim that
   meets is not the end, because the line that aimed it was read off levels below the crossing.
3. The settled crossing: the level where the line reaches the SLO, measured too when it lies between
   the deepest level that met the SLO and the shallowest one that missed and was not measured yet.
4. Where the settled crossing took more than 10 % off the SLO (`estimator.recheck.same_speed`), or none
   was measured, the line is wrong there (a GPU's tail bends up when its front ends fill): while the
   bracket of answered levels is wider than `BRACKET`, its geometric middle is measured, at most three
   levels after a growth step.
The depth is read off the line, within the bracket the levels measured (`decide_profile_depth`).

The line goes through the levels within `FIT_SPAN` of the deepest one, not all of them: on a GPU the
tail is flat, or even concave, from C = 1 to where the device saturates, and linear only past it
(t = alpha*C + beta holds where the queue sets the tail); levels far below the crossing then tilt the
line and move its crossing by hundreds of queries (bench/ESTIMATOR.md, 2026-11-27, a fourth session).
Levels never exceed `max_concurrency`; a level there that meets the SLO ends the profile. A pool whose
first level misses still gets a second, so that a line (and the verdict "unusable") can be fitted.
Why these rules and what they cost against a stress test: bench/ESTIMATOR.md.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from estimator.fit import DEFAULT_DEPTH_CAP, DepthDecision, LinearFit, decide_depth, fit_linear
from estimator.recheck import same_speed
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_level, warm_up


@dataclass(frozen=True)
class ProfileOptions:
    """How each level is measured and how far a profile goes."""

    query_tokens: int = 75  # the paper's query length
    rounds: int = 5
    max_concurrency: int = DEFAULT_DEPTH_CAP  # nothing beyond it is measured; it also caps every depth
    growth: int = 4
    aim_past: float = 0.15
    warmup_concurrency: int = 4
    request_timeout: float | None = None

    def __post_init__(self) -> None:
        if min(self.query_tokens, self.rounds, self.max_concurrency, self.warmup_concurrency) < 1:
            raise ValueError("query_tokens, rounds, max_concurrency and warmup_concurrency must be >= 1")
        if self.growth < 2 or self.aim_past < 0:
            raise ValueError(f"growth must be >= 2 and aim_past >= 0 (got {self.growth}, {self.aim_past})")


@dataclass(frozen=True)
class Profile:
    samples: tuple[LevelSample, ...]
    seconds: float
    stop_reason: str
    settled: int | None = None  # the fitted crossing, measured last


def finite_samples(samples: Sequence[LevelSample]) -> list[LevelSample]:
    """The levels whose tail was answered (no failed request reached it)."""
    return [sample for sample in samples if math.isfinite(sample.p99)]


# Two growth steps: the line keeps the last three growth levels and what was aimed or settled among
# them, enough points to average a level's noise, few enough to stay where the queue sets the tail.
FIT_SPAN = 16


def fitted_levels(samples: Sequence[LevelSample]) -> list[LevelSample]:
    """The answered levels the line goes through, shallowest first: those at or above 1/FIT_SPAN of the
    deepest one, and always the two deepest distinct levels."""
    usable = sorted(finite_samples(samples), key=lambda s: s.concurrency)
    levels = sorted({s.concurrency for s in usable})
    if len(levels) < 2:
        return usable
    floor = min(levels[-1] / FIT_SPAN, levels[-2])
    return [s for s in usable if s.concurrency >= floor]


def fit_samples(samples: Sequence[LevelSample]) -> LinearFit | None:
    """The line through `fitted_levels`; None with fewer than two distinct levels answered."""
    usable = fitted_levels(samples)
    if len({sample.concurrency for sample in usable}) < 2:
        return None
    return fit_linear([s.concurrency for s in usable], [s.p99 for s in usable])


def fitted_crossing(samples: Sequence[LevelSample], slo: float) -> float | None:
    """The concurrency at which the fit of `samples` reaches `slo`; None without a fit or a slope."""
    fit = fit_samples(samples)
    return None if fit is None else fit.crossing(slo)


def next_level(samples: Sequence[LevelSample], slo: float, options: ProfileOptions) -> int:
    """The level after `samples`, none of which missed: the next growth step, or the aimed level once
    the line puts the crossing within that step."""
    deepest = max(sample.concurrency for sample in samples)
    grown = min(options.max_concurrency, deepest * options.growth)
    crossing = fitted_crossing(samples, slo)
    if crossing is None:
        return grown
    aim = math.ceil(crossing * (1 + options.aim_past))
    if aim > deepest * options.growth:
        return grown
    # A fit that puts the crossing at or below a level that met still moves on.
    return min(options.max_concurrency, max(aim, math.ceil(deepest * 1.25)))


def settle_level(samples: Sequence[LevelSample], slo: float, cap: int = DEFAULT_DEPTH_CAP) -> int | None:
    """The level where the fit of `samples` reaches `slo`, rounded down, when it lies strictly between
    the deepest level that met and the shallowest one above it that missed (if any), is at most `cap`,
    and was not measured yet; else None."""
    crossing = fitted_crossing(samples, slo)
    if crossing is None:
        return None
    level = math.floor(crossing)
    met = max((s.concurrency for s in samples if s.meets(slo)), default=0)
    missed = min((s.concurrency for s in samples if not s.meets(slo) and s.concurrency > met), default=math.inf)
    if not met < level < missed or level > cap or level in {s.concurrency for s in samples}:
        return None
    return level


def measured_bracket(samples: Sequence[LevelSample], target: float) -> tuple[int, int | None]:
    """(the deepest level that met `target` with every shallower level meeting it too, 0 if none;
    the level just past it, which missed, or None when every level met)."""
    levels = sorted({sample.concurrency for sample in samples})
    met = 0
    for level in levels:
        if not all(s.p99 <= target for s in samples if s.concurrency == level):
            return met, level
        met = level
    return met, None


# A bracket at most this wide is what an aimed level leaves (1.15x the crossing, at least 1.25x the
# level before it); wider, the line that aimed it missed the bend, and the bracket is narrowed.
BRACKET = 1.25


def narrowing_level(samples: Sequence[LevelSample], slo: float) -> int | None:
    """The geometric middle of the answered levels' bracket (`measured_bracket`) when it is wider than
    BRACKET and a level lies strictly inside it; else None. A refused level is no end: where a server
    starts refusing is its own limit, not its tail."""
    met, missed = measured_bracket(finite_samples(samples), slo)
    if met < 1 or missed is None or missed <= BRACKET * met:
        return None
    level = round(math.sqrt(met * missed))
    return level if met < level < missed else None


def chord_depth(samples: Sequence[LevelSample], target: float, met: int, missed: int) -> int:
    """Where the straight line between the bracket's two levels (their mean tails) reaches `target`,
    rounded down: at least `met`, below `missed`."""

    def tail(level: int) -> float:
        return float(np.mean([s.p99 for s in samples if s.concurrency == level]))

    low, high = tail(met), tail(missed)
    if not high > low:
        return met
    level = met + (target - low) / (high - low) * (missed - met)
    return max(met, min(missed - 1, math.floor(level)))


def decide_profile_depth(
    samples: Sequence[LevelSample], fit: LinearFit, slo: float, cap: int = DEFAULT_DEPTH_CAP, headroom: float = 0.0
) -> DepthDecision:
    """The depth off the line (estimator.fit.decide_depth), kept within what the levels measured.

    The line averages every level's noise, so it decides between the deepest level that met the target
    and the shallowest that missed. Outside them a measured level contradicts it: one slow growth
    level can steepen the line until it crosses below an aimed level that then met (bench/ESTIMATOR.md,
    2026-11-27), and a tail that bends up past a flat stretch puts the line's crossing short of the
    bend (2026-11-28). Then the depth is where the straight line between those two levels reaches the
    target (`chord_depth`), or the level that met when nothing deeper missed.
    """
    decision = decide_depth(fit, slo, cap=cap, headroom=headroom)
    if decision.depth is None:
        return decision
    target = slo * (1 - headroom)
    # A level with refused requests (the server holds fewer in flight) is a miss with an endless tail;
    # the line is fitted without it, so left out here too the depth could pass it, up to the cap.
    usable = list(samples)
    met, missed = measured_bracket(usable, target)
    short = decision.depth < met <= cap
    past = missed is not None and missed > 1 and decision.depth >= missed
    if not (short or past):
        return decision
    said = f"{decision.reason} = {decision.depth}"
    if missed is not None and met > 0 and not all(math.isfinite(s.p99) for s in usable if s.concurrency == missed):
        return DepthDecision(
            min(cap, met),
            f"{said}, at or past C={missed}, where requests were refused: the depth is C={met}, the deepest "
            f"level answered within {target:.4g} s",
            bounded=True,
        )
    if missed is not None and met > 0:
        depth = min(cap, chord_depth(usable, target, met, missed))
        return DepthDecision(
            depth,
            f"{said}, outside C={met}..{missed}, measured within and over {target:.4g} s: "
            "the depth is where the line between those two levels reaches it",
            bounded=True,
        )
    if short:
        return DepthDecision(
            met, f"{said}, under C={met}, measured within {target:.4g} s: the depth is that level", bounded=True
        )
    return DepthDecision(
        missed - 1,
        f"{said}, at or past C={missed}, measured over {target:.4g} s: the depth is one under it",
        bounded=True,
    )


async def profile_pool(
    submit: Submit,
    make_query: MakeQuery,
    slo: float,
    options: ProfileOptions = ProfileOptions(),
    *,
    pool: str = "pool",
    stage: str = "profile",
    progress: ProgressHook | None = None,
) -> Profile:
    """Measure growth and aimed levels until one misses, then the settled crossing (module doc), against `slo`."""
    if not (slo > 0 and math.isfinite(slo)):
        raise ValueError(f"the SLO must be a positive number of seconds, got {slo!r}")
    loop = asyncio.get_running_loop()
    started = loop.time()
    o = options
    await warm_up(submit, make_query, o.query_tokens, min(o.warmup_concurrency, o.max_concurrency), o.request_timeout)
    samples: list[LevelSample] = []

    async def measure(concurrency: int) -> LevelSample:
        sample = await measure_level(
            submit, make_query, concurrency, o.query_tokens, o.rounds,
            timeout=o.request_timeout, stage=stage, pool=pool, progress=progress,
        )
        samples.append(sample)
        return sample

    level = 1
    while True:
        sample = await measure(level)
        if not sample.meets(slo) and (len(samples) >= 2 or level >= o.max_concurrency):
            reason = f"p99 {sample.p99:.3f} s > {slo:.4g} s at C={level}"
            break
        if level >= o.max_concurrency:
            reason = f"reached max concurrency {o.max_concurrency} within the SLO"
            break
        level = next_level(samples, slo, o)
    settled = settle_level(samples, slo, o.max_concurrency)
    on_the_line = False
    if settled is not None:
        on_the_line = same_speed((await measure(settled)).p99 / slo)
        reason += f"; the fitted crossing C={settled} measured too"
    narrowed = []
    while not on_the_line and (middle := narrowing_level(samples, slo)) is not None:
        await measure(middle)
        narrowed.append(middle)
    if narrowed:
        reason += f"; the bracket narrowed at C={', '.join(map(str, narrowed))}"
    return Profile(tuple(samples), loop.time() - started, reason, settled)
