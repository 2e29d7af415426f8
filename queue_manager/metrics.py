"""Per-pool Prometheus metrics of the queue manager (default registry, labelled by pool)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Enum, Gauge, Histogram

from queue_manager.depth_control import CAUSES, NEAR_SLO, OVER_SLO, ROOM, SEEDED

if TYPE_CHECKING:
    from queue_manager.manager import QueueManager
    from queue_manager.pool import Pool

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)

DEPTH = Gauge("windve_pool_depth", "Queue depth C_max of the pool, in queries", ["pool"])
IN_FLIGHT = Gauge("windve_pool_in_flight", "Queries admitted to the pool and not yet answered", ["pool"])
QUEUED = Gauge("windve_pool_queued", "Queries waiting in the pool's instance queues", ["pool"])
OCCUPANCY = Gauge(
    "windve_queue_occupancy",
    "In-flight queries / depth of the pool while it serves clients, else 0 (autoscaling signal)",
    ["pool"],
)
# The autoscaling queries weigh in-flight queries by it: the warm-up probe's (occupancy 0.25-0.5
# for ~20 s) had read as demand, and each starting pod asked for most of another.
SERVING = Gauge(
    "windve_pool_serving",
    "1 while the pool serves clients; 0 while the warm-up probe sets depths or the service drains",
    ["pool"],
)
HEALTHY = Gauge("windve_pool_healthy_instances", "Instances of the pool able to serve", ["pool"])
DISPATCHED = Counter("windve_pool_dispatched_queries", "Queries admitted to the pool", ["pool"])
BUSY = Counter("windve_busy_requests", "Requests answered BUSY because every eligible pool was full")
UNAVAILABLE = Counter(
    "windve_unavailable_requests", "Requests refused because no eligible pool had an instance able to serve"
)
BULK_REQUESTS = Counter("windve_bulk_requests", "Requests admitted in parts because the pools had no room for all")
BULK_WAITING = Gauge("windve_bulk_waiting_queries", "Queries of bulk requests not yet admitted to a pool")
FAILOVERS = Counter(
    "windve_pool_failover_queries",
    "Queries moved off a failed instance of the pool, to another of its instances or another pool",
    ["pool"],
)
FAILED = Counter("windve_pool_failed_queries", "Admitted queries answered with an error", ["pool"])
CANCELLED = Counter(
    "windve_pool_cancelled_queries", "Queued queries dropped because the client went away", ["pool"]
)
BATCH_SIZE = Histogram("windve_batch_size", "Queries per batch", ["pool"], buckets=BATCH_BUCKETS)
QUEUE_TIME = Histogram(
    "windve_queue_seconds", "Time a query waited before its batch started", ["pool"], buckets=LATENCY_BUCKETS
)
INFERENCE_TIME = Histogram(
    "windve_inference_seconds", "Time an instance took for one batch", ["pool"], buckets=LATENCY_BUCKETS
)
BATCH_TOKENS = Histogram(
    "windve_batch_tokens", "Padded tokens per batch (queries x the longest)", ["pool"], buckets=TOKEN_BUCKETS
)
SEED_DEPTH = Gauge("windve_pool_seed_depth", "Calibrated or probed depth the depth control starts from", ["pool"])
FIT_ALPHA = Gauge("windve_pool_fit_alpha_seconds", "Live fit t = alpha*C + beta: alpha", ["pool"])
FIT_BETA = Gauge("windve_pool_fit_beta_seconds", "Live fit t = alpha*C + beta: beta", ["pool"])
LIVE_P99 = Gauge("windve_pool_live_p99_seconds", "p99 of the answer times callers reported recently", ["pool"])
DEPTH_CHANGES = Counter("windve_pool_depth_changes", "Moves of the depth control", ["pool", "direction", "cause"])
LAST_MOVE = Enum("windve_pool_depth_last_move", "Why the depth last moved", ["pool"], states=list(CAUSES))
LAST_MOVE_AT = Gauge(
    "windve_pool_depth_last_move_timestamp_seconds", "Unix time of the depth's last move (or seed)", ["pool"]
)


class PoolMetrics:
    """The pool's metric children, looked up once: labels() costs more than the update."""

    def __init__(self, pool: Pool, manager: QueueManager) -> None:
        name = pool.name
        self.dispatched = DISPATCHED.labels(name)
        self.failovers = FAILOVERS.labels(name)
        self.failed = FAILED.labels(name)
        self.cancelled = CANCELLED.labels(name)
        self.batch_size = BATCH_SIZE.labels(name)
        self.queue_time = QUEUE_TIME.labels(name)
        self.inference_time = INFERENCE_TIME.labels(name)
        self.batch_tokens = BATCH_TOKENS.labels(name)
        self._moves = {
            (direction, cause): DEPTH_CHANGES.labels(name, direction, cause)
            for direction, cause in (("down", OVER_SLO), ("down", NEAR_SLO), ("up", ROOM))
        }
        self._last_move = LAST_MOVE.labels(name)
        self._last_move_at = LAST_MOVE_AT.labels(name)
        self.seeded()
        # Gauges read the live pool at scrape time: nothing to update on the hot path.
        DEPTH.labels(name).set_function(lambda: pool.depth)
        IN_FLIGHT.labels(name).set_function(lambda: pool.in_flight)
        QUEUED.labels(name).set_function(lambda: sum(len(slot.queue) for slot in pool.instances))

        def serving() -> bool:
            return manager.serving and not manager.draining

        SERVING.labels(name).set_function(lambda: float(serving()))
        OCCUPANCY.labels(name).set_function(lambda: pool.in_flight / pool.depth if pool.depth and serving() else 0.0)
        HEALTHY.labels(name).set_function(lambda: sum(slot.healthy for slot in pool.instances))
        SEED_DEPTH.labels(name).set_function(lambda: pool.seed_depth)
        FIT_ALPHA.labels(name).set_function(lambda: _fit_part(pool, "alpha"))
        FIT_BETA.labels(name).set_function(lambda: _fit_part(pool, "beta"))
        LIVE_P99.labels(name).set_function(lambda: _or_nan(pool.control.current_p99))

    def moved(self, direction: str, cause: str) -> None:
        self._moves[direction, cause].inc()
        self._last_move.state(cause)
        self._last_move_at.set(time.time())

    def seeded(self) -> None:
        """The depth was set from outside the control (start, calibration, probe)."""
        self._last_move.state(SEEDED)
        self._last_move_at.set(time.time())


def _fit_part(pool: Pool, name: str) -> float:
    fit = pool.control.current_fit
    return getattr(fit, name) if fit is not None else math.nan


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value
