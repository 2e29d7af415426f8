"""SLO concurrency sweep: run the Locust workload at increasing user counts and find the most
users (closed-loop, so queries in flight = users x texts per request) that a server serves
with p99 <= SLO, no errors and (by default) no BUSY answers.

    python -m loadtest.sweep --host http://127.0.0.1:8080 --users 1,2,4,8,16,32,64 --slo 1
    windve loadtest ...   (the same options)

Locust runs in-process as a library (one LocalRunner, users added step by step), which is
cheaper than a Locust subprocess per step on a small machine where the load generator
competes with the server for cores. Each step: add users, let them run --warmup-seconds
(not counted), then measure --step-seconds (or until --max-requests-per-step answers).
The sweep stops at the first failing step unless --continue-after-fail.

While a step runs, a progress line goes to stderr every --progress-seconds; the table goes
to stdout as steps finish. --plot (default: beside --json-out) draws p99 and goodput against
the number of clients, with the SLO line.

Ctrl-C (SIGINT) stops the sweep: the steps measured so far are printed, written (--json-out,
--plot) and the exit status is 130.

Exit status: 0 when some step passed, 1 when none did, 2 on bad options or a server that
never became ready, 130 when interrupted.
"""

# Locust first: importing it monkey-patches the process with gevent, which must happen
# before sockets, ssl or threads are created.
from locust.env import Environment  # isort: skip

import argparse
import json
import logging
import math
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gevent

from loadtest.exact_texts import text_source
from loadtest.locustfile import EmbedUser
from loadtest.recorder import Recorder, Summary, summarize
from loadtest.report import (
    StepResult,
    SweepResult,
    conclusion,
    judge,
    progress_line,
    table_header,
    table_row,
)
from loadtest.sweep_options import add_sweep_arguments
from loadtest.workload import Workload
from windve.output_files import check_writable

POLL_SECONDS = 0.1  # how often a step checks its request bound; its time bound is exact
ERRORS_SHOWN = 3  # distinct error messages printed per step (all of them are in --json-out)


class ServerNotReady(RuntimeError):
    pass


def run_sweep(
    host: str,
    workload: Workload,
    users: Sequence[int],
    step_seconds: float,
    warmup_seconds: float,
    max_requests_per_step: int = 0,
    busy_disqualifies: bool = True,
    continue_after_fail: bool = False,
    on_step: Callable[[StepResult], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
    progress_seconds: float = 0.0,
) -> SweepResult:
    """Run the steps against `host` and return every step's figures and verdict.

    With `on_progress` and `progress_seconds` > 0, a line is handed to `on_progress` when a
    step's warm-up starts and every `progress_seconds` of its measurement."""
    text_source(workload.tokenizer, workload.query_tokens)  # build (and check) texts before any load
    result = SweepResult(
        settings={
            "host": host,
            "route": workload.route,
            **workload.public(),
            "users": list(users),
            "step_seconds": step_seconds,
            "warmup_seconds": warmup_seconds,
            "max_requests_per_step": max_requests_per_step,
            "busy_disqualifies": busy_disqualifies,
        }
    )
    options = workload.to_options()
    options.headless = True  # read by Locust's runner
    options.enable_rebalancing = False
    env = Environment(user_classes=[EmbedUser], host=host, parsed_options=options)
    recorder = Recorder()
    env.events.request.add_listener(recorder.on_request)
    runner = env.create_local_runner()
    _quiet_ctrl_c()
    progress = _Progress(on_progress, progress_seconds, workload)
    try:
        for count in users:
            runner.start(count, spawn_rate=min(count, 100))
            runner.spawning_greenlet.join()
            progress.warming_up(count, warmup_seconds)
            gevent.sleep(warmup_seconds)
            recorder.take()
            report = progress.measuring(count, step_seconds)
            seconds = _measure(recorder, step_seconds, max_requests_per_step, report, progress.every)
            summary = summarize(recorder.take(), seconds, workload.slo_seconds, workload.texts_per_request)
            passed, reason = judge(summary, workload.slo_seconds, busy_disqualifies)
            step = StepResult(count, count * workload.texts_per_request, summary, passed, reason)
            result.steps.append(step)
            if on_step is not None:
                on_step(step)
            if not passed and not continue_after_fail:
                result.stopped_early = count != users[-1]
                break
    except KeyboardInterrupt:  # Ctrl-C: keep what was measured; the step under way is dropped
        result.interrupted = True
    finally:
        _quit(runner, result)
    return result


def _quiet_ctrl_c() -> None:
    """Ctrl-C is handled by the sweep; gevent's hub need not print it as an error first (it had,
    with a traceback, to a Ctrl-C while the sweep waited for /health)."""
    hub = gevent.get_hub()
    if KeyboardInterrupt not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)


def _quit(runner: Any, result: SweepResult) -> None:
    """Stop the users. A Ctrl-C can reach the main greenlet while they stop (gevent throws it there
    from the greenlet it interrupted): it had ended the sweep in a traceback, the steps measured lost."""
    for _ in range(3):
        try:
            runner.quit()
            return
        except KeyboardInterrupt:
            result.interrupted = True


class _Progress:
    """Progress lines of the running step; does nothing without a callback or an interval."""

    def __init__(self, on_progress: Callable[[str], None] | None, every: float, workload: Workload) -> None:
        self.on_progress = on_progress if every > 0 else None
        self.every = every
        self.workload = workload

    def warming_up(self, users: int, seconds: float) -> None:
        if self.on_progress is not None and seconds > 0:
            self.on_progress(f"  users {users}: running, {seconds:g} s of warm-up before measuring")

    def measuring(self, users: int, planned: float) -> Callable[[Recorder, float], None] | None:
        """A report for _measure: called with the recorder and the seconds measured so far."""
        if self.on_progress is None:
            return None
        report = self.on_progress

        def tell(recorder: Recorder, elapsed: float) -> None:
            summary: Summary = summarize(
                recorder.peek(), elapsed, self.workload.slo_seconds, self.workload.texts_per_request
            )
            report(progress_line(users, "measured", elapsed, planned, summary))

        return tell


def _measure(
    recorder: Recorder,
    step_seconds: float,
    max_requests: int,
    report: Callable[[Recorder, float], None] | None = None,
    report_every: float = 0.0,
) -> float:
    started = time.monotonic()
    deadline = started + step_seconds
    next_report = started + report_every if report is not None and report_every > 0 else math.inf
    while (now := time.monotonic()) < deadline:
        if max_requests and recorder.answered >= max_requests:
            break
        if now >= next_report:
            report(recorder, now - started)
            next_report = now + report_every
        gevent.sleep(min(POLL_SECONDS, deadline - now, max(0.0, next_report - now)))
    return time.monotonic() - started


def wait_ready(host: str, timeout_seconds: float) -> None:
    """Poll GET /health until it answers 200; raise ServerNotReady after the deadline."""
    deadline = time.monotonic() + timeout_seconds
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(f"{host}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
                last = f"HTTP {answer.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise ServerNotReady(f"{host}/health did not answer 200 within {timeout_seconds:g} s (last: {last})")
        gevent.sleep(0.2)  # poll interval, bounded by the deadline above


def run_from_args(args: argparse.Namespace) -> int:
    """Run a sweep from parsed options; print the table as steps finish; 0 / 1 / 2 (see module doc)."""
    logging.getLogger("locust").setLevel(logging.WARNING)  # its per-step ramp-up chatter is noise here
    plot = plot_path(args)
    try:
        workload = Workload.from_options(args)
        for path, flag in ((args.json_out, "--json-out"), (plot, "--plot")):
            if path is not None:
                check_writable(path, flag)
        text_source(workload.tokenizer, workload.query_tokens)  # a tokenizer or a length it cannot use
        if args.wait_ready > 0:
            _quiet_ctrl_c()
            print(f"waiting up to {args.wait_ready:g} s for {args.host}/health", file=sys.stderr, flush=True)
            wait_ready(args.host, args.wait_ready)
    except (ValueError, RuntimeError, OSError, ServerNotReady) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    print(
        f"sweep {args.host}{workload.route}: {workload.texts_per_request} text(s) x {workload.query_tokens} tokens "
        f"per request, SLO p99 <= {workload.slo_seconds:g} s, steps {args.warmup_seconds:g} s warm-up + "
        f"{args.step_seconds:g} s",
        flush=True,
    )
    print(table_header(), flush=True)
    try:
        result = run_sweep(
            args.host,
            workload,
            args.users,
            args.step_seconds,
            args.warmup_seconds,
            args.max_requests_per_step,
            busy_disqualifies=not args.busy_passes,
            continue_after_fail=args.continue_after_fail,
            on_step=_report_step,
            # stderr: stdout stays the table, which can be piped or saved as it is.
            on_progress=lambda line: print(line, file=sys.stderr, flush=True),
            progress_seconds=args.progress_seconds,
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    if result.interrupted:
        print("loadtest: interrupted; the step under way is not reported", file=sys.stderr, flush=True)
    print(conclusion(result), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    if plot is not None and result.steps:
        from loadtest.plot import plot_sweep

        plot_sweep(result, plot)
        print(f"wrote {plot}", flush=True)
    if result.interrupted:
        return 128 + signal.SIGINT
    return 0 if result.best is not None else 1


def _report_step(step: StepResult) -> None:
    """The step's table row, and on stderr what its errors said: a row that reads "2993 errors"
    says nothing of a missing API key or an input over the model's limit."""
    print(table_row(step), flush=True)
    for sample in step.summary.error_samples[:ERRORS_SHOWN]:
        print(f"  users {step.users}: error: {sample}", file=sys.stderr, flush=True)


def plot_path(args: argparse.Namespace) -> Path | None:
    """--plot, else the PNG beside --json-out, else none."""
    if args.plot is not None:
        return args.plot
    return args.json_out.with_suffix(".png") if args.json_out else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sweep_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
