"""Short real calibrations of the MiniLM CPU pool: in-process through the service's dispatch path, and by
`windve calibrate` over HTTP through the `windve serve` it starts.

The estimate (with the default headroom, as `windve calibrate` computes it) must hold in a closed-loop
run: at the estimated depth the tail meets the SLO, at 1.5x the depth it does not. The SLO is the
service's default, 1 s: at shorter ones the depth falls near one full batch per worker (64 here), where a
round's tail jumps by up to 40 % with how its queries split into batches.

This machine changes speed (its slow state ~25 % slower) for seconds at a time, and an attempt that
meets another state than its profile tests the machine, not the estimator. So each attempt first asks
whether the machine held its speed: the settled crossing must have taken what the fit put at the SLO
(`CrossingCheck`), and a level of the profile, measured again interleaved with the checks, what it took
in the profile (`SpeedCheck`). Only an attempt that passes both is judged; the others are repeated, a
bounded number of times. The fit's R^2 is judged too, but one level of the profile taken in another
machine state bends the line without moving the reference (CI met R^2 = 0.899 so): an attempt whose
R^2 falls short measures every fitted level again, interleaved, and is the machine's when any of them
moved, the estimator's (a failure) when none did. Even then one round's tail at the depth moves by +-20 %
within a check, so the claim is the one a user can rely on here: the depth holds in 2 of at most 4
steady checks. When the machine holds no speed long enough for that within the test's time budget, the
test is skipped with its attempts printed: it measured the machine, not the estimator.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import matplotlib.image
import pytest

from estimator.calibration import load_calibration
from estimator.pipeline import CalibrationOptions
from estimator.profile import decide_profile_depth, fit_samples, fitted_levels, profile_pool
from estimator.recheck import SpeedCheck, crossing_check, reference_level
from estimator.rounds import measure_interleaved
from tests.estimator.cli_runner import run_cli
from windve.gc_tuning import YOUNG_THRESHOLD

# A neighbour's bursts of load (the other process of a parallel run) pass the speed checks and
# bend the profile: the README's test command runs this module after the parallel pass, alone.
pytestmark = pytest.mark.alone

SLO = 1.0
TOKENS = 75
CHECK_ROUNDS = 6
NEEDED, STEADY_CHECKS = 2, 4  # the depth must hold in 2 of at most 4 steady checks
# An attempt takes ~40 s, ~60 s when the machine runs at half speed. No attempt starts after
# BUDGET_SECONDS: a machine that holds its speed decides in the first two or three, and one that
# does not mostly skipped after a longer budget too (180 s had made this test ~15 % of the suite).
ATTEMPTS = 12
BUDGET_SECONDS = 100


@pytest.fixture(scope="module")
def cpu_runtime() -> Iterator[tuple[object, asyncio.AbstractEventLoop]]:
    """The real runtime (model, CPU worker, queue manager) on its own loop, once per module."""
    from windve.service import Runtime
    from windve.settings import load_settings

    loop = asyncio.new_event_loop()
    runtime = loop.run_until_complete(Runtime.start(load_settings(device="cpu")))
    try:
        yield runtime, loop
    finally:
        loop.run_until_complete(runtime.close())
        loop.close()


def fitted_levels_moved(loop: asyncio.AbstractEventLoop, submit, make_query, samples) -> list[tuple[int, float]]:
    """The fitted levels whose tail, measured again in turn, is not what it was in the profile, with the
    ratio of the two; empty when the machine held its speed at every level the line goes through."""
    fitted = fitted_levels(samples)
    rounds = max(sample.rounds for sample in fitted)
    again = loop.run_until_complete(
        measure_interleaved(submit, make_query, sorted({s.concurrency for s in fitted}), TOKENS, rounds)
    )
    checks = [SpeedCheck(s.concurrency, s.p99, again[s.concurrency].p99) for s in fitted]
    return [(check.concurrency, round(check.ratio, 3)) for check in checks if not check.steady]


def decided(steady: list[bool]) -> bool:
    return steady.count(True) == NEEDED or steady.count(False) > STEADY_CHECKS - NEEDED


def test_estimated_depth_meets_the_slo_and_one_and_a_half_times_it_does_not(cpu_runtime) -> None:
    runtime, loop = cpu_runtime
    assert "cpu" in runtime.pool_names
    submit = runtime.pool_submitter("cpu")
    defaults = CalibrationOptions()  # what `windve calibrate` does by default: 5 rounds, 15 % headroom
    attempts: list[tuple] = []
    steady: list[bool] = []
    started = time.monotonic()
    for _ in range(ATTEMPTS):
        if time.monotonic() - started > BUDGET_SECONDS:
            break
        profile = loop.run_until_complete(profile_pool(submit, runtime.make_query, SLO, defaults.profile, pool="cpu"))
        fit = fit_samples(profile.samples)
        cap = defaults.profile.max_concurrency
        decision = decide_profile_depth(profile.samples, fit, SLO, cap=cap, headroom=defaults.headroom) if fit else None
        depth = decision.depth if decision else None
        reference = reference_level(profile.samples, profile.settled)
        assert reference is not None, profile.samples  # the pool answered nothing: not a question of speed
        levels = [reference.concurrency] + ([depth, math.ceil(1.5 * depth)] if depth else [])
        checks = loop.run_until_complete(
            measure_interleaved(submit, runtime.make_query, list(dict.fromkeys(levels)), TOKENS, CHECK_ROUNDS)
        )
        speed = SpeedCheck(reference.concurrency, reference.p99, checks[reference.concurrency].p99)
        crossing = crossing_check(profile.samples, profile.settled, SLO)
        ratios = (round(speed.ratio, 3), round(crossing.ratio, 3) if crossing else None)
        if not speed.steady or (crossing is not None and not crossing.steady):
            attempts.append((*ratios, depth, "machine changed speed"))
            continue
        assert fit is not None, profile.samples
        if fit.r2 <= 0.9:
            moved = fitted_levels_moved(loop, submit, runtime.make_query, profile.samples)
            assert moved, f"R^2 {fit.r2:.3f} from a machine that held its speed at every level: {profile.samples}"
            attempts.append((*ratios, depth, f"R^2 {fit.r2:.3f}: levels moved {moved}"))
            continue
        # The machine held its speed through the profile and the checks: the estimator is judged.
        assert depth is not None and depth >= 2, (fit, profile.samples)
        beyond = math.ceil(1.5 * depth)
        assert all(sample.failures == 0 for sample in checks.values()), checks
        held = checks[depth].p99 <= SLO < checks[beyond].p99
        attempts.append((*ratios, depth, round(checks[depth].p99, 3), round(checks[beyond].p99, 3), held))
        steady.append(held)
        if decided(steady):
            break
    if not decided(steady):
        pytest.skip(f"undecided: {len(steady)} of {len(attempts)} attempts in {time.monotonic() - started:.0f} s "
                    "found the machine at one speed (speed ratio, crossing ratio, depth, p99 at depth, at 1.5x, "
                    f"held): {attempts}")
    assert steady.count(True) == NEEDED, (
        f"(speed ratio, crossing ratio, depth, p99 at depth, at 1.5x, held) per attempt: {attempts}"
    )


def test_calibrate_command_in_process_writes_json_and_png(
    tmp_path: Path, capsys, collector_when_measuring: list[int]
) -> None:
    out, plot = tmp_path / "calibration.json", tmp_path / "calibration.png"
    code = run_cli(
        "--in-process", "--slo", "0.3", "--rounds", "2", "--max-concurrency", "64", "--recheck",
        "--out", str(out), "--plot", str(plot),
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    calibration = load_calibration(out)
    assert "cpu" in calibration.pools and calibration.model.name.endswith("all-MiniLM-L6-v2")
    assert calibration.pools["cpu"].fit.points >= 2 and calibration.pools["cpu"].at(0.3).reason
    assert matplotlib.image.imread(plot).ndim == 3
    assert "SLO (s)" in captured.out
    recheck = calibration.pools["cpu"].recheck
    assert recheck is not None and f"cpu recheck: C={recheck.concurrency} took" in captured.out
    # The pools are measured in a process set up as `windve serve` sets up its own once ready.
    assert collector_when_measuring == [YOUNG_THRESHOLD]


def test_choose_cpu_layout_profiles_each_candidate_on_the_real_runtime(tmp_path: Path, capsys) -> None:
    out = tmp_path / "calibration.json"
    code = run_cli(
        "--in-process", "--choose-cpu-layout", "--slo", "0.3", "--rounds", "2", "--max-concurrency", "64",
        "--out", str(out), "--plot", str(tmp_path / "calibration.png"),
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    layout = load_calibration(out).cpu_layout
    assert layout is not None and layout.trials, layout
    usable = [trial for trial in layout.trials if trial.depth is not None]
    assert usable and all(trial.depth >= 2 and trial.seconds > 0 for trial in usable), layout.trials
    # The deepest candidate is kept, and the settings that select it are printed for `windve serve`.
    assert layout.chosen == max(usable, key=lambda trial: trial.depth).name
    assert f"CPU layout: chose {layout.chosen}" in captured.out and layout.settings


def test_calibrate_command_by_default_profiles_the_served_path(tmp_path: Path, capsys) -> None:
    """`windve calibrate` starts `windve serve` with the cpu pool, profiles it over HTTP, and stops it."""
    import devices
    from windve.service import hardware_fingerprint, make_plan
    from windve.settings import load_settings

    out = tmp_path / "calibration.json"
    code = run_cli("--slo", "0.3", "--rounds", "2", "--max-concurrency", "64", "--out", str(out))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    calibration = load_calibration(out)
    assert list(calibration.pools) == ["cpu"] and calibration.model.name.endswith("all-MiniLM-L6-v2")
    pool = calibration.pools["cpu"]
    assert pool.fit.points >= 2 and all(sample.failures == 0 for sample in pool.samples), pool.samples
    assert pool.at(0.3).estimate  # the served path meets 0.3 s with one query at least
    settings = load_settings()
    hardware = devices.detect_hardware(settings.sysfs_root)
    assert calibration.hardware_fingerprint == hardware_fingerprint(hardware, make_plan(settings, hardware), settings)
