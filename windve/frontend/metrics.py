"""HTTP-level Prometheus metrics (the queue manager exports the per-pool ones)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from queue_manager.metrics import LATENCY_BUCKETS

REQUESTS = Counter("windve_requests", "HTTP embedding requests answered", ["route", "status"])
ERRORS = Counter("windve_errors", "Embedding requests answered with an error", ["route", "error_type"])
TOKENS = Counter("windve_input_tokens", "Tokens of the inputs embedded (after truncation)")
INPUTS = Counter("windve_inputs", "Texts embedded")
E2E_TIME = Histogram(
    "windve_request_seconds", "End-to-end time of an embedding request", ["route"], buckets=LATENCY_BUCKETS
)
