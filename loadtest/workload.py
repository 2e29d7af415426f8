"""What one simulated user sends: the workload parameters, shared by the locustfile and the sweep.

Every parameter is a command-line option and a `LOCUST_<NAME>` environment variable (the
variable sets the option's default), the same in `locust -f loadtest/locustfile.py`,
`python -m loadtest.sweep` and `windve loadtest`. This module imports neither Locust nor
gevent, so the `windve` CLI can build its parser without monkey-patching the process.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["tei", "openai"]
APIS: tuple[str, ...] = ("tei", "openai")
ROUTES: dict[str, str] = {"tei": "/embed", "openai": "/v1/embeddings"}
DEFAULT_OPENAI_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Workload:
    api: Api = "tei"
    texts_per_request: int = 1
    query_tokens: int = 75  # the paper's query length, [CLS] and [SEP] included
    slo_seconds: float = 1.0
    model: str = DEFAULT_OPENAI_MODEL  # the OpenAI body's `model` field
    tokenizer: str | None = None  # model folder, tokenizer.json or cached model id; None = bundled model
    busy_wait_seconds: float = 0.1  # a refused user's pause before its next request
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token; never written out

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.texts_per_request < 1:
            raise ValueError(f"texts-per-request must be at least 1, not {self.texts_per_request}")
        if self.query_tokens < 3:
            raise ValueError(
                f"query-tokens must be at least 3 (two special tokens and a word), not {self.query_tokens}"
            )
        # Chained comparisons are false for NaN: an SLO of NaN had passed every step.
        if not 0 < self.slo_seconds < math.inf:
            raise ValueError(f"slo must be positive finite seconds, not {self.slo_seconds}")
        if not 0 <= self.busy_wait_seconds < math.inf:
            raise ValueError(f"busy-wait must be zero or positive finite seconds, not {self.busy_wait_seconds}")

    @property
    def route(self) -> str:
        return ROUTES[self.api]

    def to_options(self) -> argparse.Namespace:
        """The inverse of from_options: what Locust users read from `environment.parsed_options`."""
        return argparse.Namespace(
            api=self.api,
            texts_per_request=self.texts_per_request,
            query_tokens=self.query_tokens,
            slo=self.slo_seconds,
            model=self.model,
            tokenizer=self.tokenizer or "",
            busy_wait=self.busy_wait_seconds,
            api_key=self.api_key or "",
        )

    @classmethod
    def from_options(cls, options: Any) -> "Workload":
        """From parsed options (argparse or Locust's), which carry the attributes added below."""
        return cls(
            api=options.api,
            texts_per_request=options.texts_per_request,
            query_tokens=options.query_tokens,
            slo_seconds=options.slo,
            model=options.model,
            tokenizer=options.tokenizer or None,
            busy_wait_seconds=options.busy_wait,
            api_key=options.api_key or None,
        )

    def public(self) -> dict[str, Any]:
        """The parameters worth recording with results (everything but the API key)."""
        return {name: value for name, value in self.__dict__.items() if name != "api_key"}

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


# (flag, type, default, help); the env variable LOCUST_<FLAG> overrides the default.
_WORKLOAD_OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--api", str, "tei", "request shape: tei (POST /embed) or openai (POST /v1/embeddings)"),
    ("--texts-per-request", int, 1, "texts in each request (queries in flight per user)"),
    ("--query-tokens", int, 75, "tokens per text, special tokens included (exact, by the model's tokenizer)"),
    ("--slo", float, 1.0, "latency SLO in seconds: answers slower than this count as misses"),
    ("--model", str, DEFAULT_OPENAI_MODEL, "`model` field of OpenAI-shape requests"),
    (
        "--tokenizer",
        str,
        "",
        "tokenizer that sets the exact text length: a model folder, a tokenizer.json or a cached model id "
        "(default: the bundled all-MiniLM-L6-v2; use the served model's when measuring a peer)",
    ),
    (
        "--busy-wait",
        float,
        0.1,
        "seconds a user pauses after a BUSY (429) answer before its next request, as a client backing off; "
        "0 sends at once, which makes refused users spin and steal the server's CPU",
    ),
    ("--api-key", str, "", "API key sent as `Authorization: Bearer <key>` (servers started with an API key)"),
)


def env_name(flag: str) -> str:
    return "LOCUST_" + flag.lstrip("-").replace("-", "_").upper()


def add_workload_arguments(parser: Any) -> None:
    """Add the workload options to an argparse parser or Locust's (configargparse) parser."""
    for flag, kind, default, help_text in _WORKLOAD_OPTIONS:
        env = env_name(flag)
        parser.add_argument(
            flag,
            type=kind,
            default=kind(os.environ.get(env, default)),
            choices=APIS if flag == "--api" else None,
            help=f"{help_text} (env {env}; default: %(default)s)",
        )

