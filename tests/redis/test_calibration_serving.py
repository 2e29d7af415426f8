"""`windve serve` takes its depths from a calibration file, and from Redis while it runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import pytest

from estimator.calibration import Calibration, ModelIdentity, PoolCalibration, SloDepth, save_calibration, to_dict
from estimator.fit import LengthFit, LinearFit
from estimator.rounds import LevelSample
from tests.servers import free_port, start_server

# t = C*(1e-4*L + 2e-7*L^2 + 1e-3) + 0.05: each query is charged L + 0.002*L^2 + 10 tokens.
LENGTH_FIT = LengthFit(1e-4, 1e-3, 0.05, r2=0.99, points=9, min_length=16, max_length=256, per_token_squared=2e-7)


def calibration(revision: str, fingerprint: str, depth: int, created: str) -> Calibration:
    fit = LinearFit(alpha=0.01, beta=0.05, r2=0.99, points=4)
    pool = PoolCalibration(
        samples=tuple(LevelSample(c, 75, 3, 0.05 + 0.01 * c, 0.06 + 0.01 * c, 0, None) for c in (1, 2, 4, 8)),
        fit=fit,
        profile_seconds=1.0,
        depths=(SloDepth(1.0, depth, "floor((T - beta) / alpha)", token_budget=9500),),
        length_fit=LENGTH_FIT,
    )
    return Calibration(
        model=ModelIdentity("sentence-transformers/all-MiniLM-L6-v2", revision),
        hardware_fingerprint=fingerprint,
        slos=(1.0,),
        query_tokens=75,
        rounds=3,
        pools={"cpu": pool},
        created=created,
    )


def cpu_pool(url: str) -> dict:
    return next(pool for pool in httpx.get(url + "/info").json()["pools"] if pool["name"] == "cpu")


def publish(redis_url: str, published: Calibration) -> subprocess.CompletedProcess[str]:
    """`published` into Redis by another process, as `windve calibrate --redis-url` does."""
    script = (
        "import json, sys; from windve.calibration_store import publish_sync; "
        "publish_sync(json.loads(sys.stdin.read()), sys.argv[1])"
    )
    return subprocess.run(
        [sys.executable, "-c", script, redis_url],
        input=json.dumps(to_dict(published)), text=True, timeout=60, capture_output=True,
    )


def wait_for_cpu_depth(url: str, depth: int, timeout: float = 30.0) -> None:
    """Poll /info until the cpu pool's depth is `depth`, within `timeout` (the caller asserts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and cpu_pool(url)["depth"] != depth:
        time.sleep(0.1)


def test_serve_uses_the_calibration_file_and_warns_on_another_machine(tmp_path, model_spec):
    elsewhere = calibration(model_spec.revision, "another-machine", 77, "2026-01-01T00:00:00+00:00")
    path = save_calibration(elsewhere, tmp_path / "cal.json")
    server = start_server(tmp_path, "--calibration-file", str(path), "--cache-size", "0")
    try:
        pool = cpu_pool(server.url)
        assert pool["depth"] == 77
        assert pool["depth_source"] == f"calibration ({path})"
        assert pool["fit"]["alpha"] == 0.01 and pool["fit"]["beta"] == 0.05
        assert pool["token_budget"] == 9500
        assert pool["token_charge"] == {"per_query": 10, "per_squared_token": pytest.approx(0.002)}
        text = "word " * 400  # truncated to the model's 256 tokens: charged 256 + 132 + 10
        assert httpx.post(server.url + "/embed", json={"inputs": [text] * 3}).status_code == 200
        assert "another-machine" in server.log() and "re-run `windve calibrate`" in server.log()
        (warning,) = httpx.get(server.url + "/info").json()["calibration"]["warnings"]  # and /info says so
        assert "'another-machine'" in warning
    finally:
        server.stop()


def test_serve_derives_an_uncalibrated_slo_from_the_fit(tmp_path, model_spec):
    path = save_calibration(calibration(model_spec.revision, "x", 77, "2026-01-01T00:00:00+00:00"), tmp_path / "c.json")
    server = start_server(tmp_path, "--calibration-file", str(path), "--slo-seconds", "0.5", "--cache-size", "0")
    try:
        assert cpu_pool(server.url)["depth"] == 45  # floor((0.5 - 0.05) / 0.01)
    finally:
        server.stop()


def test_a_calibration_no_pool_meets_serves_one_query_per_instance_and_says_so(tmp_path, model_spec):
    """Its beta (0.05 s) is over the 0.01 s SLO: the pool "cannot meet it" and had got depth 0, the
    only pool, so that the service said healthy and answered every request 429."""
    path = save_calibration(calibration(model_spec.revision, "x", 77, "2026-01-01T00:00:00+00:00"), tmp_path / "c.json")
    server = start_server(tmp_path, "--calibration-file", str(path), "--slo-seconds", "0.01", "--cache-size", "0")
    try:
        pool = cpu_pool(server.url)
        assert pool["depth"] == len(pool["instances"]) >= 1
        assert pool["depth_source"] == f"calibration ({path}), floor"
        assert httpx.post(server.url + "/embed", json={"inputs": "served, late"}).status_code == 200
        (warning,) = [w for w in httpx.get(server.url + "/info").json()["calibration"]["warnings"] if "SLO" in w]
        assert warning.startswith("no pool meets the 0.01 s SLO by this calibration")
        assert server.log().count("pool cpu cannot meet the 0.01 s SLO") == 1  # had been logged three times
    finally:
        server.stop()


def test_a_depth_setting_over_a_calibration_is_said_in_info(tmp_path, model_spec):
    """The setting wins; /info had shown the calibration with no word that its depth went unused."""
    path = save_calibration(calibration(model_spec.revision, "x", 77, "2026-01-01T00:00:00+00:00"), tmp_path / "c.json")
    server = start_server(tmp_path, "--calibration-file", str(path), "--cpu-depth", "7", "--cache-size", "0")
    try:
        pool = cpu_pool(server.url)
        assert (pool["depth"], pool["depth_source"]) == (7, "setting")
        warnings = httpx.get(server.url + "/info").json()["calibration"]["warnings"]
        assert "pool cpu keeps its setting cpu_depth (7), not this calibration's depth" in warnings
    finally:
        server.stop()


def test_published_calibration_applies_live(redis_server, tmp_path, model_spec):
    server = start_server(tmp_path, "--redis-url", redis_server.url, "--cache-size", "0")
    try:
        before = cpu_pool(server.url)
        assert before["depth_source"] == "warm-up probe (http)"
        fingerprint = httpx.get(server.url + "/info").json()["hardware_fingerprint"]
        newer = calibration(model_spec.revision, fingerprint, 123, "2026-06-01T00:00:00+00:00")
        publish(redis_server.url, newer).check_returncode()
        wait_for_cpu_depth(server.url, 123)
        pool = cpu_pool(server.url)
        assert (pool["depth"], pool["depth_source"]) == (123, "calibration (redis)")
        assert httpx.post(server.url + "/embed", json={"inputs": "still serving"}).status_code == 200
        info = httpx.get(server.url + "/info").json()
        assert info["calibration"]["origin"] == "redis"
        # An older calibration never replaces the one in force.
        older = replace(newer, pools={"cpu": replace(newer.pools["cpu"], depths=(SloDepth(1.0, 5, "old"),))},
                        created="2025-01-01T00:00:00+00:00")
        result = publish(redis_server.url, older)
        assert result.returncode != 0 and "Stale" in result.stderr
        assert cpu_pool(server.url)["depth"] == 123
    finally:
        server.stop()


def test_a_live_calibration_of_one_pool_leaves_the_other_alone(redis_server, tmp_path, model_spec):
    """Setting a depth reseeds that pool's control: a calibration naming the cpu pool only must not
    set the accelerator pool's again (a first version of the no-pool-meets-the-SLO floor did)."""
    config = tmp_path / "two-pools.yaml"
    # The accelerator's depth is a setting (the cpu pool's alone is probed: ~35 s less here); the
    # re-set this guards against took every pool, whatever its depth's source.
    config.write_text(
        "cpu_layout: explicit\naccelerator_depth: 16\n"
        "plan:\n  - {pool: accelerator, device: cpu, cores: [0]}\n  - {pool: cpu, cores: [1]}\n"
    )
    server = start_server(tmp_path, "--config", str(config), "--redis-url", redis_server.url, "--cache-size", "0")
    try:
        fingerprint = httpx.get(server.url + "/info").json()["hardware_fingerprint"]
        newer = calibration(model_spec.revision, fingerprint, 123, "2026-06-01T00:00:00+00:00")
        publish(redis_server.url, newer).check_returncode()
        wait_for_cpu_depth(server.url, 123)
        assert cpu_pool(server.url)["depth"] == 123
        # Set once, at the start (the control's own moves log "depth N -> M").
        assert len(re.findall(r"pool accelerator: depth \d+ \(", server.log())) == 1, server.log()
        pools = {pool["name"]: pool for pool in httpx.get(server.url + "/info").json()["pools"]}
        assert (pools["accelerator"]["depth"], pools["accelerator"]["depth_source"]) == (16, "setting")
    finally:
        server.stop()


@pytest.mark.parametrize("case", ["a whole server's profile", "not a calibration"])
def test_a_calibration_file_that_cannot_serve_stops_the_start_naming_the_setting(tmp_path, model_spec, case):
    if case == "not a calibration":
        path = tmp_path / "c.json"
        path.write_text("{not json")
        expected = "setting calibration_file: calibration file"
    else:  # what `windve calibrate --url` writes: one pool named "server"
        whole = calibration(model_spec.revision, "x", 40, "2026-01-01T00:00:00+00:00")
        whole = replace(whole, pools={"server": whole.pools["cpu"]})
        path = save_calibration(whole, tmp_path / "c.json")
        expected = "has depths for server, not for cpu (`windve calibrate --url` profiles a whole server"
    result = subprocess.run(
        [sys.executable, "-m", "windve.commands.serve", "--port", str(free_port()), "--calibration-file", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and expected in result.stderr, result.stderr
