"""HTTP-level Prometheus metrics (the queue manager exports the per-pool ones)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from queue_manager.metrics import LATENCY_BUCKETS

# Tokenizing a request takes from tens of microseconds (one short text) to about a second (a full body).
TOKENIZATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Tokens of one request: from one short text to 2048 inputs at 512 tokens.
TOKEN_COUNT_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536, 262144, 1048576)

REQUESTS = Counter("windve_requests", "HTTP embedding requests answered", ["route", "status"])
ERRORS = Counter("windve_errors", "Embedding requests answered with an error", ["route", "error_type"])
LATE = Counter(
    "windve_late_refusals",
    "Embedding requests refused (429) because they waited in a parked connection longer than the SLO leaves "
    "beyond the pools' live p99",
)
TOKENS = Counter("windve_input_tokens", "Tokens of the inputs embedded (after truncation)")
INPUTS = Counter("windve_inputs", "Texts embedded")
# Answers only: under a storm, thousands of instant refusals would pull the p99 down exactly when the
# accepted requests miss the SLO. Refusals and errors are counted in REQUESTS and ERRORS.
E2E_TIME = Histogram(
    "windve_request_seconds", "End-to-end time of an embedding request answered with embeddings, from its arrival",
    ["route"], buckets=LATENCY_BUCKETS,
)
# The front end's share of a request's time, apart from the dispatcher's and the engines': a tail that
# lives here (a busy front end, the slow lane) is not the pools' doing.
FRONT_END_TIME = Histogram(
    "windve_front_end_seconds",
    "Time from an embedding request's arrival to its hand-over to the dispatcher (reading, validating, "
    "tokenizing, waiting for the front end's event loop)",
    buckets=LATENCY_BUCKETS,
)
TOKENIZATION_TIME = Histogram(
    "windve_tokenization_seconds", "Time to tokenize the inputs of one embedding request not found in the cache",
    buckets=TOKENIZATION_BUCKETS,
)
REQUEST_TOKENS = Histogram(
    "windve_request_input_tokens", "Tokens of one embedding request's inputs (after truncation)",
    buckets=TOKEN_COUNT_BUCKETS,
)
