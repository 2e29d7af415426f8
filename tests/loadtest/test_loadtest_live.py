"""Real Locust runs against real `windve serve` processes on 127.0.0.1.

Locust runs in a subprocess: importing it monkey-patches the importing process with
gevent, which the rest of the pytest session (asyncio, threads) must not get.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.loadtest.png_check import check_png
from tests.servers import ServerProcess, free_port, start_server

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO / "loadtest" / "locustfile.py"
DIMENSION = 384  # all-MiniLM-L6-v2
STEP_KEYS = {
    "users", "queries_in_flight", "passed", "reason", "seconds", "requests", "served", "busy", "errors",
    "busy_share", "slo_misses", "requests_per_second", "texts_per_second", "goodput_texts_per_second", "p50_ms",
    "p90_ms", "p99_ms", "max_ms", "dimensions", "error_samples",
}  # fmt: skip


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def sweep(
    entry: list[str], host: str, json_out: Path, *options: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, *entry, "--host", host, "--json-out", str(json_out), *options], timeout)


def interruptible(command: list[str]) -> subprocess.Popen[str]:
    """Started to take a terminal's Ctrl-C: SIGINT with its default action (a child of a
    non-interactive shell ignores it)."""
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def interrupted_at(command: list[str], line_start: str) -> tuple[int, str, str, str]:
    """Run `command`, send it SIGINT once a stderr line starts with `line_start`; its exit code,
    stdout, the stderr read until then and the rest of stderr."""
    proc = interruptible(command)
    try:
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith(line_start):
                proc.send_signal(signal.SIGINT)
                break
        stdout, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, stdout, "".join(seen), rest


def expected_verdict(step: dict[str, Any], slo_seconds: float) -> bool:
    """The sweep's rule, recomputed from the step's own figures."""
    return (
        step["errors"] == 0
        and step["busy"] == 0
        and step["served"] > 0
        and step["p99_ms"] <= slo_seconds * 1000.0
    )


def check_sweep_result(result: dict[str, Any], users: list[int]) -> None:
    """Structure, internal consistency, and the max being the largest passing step."""
    assert set(result) == {
        "settings", "steps", "stopped_early", "interrupted", "max_users", "max_queries_in_flight",
        "max_texts_per_second",
    }  # fmt: skip
    settings = result["settings"]
    steps = result["steps"]
    assert settings["users"] == users
    assert [step["users"] for step in steps] == users[: len(steps)]
    for step in steps:
        assert set(step) == STEP_KEYS
        assert step["requests"] == step["served"] + step["busy"] + step["errors"]
        assert step["queries_in_flight"] == step["users"] * settings["texts_per_request"]
        share = step["busy"] / step["requests"] if step["requests"] else 0.0
        assert step["busy_share"] == pytest.approx(share, abs=1e-4)
        assert step["requests_per_second"] == pytest.approx(step["served"] / step["seconds"], rel=0.01, abs=0.01)
        within_slo = (step["served"] - step["slo_misses"]) * settings["texts_per_request"]
        assert step["goodput_texts_per_second"] == pytest.approx(within_slo / step["seconds"], rel=0.01, abs=0.01)
        if step["served"]:
            assert step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["max_ms"]
            assert step["dimensions"] == [DIMENSION], "every served answer was checked as a real embedding"
        assert step["passed"] == expected_verdict(step, settings["slo_seconds"]), step
    passing = [step["users"] for step in steps if step["passed"]]
    assert result["max_users"] == (max(passing) if passing else None)
    if result["stopped_early"]:
        assert not steps[-1]["passed"] and len(steps) < len(users)


def test_headless_locust_run_serves_real_embeddings(loadtest_server: ServerProcess, tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    completed = run(
        [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "-u", "2", "-r", "2", "-t", "4s", "--host", loadtest_server.url,
            "--query-tokens", "75", "--summary-json", str(summary_path), "--json-file", str(tmp_path / "locust"),
        ],
        timeout=90,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    print(completed.stderr.splitlines()[-1] if completed.stderr else "")
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["served"] > 0
    assert summary["busy"] == 0  # two users of one text each fit the queue depth of 2
    assert summary["dimensions"] == [DIMENSION]
    rows = {row["name"]: row for row in json.loads((tmp_path / "locust.json").read_text())}
    # Locust's own counters agree with the recorder's: same requests, no failures, no BUSY row.
    assert rows["/embed"]["num_requests"] == summary["served"]
    assert rows["/embed"]["num_failures"] == 0
    assert set(rows) == {"/embed"}


def test_sweep_finds_max_concurrency(loadtest_server: ServerProcess, tmp_path: Path) -> None:
    json_out = tmp_path / "sweep.json"
    users = [1, 2, 4]
    completed = sweep(
        ["-m", "loadtest.sweep"], loadtest_server.url, json_out,
        "--users", "1,2,4", "--step-seconds", "2", "--warmup-seconds", "0.5", "--slo", "5",
        "--progress-seconds", "0.5",
    )  # fmt: skip
    print(completed.stdout, completed.stderr)
    result = json.loads(json_out.read_text())
    check_sweep_result(result, users)
    assert result["max_users"] is not None, completed.stdout
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert f"max concurrency within the 5 s SLO: {result['max_users']} users" in completed.stdout
    assert all(step["errors"] == 0 for step in result["steps"]), result
    # Progress while each step runs, on stderr: the warm-up, then counts every 0.5 s of the 2 s.
    for step in result["steps"]:
        lines = [line for line in completed.stderr.splitlines() if line.startswith(f"  users {step['users']}: ")]
        assert "warm-up" in lines[0], completed.stderr
        measured = [line for line in lines if " measured " in line]
        assert len(measured) >= 2 and all(" served, " in line and " p99 " in line for line in measured), lines
    assert "  users " not in completed.stdout  # stdout stays the table
    # The picture, beside --json-out by default.
    plot = json_out.with_suffix(".png")
    check_png(plot)
    assert f"wrote {plot}" in completed.stdout


def test_ctrl_c_keeps_the_steps_measured(loadtest_server: ServerProcess, tmp_path: Path) -> None:
    json_out = tmp_path / "sweep.json"
    command = [
        sys.executable, "-m", "loadtest.sweep", "--host", loadtest_server.url, "--json-out", str(json_out),
        "--users", "1,2", "--step-seconds", "6", "--warmup-seconds", "0.5", "--slo", "5",
    ]  # fmt: skip
    # The first step is measured once the second one starts.
    code, stdout, seen, rest = interrupted_at(command, "  users 2: running")
    stderr = seen + rest
    assert code == 130, stderr
    assert "interrupted; the step under way is not reported" in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    result = json.loads(json_out.read_text())
    check_sweep_result(result, [1, 2])
    assert result["interrupted"] and [step["users"] for step in result["steps"]] == [1]
    assert "max concurrency within the 5 s SLO: 1 users" in stdout and "(interrupted: of the 1 step(s)" in stdout
    check_png(json_out.with_suffix(".png"))


def test_busy_answers_are_counted_apart_from_errors(loadtest_server: ServerProcess, tmp_path: Path) -> None:
    """Four users against a queue depth of 2: BUSY is certain; it fails the step without being an error."""
    json_out = tmp_path / "sweep.json"
    completed = sweep(
        ["-m", "windve.cli", "loadtest"], loadtest_server.url, json_out,
        "--users", "4", "--step-seconds", "2", "--warmup-seconds", "0.5", "--slo", "5", "--api", "openai",
        "--plot", str(tmp_path / "crowded.png"),
    )  # fmt: skip
    print(completed.stdout)
    result = json.loads(json_out.read_text())
    check_sweep_result(result, [4])
    (crowded,) = result["steps"]
    assert crowded["busy"] > 0 and crowded["errors"] == 0, crowded
    assert crowded["served"] > 0  # OpenAI-shape answers, each checked as real embeddings
    assert not crowded["passed"] and "BUSY" in crowded["reason"]
    assert result["max_users"] is None and completed.returncode == 1
    assert "BUSY" in completed.stdout and "errors" in completed.stdout
    check_png(tmp_path / "crowded.png")  # --plot given: there, and not beside --json-out
    assert not json_out.with_suffix(".png").exists()


def test_a_step_that_fails_on_errors_says_what_they_were(loadtest_server: ServerProcess, tmp_path: Path) -> None:
    # 1,000-token queries, sent with truncate: false: the model (256 tokens) refuses every one
    completed = sweep(
        ["-m", "windve.cli", "loadtest"], loadtest_server.url, tmp_path / "errors.json",
        "--users", "1", "--step-seconds", "1", "--warmup-seconds", "0", "--slo", "5", "--query-tokens", "1000",
    )  # fmt: skip
    assert completed.returncode == 1 and "errors" in completed.stdout
    (said,) = [line for line in completed.stderr.splitlines() if line.startswith("  users 1: error: ")]
    assert "HTTP 422" in said and "limit" in said, completed.stderr


def test_sweep_refuses_to_start_without_a_ready_server(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    completed = sweep(["-m", "loadtest.sweep"], closed, tmp_path / "none.json", "--wait-ready", "0.5", timeout=60)
    assert completed.returncode == 2
    assert "did not answer 200" in completed.stderr
    assert not (tmp_path / "none.json").exists()


def test_users_pace_their_asks_when_no_server_answers(tmp_path: Path) -> None:
    """A refused connection fails in microseconds: users that asked again at once counted 4,509
    errors in 3 s against a server that died mid-step. They wait 0.1 s after no answer."""
    closed = f"http://127.0.0.1:{free_port()}"
    json_out = tmp_path / "none.json"
    completed = sweep(
        ["-m", "windve.cli", "loadtest"], closed, json_out,
        "--wait-ready", "0", "--users", "1", "--step-seconds", "2", "--warmup-seconds", "0",
    )  # fmt: skip
    assert completed.returncode == 1, completed.stderr
    (step,) = json.loads(json_out.read_text())["steps"]
    assert 1 <= step["errors"] <= 40, step  # about 20 in 2 s, thousands before


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # Users had spun on a traceback each (198 in 2 s) and the step read as the server's failure.
        (("--query-tokens", "100000"), "100000 tokens is more text than 1000 sentences of the corpus make"),
        (("--tokenizer", "/nonexistent"), "model folder /nonexistent does not exist"),  # not the hub's id rules
    ],
)
def test_what_cannot_make_a_query_exits_2_before_any_load(options: tuple[str, ...], message: str, tmp_path: Path):
    closed = f"http://127.0.0.1:{free_port()}"  # never asked: the texts are checked first
    completed = sweep(["-m", "windve.cli", "loadtest"], closed, tmp_path / "x.json", "--wait-ready", "0", *options)
    assert completed.returncode == 2, completed.stderr
    assert f"loadtest: {message}" in completed.stderr and "Traceback" not in completed.stderr
    assert "sweep " not in completed.stdout  # the sweep's header comes after the checks


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # A step of inf seconds never ended; an SLO of nan passed every step; -5 answers failed every one.
        (("--step-seconds", "inf"), "expected a finite number"),
        (("--warmup-seconds", "nan"), "expected a finite number"),
        (("--slo", "nan"), "slo must be positive finite seconds"),
        (("--slo", "inf"), "slo must be positive finite seconds"),
        (("--max-requests-per-step", "-5"), "expected zero or a positive whole number"),
        # /v1 had been put before /health and the route: it waited on 404s, saying nothing.
        (("--host", "http://127.0.0.1:1/v1"), "without the route (it comes from --api)"),
        (("--host", "http://127.0.0.1:1/gateway/embed"), "without the route (it comes from --api)"),
        # The sweep ran to its end, then lost its figures in a FileNotFoundError traceback.
        (("--json-out", "/proc/sweep.json"), "--json-out /proc/sweep.json is not writable"),
    ],
)
def test_bad_options_exit_2_before_any_load(options: tuple[str, ...], message: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    completed = run(
        [sys.executable, "-m", "windve.cli", "loadtest", "--host", closed, "--wait-ready", "0", *options], timeout=60
    )
    assert completed.returncode == 2, completed.stderr
    assert message in completed.stderr and "Traceback" not in completed.stderr
    assert "sweep " not in completed.stdout


def test_ctrl_c_while_waiting_for_the_server_is_one_line() -> None:
    """It had printed KeyboardInterrupt and a timestamp to stdout, then gevent's traceback."""
    closed = f"http://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "windve.cli", "loadtest", "--host", closed, "--wait-ready", "60"]
    code, stdout, _, stderr = interrupted_at(command, "waiting up to 60 s for")
    assert code == 130, stderr
    assert stderr.strip() == "windve loadtest: interrupted" and stdout == ""


def test_a_ctrl_c_while_the_users_stop_keeps_the_result() -> None:
    """gevent throws a Ctrl-C into the main greenlet from the one it interrupted, which can be while
    the sweep stops its users: that had ended the sweep in a traceback, its steps lost."""
    script = """
from loadtest.report import SweepResult
from loadtest.sweep import _quit

class Runner:
    calls = 0
    def quit(self):
        Runner.calls += 1
        if Runner.calls == 1:
            raise KeyboardInterrupt

result = SweepResult(settings={})
_quit(Runner(), result)
print(Runner.calls, result.interrupted)
"""
    completed = run([sys.executable, "-c", script], timeout=60)  # its own process: Locust patches with gevent
    assert completed.stdout.split() == ["2", "True"], completed.stderr


@pytest.mark.slow
def test_long_sweep_with_default_steps(tmp_path: Path) -> None:
    """The full default ladder (20 s steps after 5 s warm-up) at the 1 s SLO, 75-token queries,
    against a server whose queue depth comes from its own warm-up probe for that SLO."""
    server = start_server(tmp_path, "--cache-size", "0", "--slo-seconds", "1")
    try:
        json_out = tmp_path / "sweep.json"
        users = [1, 2, 4, 8, 16, 32, 64]
        completed = sweep(["-m", "loadtest.sweep"], server.url, json_out, "--slo", "1", timeout=900)
    finally:
        server.stop()
    print(completed.stdout)
    result = json.loads(json_out.read_text())
    check_sweep_result(result, users)
    assert all(step["errors"] == 0 for step in result["steps"]), result
