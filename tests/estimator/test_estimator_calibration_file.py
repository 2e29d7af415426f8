"""The calibration JSON: round trip, validation messages, fingerprints, picture and table."""

from __future__ import annotations

import asyncio
import json
import math
import stat
from pathlib import Path

import matplotlib.image
import pytest

from estimator.calibration import (
    Calibration,
    CalibrationError,
    LayoutRecord,
    ModelIdentity,
    PoolCalibration,
    SloDepth,
    fingerprint_mismatch,
    from_dict,
    load_calibration,
    save_calibration,
    to_dict,
)
from estimator.fit import LengthFit, LinearFit
from estimator.layouts import LayoutTrial
from estimator.pipeline import CalibrationOptions, calibrate_pools
from estimator.plot import plot_calibration
from estimator.recheck import SpeedCheck
from estimator.report import format_report
from estimator.rounds import LevelSample
from estimator.simulated import ServiceTime, SimulatedPool, constant_query
from estimator.stress import FineTuneResult, FineTuneTrial, StressResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sample(c: int, p95: float, tokens: int = 75, failures: int = 0) -> LevelSample:
    worst = p95 if math.isinf(p95) else p95 * 1.02
    return LevelSample(c, tokens, 3, p95, worst, failures, "HTTP 429" if failures else None)


def make_calibration() -> Calibration:
    """A hand-made calibration using every optional part, including a failed (infinite) level."""
    samples = (
        _sample(1, 0.03), _sample(2, 0.05), _sample(4, 0.09), _sample(8, 0.17), _sample(16, math.inf, failures=4)
    )
    stress = StressResult(8, (0.5, 1.0), (0, 8), 12.5, (_sample(8, 0.17), _sample(16, 1.2)), "p95 1.2 s > SLO 1 s")
    pool = PoolCalibration(
        samples=samples,
        fit=LinearFit(0.02, 0.01, 0.998, 4),
        profile_seconds=3.25,
        depths=(SloDepth(0.5, 24, "floor(...)", 1800, 0, 25), SloDepth(1.0, 49, "floor(...)", 3700, 8, None)),
        profile_stop="p95 inf s > SLO 1 s at C=16",
        length_fit=LengthFit(2e-4, 1e-3, 0.01, 0.99, 9, 16, 256),
        length_samples=(_sample(1, 0.01, tokens=16), _sample(2, 0.015, tokens=16)),
        length_seconds=4.0,
        stress=stress,
        recheck=SpeedCheck(8, 0.17, 0.21),
    )
    accel = PoolCalibration(
        samples=(_sample(1, 0.01), _sample(2, 0.012)),
        fit=LinearFit(0.002, 0.008, 0.97, 2),
        profile_seconds=1.0,
        depths=(SloDepth(0.5, 246, "floor(...)"), SloDepth(1.0, 256, "capped at 256", capped=True)),
    )
    tuned = FineTuneResult(0.5, {"accelerator": 246, "cpu": 24}, {"accelerator": 240, "cpu": 25}, 7.5, True,
                           (FineTuneTrial({"accelerator": 246, "cpu": 24}, {"accelerator": 0.51, "cpu": math.inf}),))
    layout = LayoutRecord("per-node", (LayoutTrial("per-node", 49, 3.0), LayoutTrial("tp", None, 0.2, "OSError: no")),
                          {"cpu_layout": "per-node"})
    return Calibration(
        model=ModelIdentity("sentence-transformers/all-MiniLM-L6-v2", "c9332c31b66c62f2"),
        hardware_fingerprint="64255b212567a468",
        slos=(0.5, 1.0),
        query_tokens=75,
        rounds=3,
        scout_rounds=1,
        pools={"accelerator": accel, "cpu": pool},
        fine_tune=(tuned,),
        cpu_layout=layout,
    )


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    calibration = make_calibration()
    path = save_calibration(calibration, tmp_path / "calibration.json")
    assert load_calibration(path) == calibration
    raw = json.loads(path.read_text())  # strict JSON: infinity is spelled as a string
    assert raw["pools"]["cpu"]["samples"][-1]["p95"] == "Infinity"
    assert raw["model"] == {"name": "sentence-transformers/all-MiniLM-L6-v2", "revision": "c9332c31b66c62f2"}
    assert raw["schema_version"] == 1 and raw["hardware_fingerprint"] == "64255b212567a468"
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no temporary file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    raw.pop("scout_rounds")  # a file written before levels were scouted still loads
    assert from_dict(raw, "old.json").scout_rounds is None


def test_depth_for_prefers_the_fine_tuned_depth_and_names_what_exists() -> None:
    calibration = make_calibration()
    assert calibration.depth_for("cpu", 0.5) == 25  # fine-tuned
    assert calibration.depth_for("cpu", 1.0) == 49  # estimate
    assert calibration.depths(0.5) == {"accelerator": 246, "cpu": 25}
    with pytest.raises(KeyError, match="pools: accelerator, cpu"):
        calibration.depth_for("gpu", 0.5)
    with pytest.raises(KeyError, match="calibrated: 0.5, 1"):
        calibration.depth_for("cpu", 2.0)


def _broken(mutate) -> dict:
    data = to_dict(make_calibration())
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["pools"]["cpu"]["fit"].pop("alpha"), r"pools\.cpu\.fit\.alpha: Field required"),
        (
            lambda d: d["pools"]["cpu"]["fit"].update(alpha=-0.1),
            r"pools\.cpu\.fit: alpha and beta must be finite and >= 0",
        ),
        (
            lambda d: d["pools"]["cpu"]["fit"].update(beta="fast"),
            r"pools\.cpu\.fit\.beta: Input should be a valid number",
        ),
        (lambda d: d.update(schema_version=2), r"schema_version is 2, this windve reads 1: re-run `windve calibrate`"),
        (lambda d: d.update(slos=[0.5, 1.0, 2.0]), r"pools\.cpu\.depths: no entry for SLO 2"),
        (lambda d: d.update(slos=[]), r"slos must be a non-empty list"),
        (lambda d: d["pools"]["cpu"]["depths"][0].update(estimate=-3), r"depths\[slo=0\.5\]\.estimate must be >= 0"),
        (lambda d: d["pools"]["cpu"]["samples"][0].update(p95=0.5), r"samples\[0\]: need 0 <= p95 <= max"),
        (lambda d: d.update(created="yesterday"), r"created must be an ISO 8601 time"),
        (lambda d: d.update(pools={}), r"pools is empty"),
        (lambda d: d.pop("model"), r"model: Field required"),
        (lambda d: d.update(scout_rounds=0), r"scout_rounds must be >= 1"),
    ],
)
def test_validation_says_what_is_wrong(mutate, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        from_dict(_broken(mutate), "calibration.json")


def test_loading_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="No such file"):
        load_calibration(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1,\n "pools": }')
    with pytest.raises(CalibrationError, match="is not JSON: .* line 2 column 11"):
        load_calibration(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CalibrationError, match="expected a JSON object"):
        load_calibration(bad)


def test_fingerprint_mismatch_warns_per_difference() -> None:
    calibration = make_calibration()
    assert fingerprint_mismatch(calibration, "c9332c31b66c62f2", "64255b212567a468") == []
    warnings = fingerprint_mismatch(calibration, "0000", "ffff")
    assert len(warnings) == 2
    assert "revision c9332c31b66c62f2" in warnings[0] and "revision 0000" in warnings[0]
    assert "'64255b212567a468'" in warnings[1] and "'ffff'" in warnings[1]


def _read_png(path: Path):
    assert path.read_bytes()[:8] == PNG_MAGIC
    return matplotlib.image.imread(path)


def test_plot_is_a_png_with_a_panel_per_pool_and_a_length_row(tmp_path: Path) -> None:
    image = _read_png(plot_calibration(make_calibration(), tmp_path / "fit.png"))
    assert image.shape[:2] == (900, 1200)  # 2 rows x 2 pools at 6x4.5 inches, 100 dpi
    calibration = make_calibration()
    accelerator_only = {"accelerator": calibration.pools["accelerator"]}
    only_accel = Calibration(calibration.model, "hw", (0.5, 1.0), 75, 3, accelerator_only)
    assert _read_png(plot_calibration(only_accel, tmp_path / "one.png")).shape[:2] == (450, 600)


def test_report_is_a_table_iii_like_summary() -> None:
    text = format_report(make_calibration())
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("SLO (s)"))
    assert "estimate" in header and "stress test (step 8)" in header and "fine-tuned" in header
    row = next(line for line in lines if line.split()[:2] == ["0.5", "cpu"])
    assert row.split() == ["0.5", "cpu", "24", "3.2", "unusable", "12.5", "25", "7.5"]
    row = next(line for line in lines if line.split()[:2] == ["1", "accelerator"])
    assert row.split() == ["1", "accelerator", "256", "1.0", "-", "-", "-", "-"]
    assert "cpu: t = 0.02*C + 0.01" in text and "token budget: 1800 tokens at 0.5 s" in text
    assert "CPU layout: chose per-node" in text and "tp: error" in text
    assert "cpu recheck: C=8 took 1.24x its profile tail" in text and "--headroom 0.2" in text
    assert "accelerator at 1 s: capped at 256: the pool may hold the SLO deeper" in text
    assert "accelerator at 0.5 s" not in text and "larger --max-concurrency" in text


def test_pipeline_calibrates_simulated_pools_into_a_valid_file(tmp_path: Path) -> None:
    # Four times the time scale this test first had (0.1 s, 0.05 s): there one delay of the shared
    # machine once hid the per-token cost from the length fit, and no token budget came out.
    options = CalibrationOptions(slos=(0.4, 0.2), rounds=2, stress_step=8, fine_tune=True, lengths=(16, 75, 200))

    async def body() -> Calibration:
        fast = SimulatedPool(ServiceTime(per_batch=0.004, per_query=0.002, per_token=4e-5, max_batch_size=16))
        slow = SimulatedPool(ServiceTime(per_batch=0.004, per_query=0.004, per_token=8e-5, max_batch_size=8))
        try:
            return await calibrate_pools(
                {"accelerator": fast.submit, "cpu": slow.submit}, constant_query, options,
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1",
            )
        finally:
            await fast.close()
            await slow.close()

    calibration = asyncio.run(body())
    path = save_calibration(calibration, tmp_path / "c.json")
    loaded = load_calibration(path)
    assert loaded == calibration and loaded.scout_rounds == 2
    for name, pool in loaded.pools.items():
        assert pool.fit.r2 > 0.8, name  # fit quality is tested in test_estimator_algorithms
        assert pool.length_fit is not None and {s.tokens for s in pool.length_samples} == {16, 200}
        # The length-aware fit needs every level in full: nothing is scouted.
        assert {s.rounds for s in pool.samples + pool.length_samples} == {2}
        assert pool.stress is not None and pool.stress.step == 8
        for slo in options.slos:
            entry = pool.at(slo)
            assert entry.estimate and entry.token_budget and entry.fine_tuned is not None
    assert loaded.depth_for("accelerator", 0.4) > loaded.depth_for("cpu", 0.4)
    assert [result.slo for result in loaded.fine_tune] == [0.4, 0.2]
    _read_png(plot_calibration(loaded, tmp_path / "c.png"))


def test_a_pool_that_meets_the_slo_at_the_cap_is_recorded_and_reported_as_capped(tmp_path: Path) -> None:
    options = CalibrationOptions(slos=(1.0,), rounds=2, scout_rounds=1, max_concurrency=12)

    async def body() -> Calibration:
        pool = SimulatedPool(ServiceTime(per_batch=0.001, per_query=0.0005))
        try:
            return await calibrate_pools(
                {"accelerator": pool.submit}, constant_query, options,
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1",
            )
        finally:
            await pool.close()

    loaded = load_calibration(save_calibration(asyncio.run(body()), tmp_path / "c.json"))
    entry = loaded.pools["accelerator"].at(1.0)
    assert entry.estimate == 12 and entry.capped
    assert "accelerator at 1 s: the formula exceeds the cap" in format_report(loaded)
    assert "calibrate with a larger --max-concurrency" in format_report(loaded)
