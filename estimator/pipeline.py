"""Calibrate a set of pools end to end: profile, fit, depths, and the optional extras.

Per pool, one at a time (the others idle): profile at the configured query length against
the loosest SLO (one profile serves every SLO), fit, read off a depth per SLO; optionally
a length sweep for a token budget and the stress-test baseline. Then, optionally, fine-tune
per SLO with all pools loaded together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from estimator.calibration import Calibration, ModelIdentity, PoolCalibration, SloDepth
from estimator.fit import (
    DEFAULT_DEPTH_CAP,
    DEFAULT_HEADROOM,
    LengthFit,
    LinearFit,
    decide_depth,
    fit_length_aware,
    token_budget_for_slo,
)
from estimator.profile import Profile, finite_samples, fit_samples, profile_pool
from estimator.recheck import recheck_speed
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit
from estimator.stress import FineTuneResult, StressResult, fine_tune, stress_test


class CalibrationRunError(RuntimeError):
    """Profiling could not produce a fit (e.g. every request failed); says which pool and why."""


@dataclass(frozen=True)
class CalibrationOptions:
    slos: tuple[float, ...] = (1.0,)
    query_tokens: int = 75
    rounds: int = 5
    # Rounds of the levels far below the SLO (estimator.profile); None or `rounds`: no scouting.
    scout_rounds: int | None = 1
    # Also caps every depth: nothing beyond it was measured. As high as the warm-up probe's cap, so
    # that calibrating never makes a fast pool (an accelerator's) shallower than serving without it.
    max_concurrency: int = DEFAULT_DEPTH_CAP
    stress_step: int | None = None  # None: no stress test
    fine_tune: bool = False
    lengths: tuple[int, ...] = ()  # extra query lengths for the length-aware fit
    request_timeout: float | None = None
    fine_tune_steps: int = 8
    recheck: bool = False  # measure a profiled level again at the end (estimator.recheck)
    settle: bool = True  # measure the fitted crossing too (estimator.profile.settle_level)
    # Scout the aimed levels too (cheaper, less steady); None: when the crossing is shallow, where
    # they are most of the cost and bought no accuracy (estimator.profile).
    scout_aims: bool | None = None
    headroom: float = DEFAULT_HEADROOM  # every method aims at T*(1 - headroom)

    @property
    def scouting_rounds(self) -> int:
        """The rounds scouted levels get. The length-aware fit separates per-token, per-query and
        constant costs from how each length's latency grows with C, so with `lengths` every level
        is measured in full: scouted levels once left it without a per-query cost, and the token
        budget then missed the SLO on mixes of short and long queries (bench/estimator.py)."""
        if self.lengths or self.scout_rounds is None:
            return self.rounds
        return min(self.scout_rounds, self.rounds)


def fit_profile(pool: str, samples: tuple[LevelSample, ...] | list[LevelSample]) -> LinearFit:
    fit = fit_samples(samples)
    if fit is None:
        errors = [sample.first_error for sample in samples if sample.first_error]
        why = f"; first error: {errors[0]}" if errors else ""
        raise CalibrationRunError(
            f"pool {pool}: fewer than two concurrency levels had an answered tail, nothing to fit{why}"
        )
    return fit


def _fit_lengths(samples: list[LevelSample]) -> LengthFit | None:
    usable = finite_samples(samples)
    if len({s.tokens for s in usable}) < 2:
        return None
    return fit_length_aware(
        [s.concurrency for s in usable], [s.tokens for s in usable], [s.p95 for s in usable],
        weights=[s.rounds for s in usable],
    )


async def profile_with_options(
    options: CalibrationOptions,
    submit: Submit,
    make_query: MakeQuery,
    slo: float,
    *,
    pool: str,
    stage: str,
    tokens: int | None = None,
    progress: ProgressHook | None = None,
) -> Profile:
    """`profile_pool` as `windve calibrate` runs it: its rounds, scouting, settling, cap and timeout."""
    return await profile_pool(
        submit,
        make_query,
        slo,
        query_tokens=options.query_tokens if tokens is None else tokens,
        rounds=options.rounds,
        scout_rounds=options.scouting_rounds,
        max_concurrency=options.max_concurrency,
        request_timeout=options.request_timeout,
        settle=options.settle,
        scout_aims=options.scout_aims,
        pool=pool,
        stage=stage,
        progress=progress,
    )


class _PoolCalibrator:
    def __init__(self, options: CalibrationOptions, make_query: MakeQuery, progress: ProgressHook | None) -> None:
        self.options = options
        self.make_query = make_query
        self.progress = progress

    async def profile(self, name: str, submit: Submit, tokens: int, stage: str) -> Profile:
        return await profile_with_options(
            self.options, submit, self.make_query, max(self.options.slos),
            pool=name, stage=stage, tokens=tokens, progress=self.progress,
        )

    async def calibrate(self, name: str, submit: Submit) -> PoolCalibration:
        o = self.options
        main = await self.profile(name, submit, o.query_tokens, "profile")
        fit = fit_profile(name, main.samples)
        length_samples: list[LevelSample] = []
        length_seconds = 0.0
        for tokens in (t for t in o.lengths if t != o.query_tokens):
            extra = await self.profile(name, submit, tokens, "lengths")
            length_samples.extend(extra.samples)
            length_seconds += extra.seconds
        length_fit = _fit_lengths(list(main.samples) + length_samples) if length_samples else None
        stress = await self.stress(name, submit) if o.stress_step else None
        speed = (
            await recheck_speed(
                submit, self.make_query, main.samples, main.settled,
                timeout=o.request_timeout, pool=name, progress=self.progress,
            )
            if o.recheck
            else None
        )
        return PoolCalibration(
            samples=main.samples,
            fit=fit,
            profile_seconds=main.seconds,
            depths=tuple(self.depth(slo, fit, length_fit, stress) for slo in o.slos),
            profile_stop=main.stop_reason,
            length_fit=length_fit,
            length_samples=tuple(length_samples),
            length_seconds=length_seconds,
            stress=stress,
            recheck=speed,
            settled=main.settled,
        )

    async def stress(self, name: str, submit: Submit) -> StressResult:
        o = self.options
        assert o.stress_step is not None
        return await stress_test(
            submit,
            self.make_query,
            o.slos,
            step=o.stress_step,
            query_tokens=o.query_tokens,
            rounds=o.rounds,
            max_concurrency=o.max_concurrency,
            request_timeout=o.request_timeout,
            headroom=o.headroom,
            pool=name,
            progress=self.progress,
        )

    def depth(self, slo: float, fit: LinearFit, length_fit: LengthFit | None, stress: StressResult | None) -> SloDepth:
        headroom = self.options.headroom
        decision = decide_depth(fit, slo, cap=self.options.max_concurrency, headroom=headroom)
        return SloDepth(
            slo=slo,
            estimate=decision.depth,
            reason=decision.reason,
            capped=decision.capped,
            token_budget=token_budget_for_slo(length_fit, slo, headroom=headroom) if length_fit else None,
            stress_test=stress.depth_for(slo) if stress is not None else None,
        )


async def calibrate_pools(
    pools: Mapping[str, Submit],
    make_query: MakeQuery,
    options: CalibrationOptions,
    *,
    model_name: str,
    model_revision: str,
    hardware_fingerprint: str,
    progress: ProgressHook | None = None,
) -> Calibration:
    if not pools:
        raise ValueError("no pools to calibrate")
    calibrator = _PoolCalibrator(options, make_query, progress)
    results = {name: await calibrator.calibrate(name, submit) for name, submit in pools.items()}
    tuned: list[FineTuneResult] = []
    if options.fine_tune:
        for slo in options.slos:
            outcome = await fine_tune(
                pools,
                make_query,
                slo,
                {name: result.at(slo).estimate for name, result in results.items()},
                query_tokens=options.query_tokens,
                rounds=options.rounds,
                max_steps=options.fine_tune_steps,
                max_concurrency=options.max_concurrency,
                request_timeout=options.request_timeout,
                headroom=options.headroom,
                progress=progress,
            )
            tuned.append(outcome)
            results = {
                name: _with_fine_tuned(result, slo, outcome.depths.get(name)) for name, result in results.items()
            }
    return Calibration(
        model=ModelIdentity(model_name, model_revision),
        hardware_fingerprint=hardware_fingerprint,
        slos=tuple(options.slos),
        query_tokens=options.query_tokens,
        rounds=options.rounds,
        scout_rounds=options.scouting_rounds,
        headroom=options.headroom,
        pools=results,
        fine_tune=tuple(tuned),
    )


def _with_fine_tuned(pool: PoolCalibration, slo: float, depth: int | None) -> PoolCalibration:
    depths = tuple(
        dataclasses.replace(entry, fine_tuned=depth) if entry.slo == slo else entry for entry in pool.depths
    )
    return dataclasses.replace(pool, depths=depths)
