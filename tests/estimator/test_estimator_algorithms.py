"""Profiling, stress test, fine-tuning and layout choice against simulated pools.

The simulated pool is a real asyncio single server whose batch service time is known, so
each algorithm's answer can be compared with the analytic optimum of that server.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import numpy as np
import pytest

from estimator.fit import DEFAULT_HEADROOM, LinearFit, decide_depth
from estimator.layouts import choose_layout
from estimator.pipeline import fit_profile
from estimator.profile import profile_pool
from estimator.rounds import LevelSample, Progress, measure_interleaved, measure_level
from estimator.simulated import ServiceTime, SimulatedPool, constant_query
from estimator.stress import fine_tune, monotone_depth, stress_test

# ~2.1 ms per query in batches of 8: about 70 queries fit a 0.15 s SLO.
SERVICE = ServiceTime(per_batch=0.001, per_query=0.002, max_batch_size=8)
SLO = 0.15
TOKENS = 75


def close_to(value: int | None, optimum: int) -> bool:
    """Within 10% (or 3) of the optimum: timer jitter on a shared machine moves the boundary a little."""
    return value is not None and abs(value - optimum) <= max(3, 0.1 * optimum)


async def _with_pool(service: ServiceTime, body):
    pool = SimulatedPool(service)
    try:
        return await body(pool)
    finally:
        await pool.close()


def test_simulated_pool_serves_with_its_known_latency() -> None:
    async def body(pool: SimulatedPool):
        return await measure_level(pool.submit, constant_query, 20, TOKENS, 3)

    sample = asyncio.run(_with_pool(SERVICE, body))
    assert sample.p95 == pytest.approx(SERVICE.expected_p95(20, TOKENS), rel=0.1)
    assert sample.failures == 0


def test_interleaved_levels_take_their_rounds_in_turn_and_each_keeps_its_own_tail() -> None:
    rounds_started: list[int] = []

    async def body(pool: SimulatedPool):
        in_flight = 0

        async def counting_submit(sequences):
            nonlocal in_flight
            if in_flight == 0:  # the first request of a round
                rounds_started.append(0)
            rounds_started[-1] += 1
            in_flight += 1
            try:
                await pool.submit(sequences)
            finally:
                in_flight -= 1

        return await measure_interleaved(counting_submit, constant_query, [20, 5], TOKENS, 3)

    samples = asyncio.run(_with_pool(SERVICE, body))
    assert rounds_started == [20, 5] * 3
    assert [samples[level].rounds for level in (20, 5)] == [3, 3]
    for level in (20, 5):
        assert samples[level].p95 == pytest.approx(SERVICE.expected_p95(level, TOKENS), rel=0.1)
        assert samples[level].concurrency == level and samples[level].failures == 0


def test_warm_up_probe_aims_at_the_slo_less_the_default_headroom() -> None:
    from windve.depths import probe_depth

    async def body(pool: SimulatedPool):
        return await probe_depth("sim", pool.submit, constant_query(TOKENS), SERVICE.max_batch_size, SLO)

    source = asyncio.run(_with_pool(SERVICE, body))
    alpha, beta = source.detail["alpha"], source.detail["beta"]
    assert source.source == "warm-up probe"
    assert source.depth == decide_depth(LinearFit(alpha, beta, math.nan, 2), SLO, headroom=DEFAULT_HEADROOM).depth
    assert close_to(source.depth, SERVICE.optimum_depth(SLO * (1 - DEFAULT_HEADROOM), TOKENS))


def test_warm_up_probe_of_a_pool_too_slow_for_the_slo_still_serves_one_query() -> None:
    from windve.depths import probe_depth

    async def body(pool: SimulatedPool):
        return await probe_depth("sim", pool.submit, constant_query(TOKENS), SERVICE.max_batch_size, 0.001)

    source = asyncio.run(_with_pool(SERVICE, body))
    assert source.depth == 1 and "unusable" in source.detail["reason"]


def test_profile_estimate_is_close_to_the_analytic_optimum() -> None:
    events: list[Progress] = []

    async def body(pool: SimulatedPool):
        return await profile_pool(pool.submit, constant_query, SLO, rounds=3, progress=events.append, pool="sim")

    profile = asyncio.run(_with_pool(SERVICE, body))
    levels = [s.concurrency for s in profile.samples]
    assert levels[:4] == [1, 2, 4, 8] and levels == sorted(set(levels))
    assert all(s.meets(SLO) for s in profile.samples[:-1]) and not profile.samples[-1].meets(SLO)
    assert "> SLO" in profile.stop_reason
    optimum = SERVICE.optimum_depth(SLO, TOKENS)
    # The last level is aimed just past the predicted crossing, not a blind doubling.
    assert levels[-1] < 1.3 * optimum
    fit = fit_profile("sim", profile.samples)
    assert fit.r2 > 0.98
    assert close_to(decide_depth(fit, SLO, cap=256).depth, optimum)
    # One progress event per round, the level's sample on its last round.
    assert len(events) == 3 * len(levels)
    finished = [e.sample for e in events if e.sample is not None]
    assert [s.concurrency for s in finished] == levels and all(e.pool == "sim" for e in events)


def test_profile_stops_at_max_concurrency_when_the_slo_is_never_reached() -> None:
    async def body(pool: SimulatedPool):
        return await profile_pool(pool.submit, constant_query, 5.0, rounds=1, max_concurrency=12)

    profile = asyncio.run(_with_pool(SERVICE, body))
    assert [s.concurrency for s in profile.samples] == [1, 2, 4, 8, 12]
    assert "max concurrency 12" in profile.stop_reason


def test_pool_too_slow_for_one_query_is_unusable() -> None:
    slow = ServiceTime(per_batch=0.08, per_query=0.01, max_batch_size=8)

    async def body(pool: SimulatedPool):
        return await profile_pool(pool.submit, constant_query, 0.05, rounds=2)

    profile = asyncio.run(_with_pool(slow, body))
    assert [s.concurrency for s in profile.samples] == [1, 2]  # two levels: enough to fit, no more
    decision = decide_depth(fit_profile("slow", profile.samples), 0.05)
    assert decision.depth is None and "unusable" in decision.reason


class _Refusing:
    """Refuses (like HTTP 429) any query beyond `limit` in flight: failures reach the tail."""

    def __init__(self, pool: SimulatedPool, limit: int) -> None:
        self.pool, self.limit, self.in_flight = pool, limit, 0

    async def submit(self, sequences: Sequence[np.ndarray]) -> None:
        if self.in_flight + len(sequences) > self.limit:
            raise RuntimeError("HTTP 429: busy")
        self.in_flight += len(sequences)
        try:
            await self.pool.submit(sequences)
        finally:
            self.in_flight -= len(sequences)


def test_refused_requests_count_as_misses_and_stop_the_profile() -> None:
    async def body(pool: SimulatedPool):
        return await profile_pool(_Refusing(pool, 10).submit, constant_query, 1.0, rounds=2)

    profile = asyncio.run(_with_pool(SERVICE, body))
    last = profile.samples[-1]
    assert last.concurrency == 16 and last.failures == 2 * 6 and math.isinf(last.p95)
    assert "429" in (last.first_error or "")
    assert all(s.failures == 0 for s in profile.samples[:-1])


def test_stress_test_finds_the_last_step_within_each_slo() -> None:
    slos = (SLO, SLO / 2)

    async def body(pool: SimulatedPool):
        return await stress_test(pool.submit, constant_query, slos, step=8, rounds=2)

    result = asyncio.run(_with_pool(SERVICE, body))
    levels = [s.concurrency for s in result.samples]
    assert levels == list(range(8, 8 * len(levels) + 1, 8))
    for slo in slos:
        optimum = SERVICE.optimum_depth(slo, TOKENS)
        assert abs(result.depth_for(slo) - (optimum // 8) * 8) <= 8
        assert result.depth_for(slo) % 8 == 0
    assert not result.samples[-1].meets(max(slos))


def test_stress_test_with_step_one_finds_the_optimum() -> None:
    slo = 0.05

    async def body(pool: SimulatedPool):
        return await stress_test(pool.submit, constant_query, [slo], step=1, rounds=2)

    result = asyncio.run(_with_pool(SERVICE, body))
    assert close_to(result.depths[0], SERVICE.optimum_depth(slo, TOKENS))


def test_stress_test_can_sweep_past_a_miss_and_keeps_the_first_miss_depth() -> None:
    slo = 0.05

    async def body(pool: SimulatedPool):
        return await stress_test(pool.submit, constant_query, [slo], step=4, rounds=1, misses_to_stop=3)

    result = asyncio.run(_with_pool(SERVICE, body))
    met = [s.meets(slo) for s in result.samples]
    assert met[-3:] == [False, False, False] and "3 levels in a row missed" in result.stop_reason
    first_miss = met.index(False)
    assert result.depths[0] == (result.samples[first_miss - 1].concurrency if first_miss else 0)


def _levels(tails: list[float]) -> list[LevelSample]:
    return [LevelSample(8 * (i + 1), 75, 3, p95, p95) for i, p95 in enumerate(tails)]


def test_monotone_depth_outvotes_one_noisy_level_that_a_first_miss_sweep_stops_on() -> None:
    samples = _levels([0.1, 0.2, 0.55, 0.3, 0.4, 0.45, 0.6, 0.7])  # 0.55 at C=24 is noise
    assert monotone_depth(samples, 0.5) == 48
    assert monotone_depth(samples, 0.05) == 0
    assert monotone_depth(_levels([0.1, 0.2, 0.3]), 0.5) == 24


def test_monotone_depth_counts_failed_levels_as_misses() -> None:
    assert monotone_depth(_levels([0.1, 0.2, math.inf, math.inf]), 0.5) == 16
    assert monotone_depth(_levels([math.inf]), 0.5) == 0
    assert monotone_depth([], 0.5) == 0


def test_fine_tune_moves_both_pools_to_their_optima() -> None:
    fast = ServiceTime(per_batch=0.001, per_query=0.0012, max_batch_size=16)
    opt_fast, opt_slow = fast.optimum_depth(SLO, TOKENS), SERVICE.optimum_depth(SLO, TOKENS)

    async def body():
        a, b = SimulatedPool(fast), SimulatedPool(SERVICE)
        try:
            return await fine_tune(
                {"accelerator": a.submit, "cpu": b.submit},
                constant_query,
                SLO,
                {"accelerator": opt_fast - 3, "cpu": opt_slow + 3},
                rounds=2,
                max_steps=8,
            )
        finally:
            await a.close()
            await b.close()

    result = asyncio.run(body())
    assert result.start == {"accelerator": opt_fast - 3, "cpu": opt_slow + 3}
    assert abs(result.depths["accelerator"] - opt_fast) <= 2
    assert abs(result.depths["cpu"] - opt_slow) <= 2
    # Both pools were loaded together in every trial.
    assert all(set(trial.p95) == {"accelerator", "cpu"} for trial in result.trials)


def test_fine_tune_moves_a_bounded_number_of_steps_and_leaves_unusable_pools_idle() -> None:
    optimum = SERVICE.optimum_depth(SLO, TOKENS)

    async def body(pool: SimulatedPool):
        return await fine_tune(
            {"cpu": pool.submit, "dead": pool.submit}, constant_query, SLO, {"cpu": optimum - 10, "dead": None},
            rounds=1, max_steps=2,
        )

    result = asyncio.run(_with_pool(SERVICE, body))
    assert result.depths == {"cpu": optimum - 8, "dead": 0}
    assert all(trial.depths["dead"] == 0 and "dead" not in trial.p95 for trial in result.trials)
    assert result.confirmed


class _Candidate:
    def __init__(self, name: str, service: ServiceTime | None) -> None:
        self.name, self.service = name, service


def test_layout_choice_keeps_the_deepest_and_survives_a_broken_candidate() -> None:
    candidates = [
        _Candidate("per-node", SERVICE),
        _Candidate("broken", None),
        _Candidate("split", ServiceTime(per_batch=0.001, per_query=0.0012, max_batch_size=16)),
        _Candidate("tp", ServiceTime(per_batch=0.001, per_query=0.004, max_batch_size=8)),
    ]

    async def evaluate(candidate: _Candidate) -> int | None:
        if candidate.service is None:
            raise OSError("cannot pin to cores 64-127")

        async def body(pool: SimulatedPool):
            profile = await profile_pool(pool.submit, constant_query, SLO, rounds=2)
            return decide_depth(fit_profile(candidate.name, profile.samples), SLO).depth

        return await _with_pool(candidate.service, body)

    choice = asyncio.run(choose_layout(candidates, evaluate))
    assert choice.best is candidates[2]
    trials = {t.name: t for t in choice.trials}
    assert "cannot pin" in (trials["broken"].error or "") and trials["broken"].depth is None
    assert trials["split"].depth > trials["per-node"].depth > trials["tp"].depth


def test_layout_choice_breaks_ties_by_order() -> None:
    async def evaluate(candidate: _Candidate) -> int | None:
        return 10

    candidates = [_Candidate("a", None), _Candidate("b", None)]
    assert asyncio.run(choose_layout(candidates, evaluate)).best is candidates[0]
