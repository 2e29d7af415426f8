"""Every windve metric the chart's monitoring queries, by name as it appears in /metrics.

The dashboard (helm/windve/dashboards/windve.json), the prometheus-adapter rule
(helm/windve/autoscaling/prometheus-adapter-values.yaml), the KEDA query (templates/keda.yaml)
and the alerts (templates/prometheusrule.yaml) read these. test_dashboard.py, test_autoscaling.py
and test_alerts.py keep the lists equal to what those files query; a server test can check that
each one is exported.
"""

from __future__ import annotations

import re

DASHBOARD_METRICS: frozenset[str] = frozenset({
    # front end
    "windve_requests_total",
    "windve_errors_total",
    "windve_request_seconds_bucket",
    "windve_front_end_seconds_bucket",
    "windve_inputs_total",
    "windve_input_tokens_total",
    "windve_tokenization_seconds_bucket",
    "windve_request_input_tokens_bucket",
    # pools
    "windve_pool_depth",
    "windve_pool_in_flight",
    "windve_pool_queued",
    "windve_queue_occupancy",
    "windve_pool_healthy_instances",
    "windve_pool_dispatched_queries_total",
    "windve_pool_failover_queries_total",
    "windve_pool_failed_queries_total",
    "windve_batch_size_bucket",
    "windve_batch_tokens_bucket",
    "windve_queue_seconds_bucket",
    "windve_inference_seconds_bucket",
    "windve_engine_compute_seconds_sum",
    # adaptive depth control
    "windve_pool_fit_alpha_seconds",
    "windve_pool_fit_beta_seconds",
    "windve_pool_live_p99_seconds",
    "windve_pool_depth_changes_total",
    # engine processes
    "windve_engine_rss_bytes",
    "windve_engine_cpu_seconds_total",
})  # fmt: skip

# Occupancy = in flight / depth; the adapter discovers pods by the occupancy series itself.
AUTOSCALING_METRICS: frozenset[str] = frozenset({
    "windve_queue_occupancy",
    "windve_pool_serving",
    "windve_pool_in_flight",
    "windve_pool_depth",
})  # fmt: skip

# The PrometheusRule's alerts (templates/prometheusrule.yaml).
ALERT_METRICS: frozenset[str] = frozenset({
    "windve_request_seconds_count",
    "windve_request_seconds_bucket",
    "windve_errors_total",
    "windve_requests_total",
})  # fmt: skip

QUERIED_METRICS: frozenset[str] = DASHBOARD_METRICS | AUTOSCALING_METRICS | ALERT_METRICS

_METRIC = re.compile(r"\bwindve_[a-z0-9_]+\b")


def metric_names(promql: str) -> set[str]:
    """The windve metric names a PromQL expression (or adapter template) reads."""
    return set(_METRIC.findall(promql))
