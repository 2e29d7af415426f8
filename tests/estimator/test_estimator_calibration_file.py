"""The calibration JSON: round trip, validation messages, fingerprints, picture and table."""

from __future__ import annotations

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
from estimator.profile import ProfileOptions
from estimator.recheck import SpeedCheck
from estimator.report import format_report
from estimator.rounds import LevelSample
from estimator.simulated import ServiceTime, SimulatedPool, constant_query, run_virtual
from estimator.stress import StressResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sample(c: int, p99: float, tokens: int = 75, failures: int = 0) -> LevelSample:
    worst = p99 if math.isinf(p99) else p99 * 1.02
    return LevelSample(c, tokens, 3, p99, worst, failures, "HTTP 429" if failures else None)


def make_calibration() -> Calibration:
    """A hand-made calibration using every optional part, including a failed (infinite) level."""
    samples = (
        _sample(1, 0.03), _sample(2, 0.05), _sample(4, 0.09), _sample(8, 0.17), _sample(16, math.inf, failures=4)
    )
    stress = StressResult(8, (0.5, 1.0), (0, 8), 12.5, (_sample(8, 0.17), _sample(16, 1.2)), "p99 1.2 s > SLO 1 s")
    pool = PoolCalibration(
        samples=samples,
        fit=LinearFit(0.02, 0.01, 0.998, 4),
        profile_seconds=3.25,
        depths=(
            SloDepth(0.5, 24, "floor(...)", 1800, 0),
            SloDepth(1.0, 49, "floor(...) = 47, under C=49, measured within 1 s", 3700, 8, bounded=True),
        ),
        profile_stop="p99 inf s > SLO 1 s at C=16",
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
    layout = LayoutRecord("per-node", (LayoutTrial("per-node", 49, 3.0), LayoutTrial("tp", None, 0.2, "OSError: no")),
                          {"cpu_layout": "per-node"})
    return Calibration(
        model=ModelIdentity("sentence-transformers/all-MiniLM-L6-v2", "c9332c31b66c62f2"),
        hardware_fingerprint="64255b212567a468",
        slos=(0.5, 1.0),
        query_tokens=75,
        rounds=3,
        pools={"accelerator": accel, "cpu": pool},
        cpu_layout=layout,
    )


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    calibration = make_calibration()
    path = save_calibration(calibration, tmp_path / "calibration.json")
    assert load_calibration(path) == calibration
    raw = json.loads(path.read_text())  # strict JSON: infinity is spelled as a string
    assert raw["pools"]["cpu"]["samples"][-1]["p99"] == "Infinity"
    assert raw["model"] == {"name": "sentence-transformers/all-MiniLM-L6-v2", "revision": "c9332c31b66c62f2"}
    assert raw["schema_version"] == 2 and raw["hardware_fingerprint"] == "64255b212567a468"
    assert raw["pools"]["cpu"]["recheck"] == {"concurrency": 8, "profile_p99": 0.17, "recheck_p99": 0.21}
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no temporary file left
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_file_of_the_p95_schema_is_refused_with_a_message_that_says_why() -> None:
    old = to_dict(make_calibration()) | {"schema_version": 1}
    with pytest.raises(CalibrationError, match=r"old\.json: schema_version is 1 \(an older windve's, whose depths "
                                               r"aim at the p95 tail; this one aims at the p99\), this windve reads 2: "
                                               r"re-run `windve calibrate`"):
        from_dict(old, "old.json")


def test_each_pool_and_slo_has_its_entry_and_unknown_ones_are_named() -> None:
    calibration = make_calibration()
    assert calibration.pools["cpu"].at(0.5).estimate == 24 and calibration.pools["cpu"].at(1.0).estimate == 49
    with pytest.raises(KeyError, match="calibrated: 0.5, 1"):
        calibration.pools["cpu"].at(2.0)


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
        (lambda d: d.update(schema_version=3), r"schema_version is 3, this windve reads 2: re-run `windve calibrate`"),
        (lambda d: d.update(slos=[0.5, 1.0, 2.0]), r"pools\.cpu\.depths: no entry for SLO 2"),
        (lambda d: d.update(slos=[]), r"slos must be a non-empty list"),
        (lambda d: d["pools"]["cpu"]["depths"][0].update(estimate=-3), r"depths\[slo=0\.5\]\.estimate must be >= 0"),
        (lambda d: d["pools"]["cpu"]["samples"][0].update(p99=0.5), r"samples\[0\]: need 0 <= p99 <= max"),
        (lambda d: d["pools"]["cpu"]["samples"][0].pop("p99"), r"samples\.0\.p99: Field required"),
        (lambda d: d.update(created="yesterday"), r"created must be an ISO 8601 time"),
        (lambda d: d.update(pools={}), r"pools is empty"),
        (lambda d: d.pop("model"), r"model: Field required"),
    ],
)
def test_validation_says_what_is_wrong(mutate, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        from_dict(_broken(mutate), "calibration.json")


def test_loading_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="No such file"):
        load_calibration(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2,\n "pools": }')
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


def test_the_fingerprint_names_what_sets_a_pools_speed_besides_the_machine() -> None:
    """A calibration in Redis is keyed by it: one measured with the CPU pool in fp16 (depth 8) had
    been taken by replicas serving bf16 there (the probe found 79)."""
    import devices
    from windve.service import hardware_fingerprint, make_plan
    from windve.settings import Settings

    hardware = devices.detect_hardware()

    def fingerprint(**settings: object) -> str:
        chosen = Settings(**settings)
        return hardware_fingerprint(hardware, make_plan(chosen, hardware), chosen)

    base = fingerprint(dtype="fp32")
    assert fingerprint(dtype="fp32") == base  # stable across starts of one set-up
    for other in ({"dtype": "fp16"}, {"dtype": "fp32", "engine": "onnx"}, {"dtype": "fp32", "max_batch_size": 7},
                  {"dtype": "fp32", "max_batch_tokens": 1234}):
        assert fingerprint(**other) != base, other


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
    assert header.split() == ["SLO", "(s)", "pool", "estimate", "time", "(s)", "stress", "test", "(step", "8)",
                              "time", "(s)"]
    assert lines[0].startswith("Queue depths (p99 of queries of 75 tokens, 3 rounds per level)")
    row = next(line for line in lines if line.split()[:2] == ["0.5", "cpu"])
    assert row.split() == ["0.5", "cpu", "24", "3.2", "unusable", "12.5"]
    row = next(line for line in lines if line.split()[:2] == ["1", "accelerator"])
    assert row.split() == ["1", "accelerator", "256", "1.0", "-", "-"]
    assert "cpu: t = 0.02*C + 0.01" in text and "token budget: 1800 tokens at 0.5 s" in text
    assert "CPU layout: chose per-node" in text and "tp: error" in text
    assert "cpu recheck: C=8 took 1.24x its profile tail" in text and "--headroom 0.2" in text
    assert "accelerator at 1 s: capped at 256: the pool may hold the SLO deeper" in text
    assert "accelerator at 0.5 s" not in text and "larger --max-concurrency" in text
    assert "cpu at 1 s: floor(...) = 47, under C=49" in text and "cpu at 0.5 s" not in text


def test_pipeline_calibrates_simulated_pools_into_a_valid_file(tmp_path: Path) -> None:
    options = CalibrationOptions(
        slos=(0.4, 0.2), profile=ProfileOptions(rounds=2), stress_step=8, lengths=(16, 75, 200)
    )

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

    calibration = run_virtual(body())
    path = save_calibration(calibration, tmp_path / "c.json")
    loaded = load_calibration(path)
    assert loaded == calibration and (loaded.rounds, loaded.query_tokens) == (2, 75)
    for name, pool in loaded.pools.items():
        assert pool.fit.r2 > 0.95, name
        assert pool.length_fit is not None and {s.tokens for s in pool.length_samples} == {16, 200}
        assert {s.rounds for s in pool.samples + pool.length_samples} == {2}
        assert pool.stress is not None and pool.stress.step == 8
        for slo in options.slos:
            entry = pool.at(slo)
            assert entry.estimate and entry.token_budget and entry.stress_test
    assert loaded.pools["accelerator"].at(0.4).estimate > loaded.pools["cpu"].at(0.4).estimate
    _read_png(plot_calibration(loaded, tmp_path / "c.png"))


def test_a_pool_that_meets_the_slo_at_the_cap_is_recorded_and_reported_as_capped(tmp_path: Path) -> None:
    options = CalibrationOptions(slos=(1.0,), profile=ProfileOptions(rounds=2, max_concurrency=12))

    async def body() -> Calibration:
        pool = SimulatedPool(ServiceTime(per_batch=0.001, per_query=0.0005))
        try:
            return await calibrate_pools(
                {"accelerator": pool.submit}, constant_query, options,
                model_name="sim", model_revision="r1", hardware_fingerprint="hw1",
            )
        finally:
            await pool.close()

    loaded = load_calibration(save_calibration(run_virtual(body()), tmp_path / "c.json"))
    entry = loaded.pools["accelerator"].at(1.0)
    assert entry.estimate == 12 and entry.capped
    assert "accelerator at 1 s: the formula exceeds the cap" in format_report(loaded)
    assert "calibrate with a larger --max-concurrency" in format_report(loaded)
