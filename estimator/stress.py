"""The stress-test baseline and fine-tuning around the estimate.

Stress test (what the paper compares against): raise C by a fixed step until the tail
passes the SLO; the depth is the last level that met it. Step 1 finds the true optimum,
at a cost that grows with the square of the depth. One noisy level near the boundary can
stop a sweep early; for a reference optimum, sweep on past a few misses and read the depth
off a monotone (isotonic) fit of all levels instead (`monotone_depth`).

Fine-tuning: with every pool loaded together at its estimated depth (so that pools that
share host cores, memory bandwidth or the service process slow each other as they will in
service), check C and C+1 per pool and move the depth: down while C misses, up while C+1
still meets, a bounded number of steps.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from sklearn.isotonic import IsotonicRegression

from estimator.fit import DEFAULT_DEPTH_CAP
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit, measure_joint, measure_level, warm_up

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


@dataclass(frozen=True)
class FineTuneTrial:
    depths: dict[str, int]
    p95: dict[str, float]


@dataclass(frozen=True)
class FineTuneResult:
    slo: float
    start: dict[str, int]
    depths: dict[str, int]  # the last depth per pool seen to meet the SLO with all pools loaded
    seconds: float
    confirmed: bool  # a final round with every pool at its depth met the SLO for all
    trials: tuple[FineTuneTrial, ...] = field(default=())


def _last_meeting(samples: Sequence[LevelSample], slo: float) -> int:
    """Depth a sweep finds for one SLO: the level before its first miss."""
    depth = 0
    for sample in samples:
        if not sample.meets(slo):
            break
        depth = sample.concurrency
    return depth


def monotone_depth(samples: Sequence[LevelSample], slo: float) -> int:
    """The largest level whose tail meets `slo` on the best non-decreasing fit of p95 over C.

    Tail latency cannot fall as concurrency grows, so a level that misses below levels that
    meet (or meets above levels that miss) is noise; the isotonic fit pools such levels with
    their neighbours instead of letting one of them decide. A failed level counts as twice
    the larger of the SLO and the worst finite tail. 0 when no level meets.
    """
    if not samples:
        return 0
    failed = 2 * max([slo] + [s.p95 for s in samples if math.isfinite(s.p95)])
    levels = np.array([s.concurrency for s in samples], dtype=float)
    tails = np.array([s.p95 if math.isfinite(s.p95) else failed for s in samples])
    fitted = IsotonicRegression(increasing=True).fit_transform(levels, tails)
    meeting = levels[fitted <= slo]
    return int(meeting.max()) if meeting.size else 0


async def stress_test(
    submit: Submit,
    make_query: MakeQuery,
    slos: Sequence[float],
    *,
    step: int = DEFAULT_STEP,
    query_tokens: int = 75,
    rounds: int = 5,
    max_concurrency: int = DEFAULT_DEPTH_CAP,
    start: int | None = None,
    warmup_concurrency: int = 4,
    request_timeout: float | None = None,
    headroom: float = 0.0,
    misses_to_stop: int = 1,
    pool: str = "pool",
    progress: ProgressHook | None = None,
) -> StressResult:
    """C = start, start+step, ... until p95 passes the largest SLO; one sweep serves all SLOs.

    A level meets an SLO T when its p95 <= T*(1 - headroom) (headroom 0: the plain baseline).
    The sweep stops after `misses_to_stop` levels in a row miss (1: the paper's baseline);
    `depths` is still the level before the first miss, so a longer sweep only adds samples.
    """
    if step < 1 or rounds < 1 or misses_to_stop < 1 or not slos:
        raise ValueError("step, rounds and misses_to_stop must be >= 1 and at least one SLO is needed")
    started = time.perf_counter()
    await warm_up(submit, make_query, query_tokens, min(warmup_concurrency, max_concurrency), request_timeout)
    keep = 1 - headroom
    loosest = max(slos) * keep
    samples: list[LevelSample] = []
    concurrency = step if start is None else start
    reason = f"reached max concurrency {max_concurrency} within the SLO"
    misses = 0
    while concurrency <= max_concurrency:
        sample = await measure_level(
            submit,
            make_query,
            concurrency,
            query_tokens,
            rounds,
            timeout=request_timeout,
            stage="stress",
            pool=pool,
            progress=progress,
        )
        samples.append(sample)
        misses = 0 if sample.meets(loosest) else misses + 1
        if misses >= misses_to_stop:
            reason = f"p95 {sample.p95:.3f} s > target {loosest:g} s at C={concurrency}"
            if misses_to_stop > 1:
                reason += f" ({misses} levels in a row missed)"
            break
        concurrency += step
    return StressResult(
        step=step,
        slos=tuple(slos),
        depths=tuple(_last_meeting(samples, slo * keep) for slo in slos),
        seconds=time.perf_counter() - started,
        samples=tuple(samples),
        stop_reason=reason,
    )


class _JointChecker:
    """Runs all pools together at given depths and remembers every trial."""

    def __init__(
        self,
        submits: Mapping[str, Submit],
        make_query: MakeQuery,
        tokens: int,
        rounds: int,
        timeout: float | None,
        progress: ProgressHook | None,
    ) -> None:
        self._submits = submits
        self._make_query = make_query
        self._tokens = tokens
        self._rounds = rounds
        self._timeout = timeout
        self._progress = progress
        self.trials: list[FineTuneTrial] = []

    async def __call__(self, depths: Mapping[str, int]) -> dict[str, float]:
        loads = {name: (self._submits[name], depth) for name, depth in depths.items()}
        samples = await measure_joint(
            loads,
            self._make_query,
            self._tokens,
            self._rounds,
            timeout=self._timeout,
            stage="fine-tune",
            progress=self._progress,
        )
        p95 = {name: sample.p95 for name, sample in samples.items()}
        self.trials.append(FineTuneTrial(depths=dict(depths), p95=p95))
        return p95

    def known(self, depths: Mapping[str, int]) -> dict[str, float] | None:
        """The last trial at exactly these depths, to avoid measuring it twice in a row."""
        last = self.trials[-1] if self.trials else None
        return last.p95 if last is not None and last.depths == dict(depths) else None


async def _adjust_one(
    name: str, depths: Mapping[str, int], check: _JointChecker, slo: float, max_steps: int, cap: int
) -> int:
    """Down while C misses, then up while C+1 meets; 0 when even one query misses."""
    depth = depths[name]
    steps = 0
    met = (check.known(depths) or await check(depths))[name] <= slo
    while not met and depth > 1 and steps < max_steps:
        depth -= 1
        steps += 1
        met = (await check({**depths, name: depth}))[name] <= slo
    if not met:
        return 0 if depth == 1 else depth  # out of steps: left unconfirmed
    while steps < max_steps and depth < cap:
        steps += 1
        if (await check({**depths, name: depth + 1}))[name] > slo:
            break
        depth += 1
    return depth


async def fine_tune(
    submits: Mapping[str, Submit],
    make_query: MakeQuery,
    slo: float,
    estimates: Mapping[str, int | None],
    *,
    query_tokens: int = 75,
    rounds: int = 5,
    max_steps: int = 8,
    max_concurrency: int = DEFAULT_DEPTH_CAP,
    request_timeout: float | None = None,
    headroom: float = 0.0,
    progress: ProgressHook | None = None,
) -> FineTuneResult:
    """Adjust each usable pool's depth around its estimate with all pools loaded together.

    Pools without a usable estimate (None or 0) stay unloaded at depth 0. Each pool moves at
    most `max_steps` times; the others hold their current depths while it moves. A pool
    meets the SLO when its p95 <= slo*(1 - headroom).
    """
    target = slo * (1 - headroom)
    started = time.perf_counter()
    start = {name: max(0, estimates.get(name) or 0) for name in submits}
    depths = {name: min(depth, max_concurrency) for name, depth in start.items()}
    check = _JointChecker(submits, make_query, query_tokens, rounds, request_timeout, progress)
    for name in [name for name, depth in depths.items() if depth > 0]:
        depths[name] = await _adjust_one(name, depths, check, target, max_steps, max_concurrency)
    confirmed = False
    if any(depths.values()):
        p95 = check.known(depths) or await check(depths)
        confirmed = all(value <= target for value in p95.values())
    return FineTuneResult(
        slo=slo,
        start=start,
        depths=depths,
        seconds=time.perf_counter() - started,
        confirmed=confirmed,
        trials=tuple(check.trials),
    )
