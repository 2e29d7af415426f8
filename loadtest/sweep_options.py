"""Command-line options of the sweep (`python -m loadtest.sweep`, `windve loadtest`).

No Locust import here: `windve` builds every subcommand's parser at start-up, and importing
Locust monkey-patches the process with gevent, which only the load generator may do.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from urllib.parse import urlsplit

from loadtest.workload import add_workload_arguments

DEFAULT_HOST = "http://127.0.0.1:8080"
DEFAULT_USERS = "1,2,4,8,16,32,64"
ROUTE_ENDINGS = ("/v1", "/embed", "/embeddings", "/health")


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        type=http_url,
        default=DEFAULT_HOST,
        help="server to load (default %(default)s, loopback); the sweep only ever loads the URL given here",
    )
    parser.add_argument(
        "--users",
        type=positive_int_list,
        default=positive_int_list(DEFAULT_USERS),
        metavar="N,N,...",
        help=f"closed-loop user counts to try, ascending (default {DEFAULT_USERS})",
    )
    parser.add_argument(
        "--step-seconds", type=positive_float, default=20.0, help="measured time per step (default %(default)s)"
    )
    parser.add_argument(
        "--warmup-seconds",
        type=non_negative_float,
        default=5.0,
        help="time per step after the users are running and before measuring; excluded from stats "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--max-requests-per-step",
        type=non_negative_int,
        default=0,
        help="end a step's measurement early after this many answers (default 0: time only)",
    )
    parser.add_argument(
        "--continue-after-fail",
        action="store_true",
        help="keep going after a step fails the SLO (default: stop at the first failing step)",
    )
    parser.add_argument(
        "--busy-passes",
        action="store_true",
        help="let a step with BUSY (429) answers pass when its served answers meet the SLO "
        "(default: any BUSY answer fails the step, as requests refused are not served within the SLO)",
    )
    parser.add_argument(
        "--wait-ready",
        type=non_negative_float,
        default=60.0,
        help="seconds to wait for GET /health to answer 200 before the first step "
        "(0: do not check; default %(default)s)",
    )
    parser.add_argument(
        "--progress-seconds",
        type=non_negative_float,
        default=5.0,
        help="while a step runs, print its counts so far to stderr this often (0: only the table; "
        "default %(default)s)",
    )
    parser.add_argument("--json-out", type=Path, help="also write the sweep's result as JSON to this file")
    parser.add_argument(
        "--plot",
        type=Path,
        help="write a PNG of p99 latency and goodput against clients, with the SLO line "
        "(default: beside --json-out, its name ending .png; none without --json-out)",
    )
    add_workload_arguments(parser)


def http_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s)://host[:port] URL, got {text!r}")
    path = parts.path.rstrip("/")
    if parts.query or parts.fragment or path.endswith(ROUTE_ENDINGS):
        # The sweep adds /health and the route (--api): ".../v1", an OpenAI client's base URL, asked
        # /v1/health and waited on 404s. A proxy's prefix (http://gateway/windve) stays allowed.
        raise argparse.ArgumentTypeError(
            f"expected the server's base URL, http(s)://host[:port][/prefix], without the route "
            f"(it comes from --api), got {text!r}"
        )
    return text.rstrip("/")


def positive_int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4], ascending and without repeats."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected positive user counts, got {text!r}")
    return values


def positive_float(text: str) -> float:
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or a positive number, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected zero or a positive whole number, got {text!r}")
    return value


def _number(kind: type[int] | type[float], text: str) -> float:
    """`kind(text)`, finite: float() takes "nan" and "inf", and a step of inf seconds never ended,
    an SLO of nan passed every step."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
