"""The stress-test baseline: raise C by a fixed step until the tail passes the SLO.

The depth is the last level that met the SLO (the paper's baseline, step 8). Step 1 finds the true
optimum, at a cost that grows with the square of the depth. One noisy level near the boundary can stop
a sweep early; for a reference optimum, sweep on past a few misses and read the depth off a monotone
(isotonic) fit of all levels instead (`monotone_depth`). `windve calibrate --stress-test`, a check of
its estimate, does that with two misses in a row.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.isotonic import IsotonicRegression

from estimator.profile import ProfileOptions
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_level, warm_up

DEFAULT_STEP = 8  # the paper's stress-test baseline: C raised by 8 until the SLO breaks


@dataclass(frozen=True)
class StressResult:
    step: int
    slos: tuple[float, ...]
    depths: tuple[int, ...]  # per SLO, aligned with `slos`; 0 = even the first level missed
    seconds: float
    samples: tuple[LevelSample, ...]
    stop_reason: str

    def depth_for(self, slo: float) -> int:
        return self.depths[self.slos.index(slo)]


def _last_meeting(samples: Sequence[LevelSample], slo: float) -> int:
    """The depth a sweep finds for one SLO: the level before its first miss."""
    depth = 0
    for sample in samples:
        if not sample.meets(slo):
            break
        depth = sample.concurrency
    return depth


def monotone_depth(samples: Sequence[LevelSample], slo: float) -> int:
    """The largest level whose tail meets `slo` on the best non-decreasing fit of p99 over C.

    Tail latency cannot fall as concurrency grows, so a level that misses below levels that meet (or
    meets above levels that miss) is noise; the isotonic fit pools such levels with their neighbours
    instead of letting one of them decide. A failed level counts as twice the larger of the SLO and
    the worst finite tail. 0 when no level meets.
    """
    if not samples:
        return 0
    failed = 2 * max([slo] + [s.p99 for s in samples if math.isfinite(s.p99)])
    levels = np.array([s.concurrency for s in samples], dtype=float)
    tails = np.array([s.p99 if math.isfinite(s.p99) else failed for s in samples])
    fitted = IsotonicRegression(increasing=True).fit_transform(levels, tails)
    meeting = levels[fitted <= slo]
    return int(meeting.max()) if meeting.size else 0


async def stress_test(
    submit: Submit,
    make_query: MakeQuery,
    slos: Sequence[float],
    options: ProfileOptions = ProfileOptions(),
    *,
    step: int = DEFAULT_STEP,
    start: int | None = None,
    headroom: float = 0.0,
    misses_to_stop: int = 1,
    monotone: bool = False,
    pool: str = "pool",
    progress: ProgressHook | None = None,
) -> StressResult:
    """C = start (default: step), start+step, ... until p99 passes the largest SLO; one sweep serves all.

    Levels are measured as `options` says (query length, rounds, timeout, up to `max_concurrency`).
    A level meets an SLO T when its p99 <= T*(1 - headroom) (headroom 0: the plain baseline). The
    sweep stops after `misses_to_stop` levels in a row miss (1: the paper's baseline). `depths` is
    the level before the first miss, so a longer sweep only adds samples; with `monotone`, it is
    read off every level swept (`monotone_depth`), so that a noisy level is outvoted.
    """
    if step < 1 or misses_to_stop < 1 or not slos:
        raise ValueError("step and misses_to_stop must be >= 1 and at least one SLO is needed")
    o = options
    loop = asyncio.get_running_loop()
    started = loop.time()
    await warm_up(submit, make_query, o.query_tokens, min(o.warmup_concurrency, o.max_concurrency), o.request_timeout)
    keep = 1 - headroom
    loosest = max(slos) * keep
    samples: list[LevelSample] = []
    concurrency = step if start is None else start
    reason = f"reached max concurrency {o.max_concurrency} within the SLO"
    misses = 0
    while concurrency <= o.max_concurrency:
        sample = await measure_level(
            submit, make_query, concurrency, o.query_tokens, o.rounds,
            timeout=o.request_timeout, stage="stress", pool=pool, progress=progress,
        )
        samples.append(sample)
        misses = 0 if sample.meets(loosest) else misses + 1
        if misses >= misses_to_stop:
            reason = f"p99 {sample.p99:.3f} s > target {loosest:g} s at C={concurrency}"
            if misses_to_stop > 1:
                reason += f" ({misses} levels in a row missed)"
            break
        concurrency += step
    return StressResult(
        step=step,
        slos=tuple(slos),
        depths=tuple((monotone_depth if monotone else _last_meeting)(samples, slo * keep) for slo in slos),
        seconds=loop.time() - started,
        samples=tuple(samples),
        stop_reason=reason,
    )
