"""`windve loadtest`: the SLO concurrency sweep of `loadtest/` (same as `python -m loadtest.sweep`)."""

from __future__ import annotations

import argparse

from loadtest.sweep_options import add_sweep_arguments


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "loadtest",
        help="find the most concurrent users a server serves within an SLO (Locust sweep)",
        description="Run closed-loop Locust users at increasing counts against a running server "
        "(loopback by default) and report, per step, throughput, goodput, BUSY share, errors and latency "
        "percentiles, and the largest user count served with p99 <= SLO, no errors and no BUSY. "
        "Progress goes to stderr while a step runs; --plot (or --json-out) also draws p99 and goodput "
        "against the user count with the SLO line (PNG).",
    )
    add_sweep_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # Imported here, not at the top: Locust monkey-patches the whole process with gevent on
    # import, which `windve serve` and the other commands (all parsers are built at start-up)
    # must never get.
    from loadtest.sweep import run_from_args

    return run_from_args(args)
