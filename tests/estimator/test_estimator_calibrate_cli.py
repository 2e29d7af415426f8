"""`windve calibrate` end to end: bad arguments, the servers it starts, and full runs over real HTTP."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import matplotlib.image
import psutil
import pytest
import redis

from devices import Plan
from estimator.calibration import load_calibration
from tests.estimator.cli_runner import run_cli
from tests.estimator.conftest import SIM_SERVER
from windve.commands import calibrate
from windve.gc_tuning import YOUNG_THRESHOLD
from windve.settings import InstanceConfig, load_settings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slo", "0"], "--slo must be > 0, got '0'"),
        (["--slo", "-1"], "--slo must be > 0"),
        (["--slo", "fast"], "--slo must be a number, got 'fast'"),
        (["--rounds", "0"], "--rounds must be > 0"),
        (["--url", "http://127.0.0.1:9", "--in-process"], "argument --in-process: not allowed with argument --url"),
        (["--scout-aims"], "unrecognized arguments: --scout-aims"),
        (["--scout-rounds", "1"], "unrecognized arguments: --scout-rounds"),
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
                            ("--max-concurrency MAX_CONCURRENCY", "4096"), ("--out OUT", "calibration.json")]:
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


def test_the_flags_make_the_options() -> None:
    parser = argparse.ArgumentParser()
    calibrate.add_arguments(parser)
    options = calibrate.options_from_args(parser.parse_args(
        ["--slo", "0.5", "--slo", "2", "--rounds", "3", "--max-concurrency", "64", "--query-tokens", "32",
         "--stress-test", "--step", "4", "--lengths", "16,256", "--headroom", "0.2", "--recheck"]
    ))
    assert options.slos == (0.5, 2.0) and options.headroom == 0.2 and options.recheck
    assert (options.stress_step, options.lengths) == (4, (16, 256))
    profile = options.profile
    assert (profile.rounds, profile.max_concurrency, profile.query_tokens) == (3, 64, 32)
    assert profile.request_timeout == 30.0  # 10x the largest SLO, at least 30 s
    defaults = calibrate.options_from_args(parser.parse_args([]))
    assert defaults.slos == (1.0,) and defaults.stress_step is None and defaults.profile.rounds == 5


def test_each_pool_is_served_alone_on_the_cores_of_the_full_plan() -> None:
    settings = load_settings(calibration_file="/nowhere/calibration.json", cpu_depth=7)
    plan = Plan(pools=(), reserved_cores=(0,), heterogeneous=False)
    cpu = calibrate.pool_settings(settings, plan, "cpu")
    assert (cpu.device, cpu.reserved_cores, cpu.heterogeneous) == ("cpu", [0], True)
    # Static depth control with depths that refuse nothing, and no calibration file to take depths from.
    assert (cpu.depth_control, cpu.cpu_depth, cpu.accelerator_depth) == ("static", 1_000_000, 1_000_000)
    assert cpu.calibration_file is None
    accelerator = calibrate.pool_settings(settings, plan, "accelerator")
    assert (accelerator.device, accelerator.heterogeneous) == ("auto", False)  # accelerator first: only it
    explicit = settings.model_copy(update={"plan": [
        InstanceConfig(pool="accelerator", device="cuda:0"), InstanceConfig(pool="cpu", cores=[1])
    ]})
    assert [inst.pool for inst in calibrate.pool_settings(explicit, plan, "cpu").plan] == ["cpu"]


def test_the_server_gets_every_setting_and_none_of_this_process_windve_variables(monkeypatch) -> None:
    monkeypatch.setenv("WINDVE_CALIBRATION_FILE", "/nowhere/calibration.json")
    monkeypatch.setenv("WINDVE_MAX_BATCH_SIZE", "7")
    settings = calibrate.pool_settings(load_settings(), Plan(pools=(), reserved_cores=(1,), heterogeneous=False), "cpu")
    env = calibrate.serve_env(settings)
    assert "WINDVE_CALIBRATION_FILE" not in env and "WINDVE_HOST" not in env and "WINDVE_PORT" not in env
    assert env["WINDVE_DEPTH_CONTROL"] == "static" and env["WINDVE_CPU_DEPTH"] == "1000000"
    assert env["WINDVE_DEVICE"] == "cpu" and env["WINDVE_RESERVED_CORES"] == "[1]"
    assert env["WINDVE_MAX_BATCH_SIZE"] == "7" and env["PATH"] == os.environ["PATH"]
    # What `windve serve` reads from that environment is exactly these settings.
    for key in [key for key in os.environ if key.startswith("WINDVE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_settings() == settings.model_copy(update={"host": "127.0.0.1", "port": 8080})


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
        (["--url", "ftp://host"], "--url must start with http:// or https://"),
        (["--url", "http://127.0.0.1:9", "--pools", "cpu"], "--pools and --choose-cpu-layout choose which servers"),
        # A whole server's calibration had replaced the shared per-pool one, which no service then read.
        (["--url", "http://127.0.0.1:9", "--redis-url", "redis://r:6379/0"], "which no service reads from Redis"),
        # Checked after the profile, it had cost a whole calibration.
        (["--redis-url", "http://r:6379"], "--redis-url: a Redis URL starts with redis://"),
        (["--redis-url", "redis://r:port/0"], "--redis-url: not a Redis URL: Port could not be cast"),
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
    assert run_cli("--config", str(config), "--out", str(tmp_path / "c.json")) == 2
    assert "slo_seconds" in capsys.readouterr().err


def test_a_plan_that_cannot_work_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WINDVE_DEVICE", "cuda")  # this machine has no CUDA GPU
    assert run_cli("--out", str(tmp_path / "c.json")) == 2
    assert "device=cuda but no CUDA" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_unreachable_server_exits_1_and_says_so(tmp_path: Path, capsys) -> None:
    code = run_cli("--url", "http://127.0.0.1:9", "--out", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png"))
    assert code == 1
    assert "http://127.0.0.1:9/embed does not answer" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_a_server_that_never_answers_is_told_after_one_timeout(tmp_path: Path, capsys) -> None:
    asked: list[bytes] = []
    hang_up = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def hold() -> None:  # reads each request line, answers nothing
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            asked.append(conn.recv(65536).split(b"\r\n", 1)[0])
            hang_up.wait()
            conn.close()

    threading.Thread(target=hold, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        code = run_cli("--url", url, "--request-timeout", "0.5", "--out", str(tmp_path / "c.json"))
    finally:
        hang_up.set()
        listener.close()
    assert code == 1
    assert f"{url}/embed does not answer: no answer within 0.5 s (--request-timeout)" in capsys.readouterr().err
    assert asked == [b"POST /embed HTTP/1.1"]  # not GET /info first, a second timeout


def test_calibrating_a_server_by_url_writes_json_png_and_table_and_leaves_redis_alone(
    sim_server_factory, redis_server, tmp_path: Path, capsys, collector_when_measuring: list[int], monkeypatch
) -> None:
    server = sim_server_factory("--per-query", "0.001", "--per-token", "0.00002")
    out, plot = tmp_path / "calibration.json", tmp_path / "calibration.png"
    monkeypatch.setenv("WINDVE_REDIS_URL", redis_server.url)  # as in a pod of the chart with Redis
    code = run_cli(
        "--url", server.url, "--slo", "0.1", "--slo", "0.05", "--rounds", "2", "--max-concurrency", "128",
        "--stress-test", "--step", "8", "--lengths", "16,75",
        "--out", str(out), "--plot", str(plot),
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
    assert calibration.rounds == 2 and {s.rounds for s in pool.samples} == {2}
    assert all(entry.estimate and entry.stress_test is not None for entry in pool.depths)
    assert plot.read_bytes()[:8] == PNG_MAGIC and matplotlib.image.imread(plot).ndim == 3
    assert "stress test (step 8)" in captured.out and f"wrote {out} and {plot}" in captured.out
    # One pool for the whole server: under the shared key it had replaced the per-pool depths that
    # services read, with one none of them has.
    assert "published" not in captured.out and "which no service reads from Redis" in captured.err
    assert redis.Redis.from_url(redis_server.url).keys("windve:calibration:*") == []
    # The client times the server: its collector is set up as the server's own, start-up heap frozen.
    assert collector_when_measuring == [YOUNG_THRESHOLD]


def test_server_answering_busy_is_profiled_up_to_its_limit(sim_server_factory, tmp_path: Path, capsys) -> None:
    server = sim_server_factory("--limit", "6", "--per-query", "0.05")  # the requests of a round overlap
    out = tmp_path / "c.json"
    code = run_cli("--url", server.url, "--slo", "1", "--rounds", "2", "--out", str(out))
    assert code == 0, capsys.readouterr().err
    # Without --plot, the picture lands beside the JSON.
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    pool = load_calibration(out).pools["server"]
    # 1 and 4 are answered; a level past the 6 the server holds (16, or one the line aims at when the
    # machine is slow, and the settled crossing when the line puts it under that level) is refused.
    levels = pool.samples
    assert [(s.concurrency, s.rounds, s.failures) for s in levels[:2]] == [(1, 2, 0), (4, 2, 0)]
    assert all(s.rounds == 2 and (s.failures == 0 or s.concurrency > 6) for s in levels)
    refused = [s for s in levels if s.failures]
    assert refused and all("HTTP 429" in (s.first_error or "") for s in refused)
    out_text = capsys.readouterr().out
    assert f"p99 inf s > 0.85 s at C={refused[0].concurrency}" in out_text and "2 rounds per level" in out_text
    failed = re.search(r"server: \d+ of (\d+) requests at C=(\d+) failed \(ServerRefused: HTTP 429", out_text)
    assert failed and int(failed[1]) == 2 * int(failed[2])
    assert "give it deeper queues and static depth control (e.g. WINDVE_CPU_DEPTH=100000" in out_text
    # A refused level bounds the depth: the deepest level answered within the target, not the line's
    # crossing capped at the level refused.
    within = max(s.concurrency for s in levels if s.failures == 0 and s.p99 <= 0.85)
    assert pool.at(1.0).estimate == within < min(s.concurrency for s in refused)


@pytest.fixture
def served_by_sim_server(monkeypatch, tmp_path: Path) -> list[Path]:
    """`windve calibrate` starts the simulated server where it would start `windve serve`; each one records
    what it was started with, and that it stopped."""
    records: list[Path] = []

    def command(port: int) -> list[str]:
        records.append(tmp_path / f"server-{len(records)}.txt")
        record = ["--record", str(records[-1])]
        return [sys.executable, str(SIM_SERVER), "--port", str(port), "--per-query", "0.01", *record]

    monkeypatch.setattr(calibrate, "serve_command", command)
    return records


def test_by_default_a_server_is_started_for_each_pool_profiled_over_http_and_stopped(
    served_by_sim_server: list[Path], tmp_path: Path, capsys, collector_when_measuring: list[int]
) -> None:
    out = tmp_path / "c.json"
    code = run_cli("--slo", "0.5", "--rounds", "2", "--pools", "cpu", "--out", str(out))
    assert code == 0, capsys.readouterr().err
    calibration = load_calibration(out)
    assert list(calibration.pools) == ["cpu"] and calibration.pools["cpu"].at(0.5).estimate
    # The server held the cpu pool alone, with static depth control and depths that refuse nothing ...
    [record] = served_by_sim_server
    started, stopped = record.read_text().splitlines()
    env = json.loads(started)
    assert (env["WINDVE_DEVICE"], env["WINDVE_DEPTH_CONTROL"], env["WINDVE_CPU_DEPTH"]) == ("cpu", "static", "1000000")
    # ... and shut down on SIGTERM once the pool was profiled.
    assert stopped == "stopped"
    # The depths are for the service's full plan on this machine, as `windve serve` fingerprints it.
    import devices
    from windve.service import hardware_fingerprint, make_plan

    settings = load_settings()
    hardware = devices.detect_hardware(settings.sysfs_root)
    assert calibration.hardware_fingerprint == hardware_fingerprint(hardware, make_plan(settings, hardware), settings)
    assert collector_when_measuring == [YOUNG_THRESHOLD]


@pytest.mark.parametrize(
    ("signum", "said"),
    [(signal.SIGTERM, "stopped by SIGTERM"), (signal.SIGINT, "interrupted")],  # Ctrl-C had ended in a traceback
)
def test_sigterm_or_ctrl_c_stops_the_server_it_started(monkeypatch, tmp_path: Path, capsys, signum, said) -> None:
    """A Job's pod deleted, a `kill`, Ctrl-C: the `windve serve` started for a pool goes too, not left
    running without its parent."""

    def command(port: int) -> list[str]:  # slow queries: the profile is still running at the SIGTERM
        return [sys.executable, str(SIM_SERVER), "--port", str(port), "--per-query", "0.5"]

    monkeypatch.setattr(calibrate, "serve_command", command)
    servers: list[psutil.Process] = []

    def terminate_once_serving() -> None:
        deadline = time.monotonic() + 120
        while not servers and time.monotonic() < deadline:  # polls, with a deadline, for the server ...
            servers.extend(c for c in psutil.Process().children() if str(SIM_SERVER) in " ".join(c.cmdline()))
            time.sleep(0.05)
        port = servers[0].cmdline()[servers[0].cmdline().index("--port") + 1] if servers else "0"
        while time.monotonic() < deadline:  # ... and for it to serve: calibrate is profiling then
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        os.kill(os.getpid(), signum)  # calibrate's loop takes it from here (or the test dies)

    killer = threading.Thread(target=terminate_once_serving, daemon=True)
    killer.start()
    code = run_cli("--slo", "5", "--pools", "cpu", "--out", str(tmp_path / "c.json"))
    killer.join()
    err = capsys.readouterr().err
    assert code == 128 + signum and f"windve calibrate: {said}; the services it started are stopped" in err, (code, err)
    assert "Traceback" not in err
    (server,) = servers
    assert not server.is_running()  # stopped, and waited for, before calibrate ended
    assert not (tmp_path / "c.json").exists()


def test_the_cpu_layout_is_chosen_over_http_too(served_by_sim_server: list[Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.json"
    code = run_cli("--choose-cpu-layout", "--slo", "0.5", "--rounds", "1", "--out", str(out))
    assert code == 0, capsys.readouterr().err
    layout = load_calibration(out).cpu_layout
    assert layout is not None and layout.chosen == "per-node" and layout.trials[0].depth
    # A server per candidate layout, then one per pool of the chosen layout; each one stopped.
    assert len(served_by_sim_server) == len(layout.trials) + 1
    assert all(record.read_text().endswith("stopped\n") for record in served_by_sim_server)


def test_a_server_that_does_not_start_exits_1_with_its_output(monkeypatch, tmp_path: Path, capsys) -> None:
    failing = "import sys; print('no model here'); sys.exit(3)"
    monkeypatch.setattr(calibrate, "serve_command", lambda port: [sys.executable, "-c", failing])
    code = run_cli("--slo", "0.5", "--out", str(tmp_path / "c.json"))
    err = capsys.readouterr().err
    assert code == 1 and "the server exited with 3 before it was ready:\nno model here" in err
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_whose_cancellation_is_swallowed_still_stops_the_work(signum: int) -> None:
    """A cancellation that met the health check's HTTP request as it was answered was lost, and the
    profile ran on to its end after the SIGTERM (a loaded machine, one try in six); Ctrl-C, which
    asyncio.run cancels once, was lost so in the suite beside a CPU hog, and calibrate exited 0.
    The work is cancelled again until it ends."""
    swallowed: list[bool] = []

    async def work() -> None:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signum)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.append(True)  # lost, as an HTTP client's or 3.11's wait_for can lose one
        await asyncio.sleep(60)  # the profile going on

    started = time.monotonic()
    with pytest.raises(calibrate.Stopped) as stopped:
        asyncio.run(calibrate._until_terminated(work()))
    assert stopped.value.signum == signum
    assert swallowed == [True] and time.monotonic() - started < 30
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Python's again
