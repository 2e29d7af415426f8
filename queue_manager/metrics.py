"""Per-pool Prometheus metrics of the queue manager (default registry, labelled by pool)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

DEPTH = Gauge("windve_pool_depth", "Queue depth C_max of the pool, in queries", ["pool"])
IN_FLIGHT = Gauge("windve_pool_in_flight", "Queries admitted to the pool and not yet answered", ["pool"])
QUEUED = Gauge("windve_pool_queued", "Queries waiting in the pool's instance queues", ["pool"])
OCCUPANCY = Gauge(
    "windve_queue_occupancy", "In-flight queries / depth of the pool (autoscaling signal)", ["pool"]
)
HEALTHY = Gauge("windve_pool_healthy_instances", "Instances of the pool able to serve", ["pool"])
DISPATCHED = Counter("windve_pool_dispatched_queries", "Queries admitted to the pool", ["pool"])
BUSY = Counter("windve_busy_requests", "Requests answered BUSY because every eligible pool was full")
FAILOVERS = Counter(
    "windve_pool_failover_queries", "Queries moved off a failed instance of the pool", ["pool"]
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


class PoolMetrics:
    """The pool's metric children, looked up once: labels() costs more than the update."""

    def __init__(self, pool) -> None:  # queue_manager.pool.Pool; untyped to avoid an import cycle
        name = pool.name
        self.dispatched = DISPATCHED.labels(name)
        self.failovers = FAILOVERS.labels(name)
        self.failed = FAILED.labels(name)
        self.cancelled = CANCELLED.labels(name)
        self.batch_size = BATCH_SIZE.labels(name)
        self.queue_time = QUEUE_TIME.labels(name)
        self.inference_time = INFERENCE_TIME.labels(name)
        # Gauges read the live pool at scrape time: nothing to update on the hot path.
        DEPTH.labels(name).set_function(lambda: pool.depth)
        IN_FLIGHT.labels(name).set_function(lambda: pool.in_flight)
        QUEUED.labels(name).set_function(lambda: sum(len(slot.queue) for slot in pool.instances))
        OCCUPANCY.labels(name).set_function(lambda: pool.in_flight / pool.depth if pool.depth else 0.0)
        HEALTHY.labels(name).set_function(lambda: sum(slot.healthy for slot in pool.instances))
