"""Calibrate pools end to end: profile, fit, depths, and the optional extras.

Per pool, one at a time (the others idle): profile at the configured query length against the
loosest SLO (one profile serves every SLO), fit, read off a depth per SLO; optionally a profile at
further query lengths for a token budget, the stress-test baseline, and a speed recheck.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from estimator.calibration import Calibration, ModelIdentity, PoolCalibration, SloDepth
from estimator.fit import DEFAULT_HEADROOM, LengthFit, LinearFit, fit_length_aware, token_budget_for_slo
from estimator.profile import ProfileOptions, decide_profile_depth, finite_samples, fit_samples, profile_pool
from estimator.recheck import recheck_speed
from estimator.rounds import LevelSample, MakeQuery, ProgressHook, Submit
from estimator.stress import StressResult, stress_test

CHECK_MISSES = 2  # `--stress-test` sweeps until this many levels in a row miss


class CalibrationRunError(RuntimeError):
    """Profiling could not produce a fit (e.g. every request failed); says which pool and why."""


@dataclass(frozen=True)
class CalibrationOptions:
    slos: tuple[float, ...] = (1.0,)
    profile: ProfileOptions = ProfileOptions()
    stress_step: int | None = None  # None: no stress test
    lengths: tuple[int, ...] = ()  # further query lengths for the length-aware fit
    recheck: bool = False  # measure the reference level again at the end (estimator.recheck)
    headroom: float = DEFAULT_HEADROOM  # every depth aims at T*(1 - headroom)


def fit_profile(pool: str, samples: tuple[LevelSample, ...] | list[LevelSample]) -> LinearFit:
    """The profile's fit; CalibrationRunError, with the first error seen, when nothing can be fitted."""
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
    return fit_length_aware([s.concurrency for s in usable], [s.tokens for s in usable], [s.p99 for s in usable])


def _depth(options: CalibrationOptions, slo: float, samples: Sequence[LevelSample], fit: LinearFit,
           lengths: LengthFit | None, stress: StressResult | None) -> SloDepth:
    decision = decide_profile_depth(samples, fit, slo, cap=options.profile.max_concurrency, headroom=options.headroom)
    return SloDepth(
        slo=slo,
        estimate=decision.depth,
        reason=decision.reason,
        capped=decision.capped,
        bounded=decision.bounded,
        token_budget=token_budget_for_slo(lengths, slo, headroom=options.headroom) if lengths else None,
        stress_test=stress.depth_for(slo) if stress is not None else None,
    )


async def calibrate_pool(
    name: str, submit: Submit, make_query: MakeQuery, options: CalibrationOptions, progress: ProgressHook | None = None
) -> PoolCalibration:
    """Profile, fit and read off the depths of one pool, with the extras `options` ask for."""
    # The levels aim at the tail the loosest SLO's depth is read at, so that the settled crossing is
    # measured where that depth lies, not a headroom above it.
    target, o = max(options.slos) * (1 - options.headroom), options.profile
    main = await profile_pool(submit, make_query, target, o, pool=name, progress=progress)
    fit = fit_profile(name, main.samples)
    length_samples: list[LevelSample] = []
    length_seconds = 0.0
    for tokens in (t for t in options.lengths if t != o.query_tokens):
        extra = await profile_pool(
            submit, make_query, target, dataclasses.replace(o, query_tokens=tokens), pool=name, stage="lengths",
            progress=progress,
        )
        length_samples.extend(extra.samples)
        length_seconds += extra.seconds
    length_fit = _fit_lengths(list(main.samples) + length_samples) if length_samples else None
    stress = None
    if options.stress_step:
        # Two misses in a row stop it and every level swept votes: a check of the estimate that one
        # slow level can stop (the paper's rule) once read 96 where the pool held 194.
        stress = await stress_test(
            submit, make_query, options.slos, o, step=options.stress_step, headroom=options.headroom,
            misses_to_stop=CHECK_MISSES, monotone=True, pool=name, progress=progress,
        )
    speed = None
    if options.recheck:
        speed = await recheck_speed(
            submit, make_query, main.samples, main.settled, timeout=o.request_timeout, pool=name, progress=progress
        )
    return PoolCalibration(
        samples=main.samples,
        fit=fit,
        profile_seconds=main.seconds,
        depths=tuple(_depth(options, slo, main.samples, fit, length_fit, stress) for slo in options.slos),
        profile_stop=main.stop_reason,
        length_fit=length_fit,
        length_samples=tuple(length_samples),
        length_seconds=length_seconds,
        stress=stress,
        recheck=speed,
        settled=main.settled,
    )


def calibration_of(
    pools: Mapping[str, PoolCalibration],
    options: CalibrationOptions,
    *,
    model_name: str,
    model_revision: str,
    hardware_fingerprint: str,
) -> Calibration:
    """The calibration file's content for pools calibrated with `options`."""
    if not pools:
        raise ValueError("no pools were calibrated")
    return Calibration(
        model=ModelIdentity(model_name, model_revision),
        hardware_fingerprint=hardware_fingerprint,
        slos=tuple(options.slos),
        query_tokens=options.profile.query_tokens,
        rounds=options.profile.rounds,
        headroom=options.headroom,
        pools=dict(pools),
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
    """`calibrate_pool` for each pool in turn (the others idle), as one calibration."""
    results = {name: await calibrate_pool(name, submit, make_query, options, progress)
               for name, submit in pools.items()}
    return calibration_of(
        results, options, model_name=model_name, model_revision=model_revision,
        hardware_fingerprint=hardware_fingerprint,
    )
