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

Exit status: 0 when some step passed, 1 when none did, 2 on bad options or a server that
never became ready.
"""

# Locust first: importing it monkey-patches the process with gevent, which must happen
# before sockets, ssl or threads are created.
from locust.env import Environment  # isort: skip

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import gevent

from loadtest.exact_texts import text_source
from loadtest.locustfile import EmbedUser
from loadtest.recorder import Recorder, summarize
from loadtest.report import StepResult, SweepResult, conclusion, judge, table_header, table_row
from loadtest.sweep_options import add_sweep_arguments
from loadtest.workload import Workload

POLL_SECONDS = 0.1  # how often a step checks its request bound; its time bound is exact


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
) -> SweepResult:
    """Run the steps against `host` and return every step's figures and verdict."""
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
    try:
        for count in users:
            runner.start(count, spawn_rate=min(count, 100))
            runner.spawning_greenlet.join()
            gevent.sleep(warmup_seconds)
            recorder.take()
            seconds = _measure(recorder, step_seconds, max_requests_per_step)
            summary = summarize(recorder.take(), seconds, workload.slo_seconds, workload.texts_per_request)
            passed, reason = judge(summary, workload.slo_seconds, busy_disqualifies)
            step = StepResult(count, count * workload.texts_per_request, summary, passed, reason)
            result.steps.append(step)
            if on_step is not None:
                on_step(step)
            if not passed and not continue_after_fail:
                result.stopped_early = count != users[-1]
                break
    finally:
        runner.quit()
    return result


def _measure(recorder: Recorder, step_seconds: float, max_requests: int) -> float:
    started = time.monotonic()
    deadline = started + step_seconds
    while (now := time.monotonic()) < deadline:
        if max_requests and recorder.answered >= max_requests:
            break
        gevent.sleep(min(POLL_SECONDS, deadline - now))
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
    try:
        workload = Workload.from_options(args)
        if args.wait_ready > 0:
            wait_ready(args.host, args.wait_ready)
    except (ValueError, ServerNotReady) as exc:
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
            on_step=lambda step: print(table_row(step), flush=True),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        return 2
    print(conclusion(result), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 0 if result.best is not None else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_sweep_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
