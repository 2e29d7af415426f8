"""Locust workload for an embedding service: closed-loop users sending exact-length texts.

Each user sends one request of N texts (--texts-per-request, default 1) of exactly L tokens
(--query-tokens, default 75, special tokens included, counted with the model's tokenizer),
waits for the answer and sends the next at once (the paper's closed loop: concurrency =
users x N queries in flight). Texts are drawn at random from the shipped corpus, so they
rarely repeat and a server-side embedding cache is mostly missed, as with RAG traffic.

Outcomes, as Locust's stats rows and the summary printed at the end of a run:
- served: HTTP 200 holding one finite vector per text (checked for every answer);
- BUSY: HTTP 429, counted apart from errors in its own row ("<route> BUSY");
- error: anything else (other status, bad body, connection failure);
- SLO miss: a served answer slower than --slo seconds (not an error).
A user refused with BUSY pauses --busy-wait seconds (default 0.1) before its next request.

    locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 30s --host http://127.0.0.1:8080 \
        --api tei --texts-per-request 1 --query-tokens 75 --slo 1

Use `--api openai --model NAME` for OpenAI-shape servers (Infinity, WindVE's /v1/embeddings),
and `--tokenizer` with the peer's model so lengths are exact for its tokenizer.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import gevent
from locust import FastHttpUser, constant, events, task
from locust.runners import MasterRunner

from loadtest.api_shapes import NotAnEmbedding, embedding_dimension, request_body
from loadtest.exact_texts import ExactLengthTexts, text_source
from loadtest.recorder import BUSY_SUFFIX, Recorder, summarize
from loadtest.workload import Workload, add_workload_arguments

BUSY_STATUS = 429
SERVED, BUSY, ERROR = "served", "busy", "error"


class EmbedUser(FastHttpUser):
    """One closed-loop client: send, wait for the answer, send again (no think time)."""

    host = "http://127.0.0.1:8080"
    wait_time = constant(0)
    network_timeout = 120.0  # far above any SLO: a slow answer is a miss to measure, not a timeout
    connection_timeout = 10.0

    workload: Workload
    texts: ExactLengthTexts

    def on_start(self) -> None:
        self.workload = Workload.from_options(self.environment.parsed_options)
        self.texts = text_source(self.workload.tokenizer, self.workload.query_tokens)
        self.rng = random.Random()
        self.auth_headers = self.workload.headers()

    @task
    def embed(self) -> None:
        workload = self.workload
        texts = self.texts.sample_many(workload.texts_per_request, self.rng)
        route = workload.route
        body = request_body(workload, texts)
        with self.client.post(route, json=body, headers=self.auth_headers, name=route, catch_response=True) as response:
            outcome = classify(response, workload, len(texts))
        if outcome == BUSY and workload.busy_wait_seconds:
            gevent.sleep(workload.busy_wait_seconds)
        elif outcome == ERROR and not response.status_code:
            # No answer at all (refused, reset): a server that died mid-step. Asking again at once
            # only counts thousands of errors a second (4,509 in 3 s) without measuring anything.
            gevent.sleep(NO_ANSWER_WAIT_SECONDS)


NO_ANSWER_WAIT_SECONDS = 0.1


def classify(response: Any, workload: Workload, texts: int) -> str:
    """Mark a response (Locust's ResponseContextManager) as SERVED, BUSY or ERROR, and say which."""
    status = response.status_code
    if status == BUSY_STATUS:
        response.request_meta["name"] += BUSY_SUFFIX
        response.success()
        return BUSY
    if status != 200:
        body = (response.content or b"")[:200].decode(errors="replace")
        detail = body or getattr(response, "error", None) or "no answer"
        response.failure(f"HTTP {status}: {detail}")
        return ERROR
    try:
        dimension = embedding_dimension(workload, response.content, texts)
    except NotAnEmbedding as exc:
        response.failure(f"not an embedding: {exc}")
        return ERROR
    response.request_meta["context"]["dimension"] = dimension
    response.success()
    return SERVED


# ---- `locust -f loadtest/locustfile.py` only: options, and a summary with exact percentiles ----
# (the sweep builds its own Environment with its own event hooks, so none of these fire there)


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    add_workload_arguments(parser)
    parser.add_argument(
        "--summary-json",
        default="",
        help="write the end-of-run summary (served, BUSY, errors, SLO misses, exact latency percentiles) to this file",
    )


class _CliRun:
    recorder: Recorder | None = None
    started = 0.0


@events.init.add_listener
def _on_init(environment: Any, **_: Any) -> None:
    if isinstance(environment.runner, MasterRunner) or environment.parsed_options is None:
        return  # in distributed runs the workers count; the master shows Locust's own stats
    try:
        workload = Workload.from_options(environment.parsed_options)
        text_source(workload.tokenizer, workload.query_tokens)  # fail now, not in every user
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"loadtest: {exc}", file=sys.stderr)
        sys.exit(2)
    _CliRun.recorder = Recorder()
    environment.events.request.add_listener(_CliRun.recorder.on_request)


@events.test_start.add_listener
def _on_test_start(environment: Any, **_: Any) -> None:
    if _CliRun.recorder is not None:
        _CliRun.recorder.take()
        _CliRun.started = time.monotonic()


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_: Any) -> None:
    if _CliRun.recorder is None:
        return
    workload = Workload.from_options(environment.parsed_options)
    summary = summarize(
        _CliRun.recorder.take(), time.monotonic() - _CliRun.started, workload.slo_seconds, workload.texts_per_request
    )
    print(
        f"windve loadtest summary: {summary.served} served, {summary.busy} BUSY ({summary.busy_share:.1%}), "
        f"{summary.errors} errors, {summary.slo_misses} over the {workload.slo_seconds:g} s SLO; "
        f"{summary.requests_per_second} req/s, {summary.texts_per_second} texts/s; "
        f"latency ms p50 {summary.p50_ms} p90 {summary.p90_ms} p99 {summary.p99_ms} max {summary.max_ms}",
        file=sys.stderr,
    )
    target = getattr(environment.parsed_options, "summary_json", "")
    if target:
        body = {"workload": workload.public(), "host": environment.host} | summary.to_dict()
        Path(target).write_text(json.dumps(body, indent=2) + "\n")
