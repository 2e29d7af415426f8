"""`windve calibrate` end to end: bad arguments, and a full run against a real HTTP server."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import redis

from estimator.calibration import load_calibration
from tests.estimator.cli_runner import run_cli
from windve.commands import calibrate
from windve.gc_tuning import YOUNG_THRESHOLD

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "0"], "--slo must be > 0, got '0'"),
        (["--slo", "-1"], "--slo must be > 0"),
        (["--slo", "fast"], "--slo must be a number, got 'fast'"),
        (["--rounds", "0"], "--rounds must be > 0"),
        (["--scout-rounds", "0"], "--scout-rounds must be > 0"),
        (["--pools", "gpu"], "unknown pool gpu: choose from accelerator, cpu"),
        (["--lengths", "75"], "--lengths needs two or more token counts"),
        (["--step", "1.5"], "--step must be a number"),
    ],
)
def test_bad_arguments_exit_2_at_parse_time(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        run_cli(*argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_help_states_each_default_once_and_only_real_ones(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        run_cli("--help")
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    assert "(default: None)" not in text and "(default: False)" not in text
    assert ") (default:" not in text  # a default stated twice
    for option, default in [("--rounds ROUNDS", "5"), ("--step STEP", "8"), ("--headroom HEADROOM", "0.15"),
                            ("--max-concurrency MAX_CONCURRENCY", "4096"), ("--out OUT", "calibration.json"),
                            ("--scout-rounds SCOUT_ROUNDS", "1")]:
        option_help = text.split(f" {option} ", 1)[1].split(" --", 1)[0]
        assert f"(default: {default}" in option_help, option


OPEN_FILES_SCRIPT = """
import resource, sys
from windve.commands.calibrate import allow_open_files
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, int(sys.argv[1]) if len(sys.argv) > 1 else hard))
print(allow_open_files(2000))
print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_profiling_a_server_raises_the_open_file_limit_up_to_the_hard_one() -> None:
    """One connection per query in flight: a soft limit of 256 would fail every deeper level."""
    def run(*hard: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", OPEN_FILES_SCRIPT, *hard], capture_output=True, text=True,
                              check=True, timeout=60)
        return done.stdout.splitlines()

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip("this machine's hard open-file limit is below 2000")
    assert run() == ["None", "2000"]
    warning, soft = run("512")
    assert soft == "512" and "open files are limited to 512" in warning and "--max-concurrency" in warning


def test_the_fitted_crossing_is_settled_unless_no_settle_is_given() -> None:
    parser = argparse.ArgumentParser()
    calibrate.add_arguments(parser)
    assert calibrate.options_from_args(parser.parse_args([])).settle is True
    assert calibrate.options_from_args(parser.parse_args(["--no-settle"])).settle is False


def test_the_profile_chooses_how_to_measure_the_aims_unless_told(capsys) -> None:
    parser = argparse.ArgumentParser()
    calibrate.add_arguments(parser)
    assert calibrate.options_from_args(parser.parse_args([])).scout_aims is None
    assert calibrate.options_from_args(parser.parse_args(["--scout-aims"])).scout_aims is True
    assert calibrate.options_from_args(parser.parse_args(["--full-aims"])).scout_aims is False
    with pytest.raises(SystemExit) as exit_:
        run_cli("--scout-aims", "--full-aims")
    assert exit_.value.code == 2
    assert "argument --full-aims: not allowed with argument --scout-aims" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--out", "/nonexistent-folder/c.json"],
            "--out /nonexistent-folder/c.json: folder /nonexistent-folder does not exist",
        ),
        (["--out", "{tmp}"], "is a directory"),
        (["--plot", "/proc/version"], "--plot /proc/version is not writable"),
        (["--out", "/proc/calibration.json"], "--out /proc/calibration.json is not writable"),
        (["--out", "{tmp}/same", "--plot", "{tmp}/same"], "--out and --plot name the same file"),
        (["--query-tokens", "100000"], "query length 100000 is outside 3..256 tokens"),
        (["--lengths", "2,75"], "query length 2 is outside 3..256"),
        (["--rounds", "2", "--scout-rounds", "3"], "--scout-rounds 3 is more than --rounds 2"),
        (["--scout-aims", "--no-settle"], "--scout-aims needs the settled crossing: drop --no-settle"),
        (["--url", "ftp://host"], "--url must start with http:// or https://"),
        (["--url", "http://127.0.0.1:9", "--pools", "cpu"], "--pools and --choose-cpu-layout need the in-process mode"),
    ],
)
def test_bad_arguments_exit_2_before_profiling(argv, message, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    code = run_cli(*[arg.replace("{tmp}", str(tmp_path)) for arg in argv])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("windve calibrate: error: ") and message in err
    assert not (tmp_path / "calibration.json").exists()


def test_bad_config_file_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("WINDVE_CONFIG", raising=False)
    config = tmp_path / "windve.yaml"
    config.write_text("slo_seconds: -1\n")
    try:
        assert run_cli("--config", str(config), "--out", str(tmp_path / "c.json")) == 2
    finally:
        os.environ.pop("WINDVE_CONFIG", None)  # load_settings exports it for the process
    assert "slo_seconds" in capsys.readouterr().err


def test_unreachable_server_exits_1_and_says_so(tmp_path: Path, capsys) -> None:
    code = run_cli("--url", "http://127.0.0.1:9", "--out", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png"))
    assert code == 1
    assert "http://127.0.0.1:9/embed does not answer" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_calibrating_a_server_by_url_writes_json_png_table_and_redis(
    sim_server_factory, redis_server, tmp_path: Path, capsys, collector_when_measuring: list[int]
) -> None:
    server = sim_server_factory("--per-query", "0.001", "--per-token", "0.00002")
    out, plot = tmp_path / "calibration.json", tmp_path / "calibration.png"
    code = run_cli(
        "--url", server.url, "--slo", "0.1", "--slo", "0.05", "--rounds", "2", "--max-concurrency", "128",
        "--stress-test", "--step", "8", "--fine-tune", "--lengths", "16,75",
        "--out", str(out), "--plot", str(plot), "--redis-url", redis_server.url,
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    calibration = load_calibration(out)
    assert calibration.model.name == "simulated-model" and calibration.model.revision == "sim-rev-1"
    assert calibration.hardware_fingerprint == "sim-host"
    assert list(calibration.pools) == ["server"] and calibration.slos == (0.1, 0.05)
    pool = calibration.pools["server"]
    assert pool.fit.alpha > 0 and pool.fit.r2 > 0.5  # HTTP on a shared machine is noisy; quality is tested elsewhere
    assert pool.stress is not None and pool.length_fit is not None
    # --lengths measures every level in full, and the file says so.
    assert calibration.rounds == calibration.scout_rounds == 2 and {s.rounds for s in pool.samples} == {2}
    assert all(entry.estimate and entry.stress_test is not None and entry.fine_tuned for entry in pool.depths)
    assert plot.read_bytes()[:8] == PNG_MAGIC and matplotlib.image.imread(plot).ndim == 3
    assert "stress test (step 8)" in captured.out and f"wrote {out} and {plot}" in captured.out
    assert "published to Redis under windve:calibration:sim-rev-1:sim-host" in captured.out
    stored = redis.Redis.from_url(redis_server.url).get("windve:calibration:sim-rev-1:sim-host")
    assert json.loads(stored) == json.loads(out.read_text())
    # The client times the server: its collector is set up as the server's own, start-up heap frozen.
    assert collector_when_measuring == [YOUNG_THRESHOLD]


@pytest.mark.parametrize(
    ("flags", "scouted", "rounds", "refused_at"),
    [
        ([], 1, [2, 1, 1, 2], 16),  # by default levels far below the SLO are scouted with one round, growing 4x
        (["--scout-rounds", "2"], 2, [2, 2, 2, 2], 8),  # as many as --rounds: every level in full, doubling
    ],
)
def test_server_answering_busy_is_profiled_up_to_its_limit(
    sim_server_factory, tmp_path: Path, capsys, flags: list[str], scouted: int, rounds: list[int], refused_at: int
) -> None:
    server = sim_server_factory("--limit", "6", "--per-query", "0.05")  # requests of a round overlap
    out = tmp_path / "c.json"
    code = run_cli("--url", server.url, "--slo", "1", "--rounds", "2", *flags, "--out", str(out))
    assert code == 0, capsys.readouterr().err
    # Without --plot, the picture lands beside the JSON.
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    calibration = load_calibration(out)
    samples = calibration.pools["server"].samples
    # The file and the table say how many rounds the scouted levels took.
    shape = [(s.concurrency, s.rounds) for s in samples]
    assert calibration.scout_rounds == scouted and [taken for _, taken in shape] == rounds, shape
    assert samples[-1].concurrency == refused_at and samples[-1].failures > 0
    assert "HTTP 429" in (samples[-1].first_error or "")
    out_text = capsys.readouterr().out
    assert f"p95 inf s > SLO 1 s at C={refused_at}" in out_text
    assert ("2 rounds per level (1 per scouted level)" in out_text) == (scouted == 1)
    refused = rf"server: \d+ of {2 * refused_at} requests at C={refused_at} failed \(ServerRefused: HTTP 429"
    assert re.search(refused, out_text)
    assert "give it deeper queues (e.g. WINDVE_CPU_DEPTH=1024)" in out_text
