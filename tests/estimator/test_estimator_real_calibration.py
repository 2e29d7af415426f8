"""A short real calibration of the MiniLM CPU pool through the service's dispatch path.

The estimate (with the default headroom, as `windve calibrate` computes it) must hold in a
closed-loop run: at the estimated depth the tail meets the SLO, at 1.5x the depth it does
not. The SLO is the service's default, 1 s: at shorter ones the depth falls near one full batch
per worker (64 here), where a round's tail jumps by up to 40 % with how its queries split into
batches.

This machine runs in two states, the slow one ~25% slower, for seconds at a time (the
README's calibration section has the figures). A check in another state than its profile
tests the machine, not the estimator. So the checks interleave their rounds with a level
the profile measured (the reference) and count only when the reference took what it took
in the profile; otherwise the attempt is repeated, a bounded number of times.

Even then one round's tail at the depth moves by +-20 % within a check, and a check's p95 is
about its slowest round: 5 of 26 checks in a steady state missed the SLO, by up to 12 %, on a
busy afternoon (README, Calibration). The claim is therefore the one a user can rely on here:
the depth holds in most checks, 2 of at most 4 steady ones. A depth that is simply too deep
fails nearly every check and fails this test. When the machine holds no speed long enough for
that within the test's time budget, the test is skipped as undecided, with its attempts printed:
it measured the machine, not the estimator.
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
from estimator.fit import decide_depth
from estimator.pipeline import CalibrationOptions, fit_profile
from estimator.profile import profile_pool
from estimator.recheck import SpeedCheck, reference_level
from estimator.rounds import measure_interleaved
from tests.estimator.cli_runner import run_cli
from windve.gc_tuning import YOUNG_THRESHOLD

SLO = 1.0
TOKENS = 75
CHECK_ROUNDS = 6
NEEDED, STEADY_CHECKS = 2, 4  # the depth must hold in 2 of at most 4 steady checks
# 9 of 20 attempts here once met another state, 6 of 10 on a busier day (the reference level
# measured again at 0.72-1.66x). An attempt takes ~40 s, ~60 s when the machine runs at half speed;
# the attempts stop after BUDGET_SECONDS, inside pytest-timeout's 300 s (pyproject.toml).
ATTEMPTS = 12
BUDGET_SECONDS = 180


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


def decided(steady: list[bool]) -> bool:
    return steady.count(True) == NEEDED or steady.count(False) > STEADY_CHECKS - NEEDED


def test_estimated_depth_meets_the_slo_and_one_and_a_half_times_it_does_not(cpu_runtime) -> None:
    runtime, loop = cpu_runtime
    assert "cpu" in runtime.pool_names
    submit = runtime.pool_submitter("cpu")
    defaults = CalibrationOptions()  # what `windve calibrate` does by default: 5 rounds, 15 % headroom
    attempts, steady = [], []
    started = time.monotonic()
    for _ in range(ATTEMPTS):
        if time.monotonic() - started > BUDGET_SECONDS:
            break
        profile = loop.run_until_complete(
            profile_pool(
                submit, runtime.make_query, SLO, query_tokens=TOKENS, rounds=defaults.rounds,
                scout_rounds=defaults.scouting_rounds, max_concurrency=defaults.max_concurrency,
                settle=defaults.settle, pool="cpu",
            )
        )
        fit = fit_profile("cpu", profile.samples)
        assert fit.r2 > 0.9, profile.samples
        depth = decide_depth(fit, SLO, cap=defaults.max_concurrency, headroom=defaults.headroom).depth
        assert depth is not None and depth >= 2, (fit, profile.samples)
        reference = reference_level(profile.samples, profile.settled)
        assert reference is not None, profile.samples
        beyond = math.ceil(1.5 * depth)
        levels = list(dict.fromkeys([depth, beyond, reference.concurrency]))
        checks = loop.run_until_complete(measure_interleaved(submit, runtime.make_query, levels, TOKENS, CHECK_ROUNDS))
        assert all(sample.failures == 0 for sample in checks.values()), checks
        speed = SpeedCheck(reference.concurrency, reference.p95, checks[reference.concurrency].p95)
        held = checks[depth].p95 <= SLO < checks[beyond].p95
        attempts.append((round(speed.ratio, 3), depth, round(checks[depth].p95, 3), round(checks[beyond].p95, 3), held))
        if speed.steady:  # the same machine state as the profile
            steady.append(held)
            if decided(steady):
                break
    if not decided(steady):
        # The machine never held one speed long enough: it tested the machine, not the estimator.
        pytest.skip(f"undecided: {len(steady)} of {len(attempts)} attempts in {time.monotonic() - started:.0f} s met "
                    f"the profile's machine state (speed ratio, depth, p95 at depth, at 1.5x, held): {attempts}")
    assert steady.count(True) == NEEDED, (
        f"(speed ratio, depth, p95 at depth, at 1.5x, held) per attempt, fit {fit}: {attempts}"
    )


def test_calibrate_command_in_process_writes_json_and_png(
    tmp_path: Path, capsys, collector_when_measuring: list[int]
) -> None:
    out, plot = tmp_path / "calibration.json", tmp_path / "calibration.png"
    code = run_cli(
        "--slo", "0.3", "--rounds", "2", "--max-concurrency", "64", "--recheck", "--out", str(out), "--plot", str(plot)
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
        "--choose-cpu-layout", "--slo", "0.3", "--rounds", "2", "--max-concurrency", "64",
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
