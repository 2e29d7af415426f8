"""The speed recheck: a profiled level measured again tells whether the machine slowed."""

from __future__ import annotations

import math

import pytest

from estimator.calibration import Calibration
from estimator.pipeline import CalibrationOptions, calibrate_pools
from estimator.profile import ProfileOptions
from estimator.recheck import SpeedCheck, crossing_check, reference_level
from estimator.report import format_report
from estimator.rounds import LevelSample, Progress
from estimator.simulated import ServiceTime, SimulatedPool, constant_query, run_virtual

FAST = ServiceTime(per_batch=0.001, per_query=0.002, max_batch_size=8)
SLOWER = ServiceTime(per_batch=0.0013, per_query=0.0026, max_batch_size=8)  # 30% slower, like this machine's slow state


def _level(concurrency: int, p99: float) -> LevelSample:
    return LevelSample(concurrency, 75, 3, p99, p99)


@pytest.mark.parametrize(("again", "steady"), [(0.2, True), (0.215, True), (0.185, True), (0.25, False), (0.17, False)])
def test_a_level_within_ten_percent_of_its_profile_tail_counts_as_the_same_speed(again: float, steady: bool) -> None:
    check = SpeedCheck(32, 0.2, again)
    assert check.ratio == pytest.approx(again / 0.2)
    assert check.steady is steady
    assert ("--headroom 0.2" in check.describe()) is not steady


def test_the_reference_is_the_settled_crossing_else_the_deepest_answered_level() -> None:
    samples = [_level(1, 0.02), _level(32, 0.3), _level(64, 0.55), _level(96, math.inf), _level(48, 0.45)]
    assert reference_level(samples, settled=48) is samples[-1]
    assert reference_level(samples).concurrency == 64  # not the level that failed
    assert reference_level([_level(8, math.inf)]) is None


def _calibrate(slow_down_at_stress: bool) -> Calibration:
    options = CalibrationOptions(slos=(0.15,), profile=ProfileOptions(rounds=3), stress_step=16, recheck=True)

    async def body() -> Calibration:
        pool = SimulatedPool(FAST)

        def progress(event: Progress) -> None:
            if slow_down_at_stress and event.stage == "stress":
                pool.service = SLOWER  # the machine slows after the profile

        try:
            return await calibrate_pools(
                {"cpu": pool.submit}, constant_query, options,
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1", progress=progress,
            )
        finally:
            await pool.close()

    return run_virtual(body())


def test_recheck_of_a_steady_pool_finds_the_same_speed() -> None:
    pool = _calibrate(slow_down_at_stress=False).pools["cpu"]
    # The settled crossing measured again, with the same tail but for the virtual clock's rounding.
    assert pool.recheck is not None and pool.recheck.concurrency == pool.settled, pool.recheck
    assert pool.recheck.profile_p99 == pool.samples[-1].p99
    assert pool.recheck.recheck_p99 == pytest.approx(pool.samples[-1].p99, rel=1e-12)
    assert pool.recheck.steady


def test_recheck_finds_a_pool_that_slowed_after_its_profile() -> None:
    check = _calibrate(slow_down_at_stress=True).pools["cpu"].recheck
    assert check is not None and not check.steady, check
    assert check.ratio == pytest.approx(1.3, rel=1e-9)


def test_no_recheck_unless_asked() -> None:
    async def body() -> Calibration:
        pool = SimulatedPool(FAST)
        try:
            return await calibrate_pools(
                {"cpu": pool.submit}, constant_query, CalibrationOptions(slos=(0.15,)),
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1",
            )
        finally:
            await pool.close()

    assert run_virtual(body()).pools["cpu"].recheck is None


@pytest.mark.parametrize(("again", "warned"), [(0.26, True), (0.205, False)])
def test_serve_warns_when_its_calibration_saw_the_machine_change_speed(again: float, warned: bool, caplog) -> None:
    from estimator.calibration import ModelIdentity, PoolCalibration, SloDepth
    from estimator.fit import LinearFit
    from windve.depths import depth_from_calibration

    pool = PoolCalibration(
        samples=(_level(1, 0.01), _level(32, 0.2)),
        fit=LinearFit(0.006, 0.005, 0.99, 2),
        profile_seconds=1.0,
        depths=(SloDepth(0.3, 48, "floor(...)"),),
        recheck=SpeedCheck(32, 0.2, again),
    )
    calibration = Calibration(ModelIdentity("m", "r"), "hw", (0.3,), 75, 3, {"cpu": pool}, headroom=0.1)
    with caplog.at_level("WARNING", logger="windve.depths"):
        source = depth_from_calibration(calibration, "cpu", 0.3, "calibration (file)")
    assert source is not None and source.depth == 48
    assert ("1.30x its profile tail" in caplog.text) is warned


@pytest.mark.parametrize(("slo", "warned"), [(1.0, True), (0.2, False)])
def test_serve_warns_when_a_depth_at_another_slo_lies_past_every_level_measured(slo, warned, caplog) -> None:
    from estimator.calibration import ModelIdentity, PoolCalibration, SloDepth
    from estimator.fit import LinearFit
    from windve.depths import depth_from_calibration

    pool = PoolCalibration(
        samples=(_level(1, 0.01), _level(8, 0.05), _level(32, 0.2)),
        fit=LinearFit(0.006, 0.005, 0.99, 3),
        profile_seconds=1.0,
        depths=(SloDepth(0.25, 40, "floor(...)"),),
    )
    calibration = Calibration(ModelIdentity("m", "r"), "hw", (0.25,), 75, 3, {"cpu": pool}, headroom=0.1)
    with caplog.at_level("WARNING", logger="windve.depths"):
        source = depth_from_calibration(calibration, "cpu", slo, "calibration (file)")
    assert source is not None and (source.depth > 32) is warned, source
    assert ("past the deepest level it measured (32; calibrated at 0.25 s)" in caplog.text) is warned
    assert ("was not profiled" in source.detail["reason"]) is warned


# Batches of two keep the tail's steps small (~3 % of the SLO), so the settled level lands on it.
FINE = ServiceTime(per_batch=0.004, per_query=0.008, max_batch_size=2)
FINE_SLOWER = ServiceTime(per_batch=0.0052, per_query=0.0104, max_batch_size=2)
FINE_SLO = 0.6


@pytest.mark.parametrize(("p99", "steady"), [(0.15, True), (0.162, True), (0.138, True), (0.17, False), (0.13, False)])
def test_a_settled_crossing_within_ten_percent_of_the_slo_counts_as_steady(p99: float, steady: bool) -> None:
    samples = [_level(1, 0.01), _level(64, 0.2), _level(48, p99)]
    check = crossing_check(samples, 48, 0.15)
    assert check is not None and check.p99 == p99
    assert check.steady is steady and check.ratio == pytest.approx(p99 / 0.15)
    assert check.slower is (not steady and p99 > 0.15)
    assert "C=48" in check.describe()
    # More headroom makes a depth shallower: advice only for a crossing slower than the fit put it.
    assert ("--headroom 0.2" in check.describe()) is (p99 >= 0.15)
    assert ("errs shallow" in check.describe()) is (p99 < 0.15)
    assert crossing_check(samples, None, 0.15) is None


def test_a_settled_crossing_the_server_refused_is_no_speed_check() -> None:
    # Refused (429s): no tail to compare; "took inf s, infx the tail" had blamed the machine's speed.
    samples = [_level(1, 0.01), _level(64, 0.2), _level(48, float("inf"))]
    assert crossing_check(samples, 48, 0.15) is None


def _calibrate_settled(slow_from_first_miss: bool) -> Calibration:
    async def body() -> Calibration:
        pool = SimulatedPool(FINE)

        def progress(event: Progress) -> None:
            # The machine slows once the profile has missed: only the settled level, measured
            # after that miss, meets the slower machine.
            if slow_from_first_miss and event.sample is not None and not event.sample.meets(FINE_SLO):
                pool.service = FINE_SLOWER

        try:
            return await calibrate_pools(
                {"cpu": pool.submit}, constant_query,
                CalibrationOptions(slos=(FINE_SLO,), profile=ProfileOptions(rounds=3)),
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1", progress=progress,
            )
        finally:
            await pool.close()

    return run_virtual(body())


def test_the_settled_crossing_of_a_steady_pool_lands_on_the_slo() -> None:
    calibration = _calibrate_settled(slow_from_first_miss=False)
    check = calibration.crossing_check("cpu")
    assert check is not None and check.steady, check
    assert calibration.crossing_moved("cpu") is None
    assert check.concurrency == calibration.pools["cpu"].settled == calibration.pools["cpu"].samples[-1].concurrency
    assert f"cpu: the fitted crossing C={check.concurrency} took" not in format_report(calibration)


def test_a_pool_that_slowed_during_its_profile_is_told_by_its_settled_crossing() -> None:
    calibration = _calibrate_settled(slow_from_first_miss=True)
    check = calibration.crossing_check("cpu")
    assert check is not None and not check.steady and check.ratio > 1.1, check
    assert calibration.crossing_moved("cpu") == check
    assert f"cpu: the fitted crossing C={check.concurrency} took" in format_report(calibration)


# The profile aims at the SLO less the headroom, 0.27 s here: 0.39 s is 1.44x that, 0.28 s 1.04x,
# 0.2 s 0.74x (a depth that errs shallow: told, not warned).
@pytest.mark.parametrize(
    ("settled_p99", "warned", "told"), [(0.39, True, True), (0.28, False, False), (0.2, False, True)]
)
def test_serve_warns_when_its_calibration_settled_the_crossing_slower_than_the_fit(
    settled_p99: float, warned: bool, told: bool, caplog
) -> None:
    from estimator.calibration import ModelIdentity, PoolCalibration, SloDepth
    from estimator.fit import LinearFit
    from windve.depths import depth_from_calibration

    pool = PoolCalibration(
        samples=(_level(1, 0.01), _level(64, 0.4), _level(48, settled_p99)),
        fit=LinearFit(0.006, 0.005, 0.99, 3),
        profile_seconds=1.0,
        depths=(SloDepth(0.3, 42, "floor(...)"),),
        settled=48,
    )
    calibration = Calibration(ModelIdentity("m", "r"), "hw", (0.3,), 75, 3, {"cpu": pool}, headroom=0.1)
    with caplog.at_level("INFO", logger="windve.depths"):
        source = depth_from_calibration(calibration, "cpu", 0.3, "calibration (file)")
    assert source is not None and source.depth == 42
    told_here = [record for record in caplog.records if "the fitted crossing C=48 took" in record.getMessage()]
    assert bool(told_here) is told
    assert any(record.levelname == "WARNING" for record in told_here) is warned
    if warned:
        assert "0.390 s, 1.44x the 0.27 s tail" in told_here[0].getMessage()
