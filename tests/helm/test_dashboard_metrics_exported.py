"""Every metric the chart's dashboard and autoscaling query is exported by a running server."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from queried_metrics import QUERIED_METRICS


def test_every_queried_metric_is_in_metrics(server):
    assert httpx.post(server.url + "/embed", json={"inputs": ["a dashboard's first request"]}).status_code == 200
    assert httpx.post(server.url + "/embed", json={"inputs": []}).status_code == 422  # an error series too
    text = httpx.get(server.url + "/metrics").text
    exported = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    missing = sorted(QUERIED_METRICS - exported)
    assert not missing, f"the dashboard or autoscaler queries metrics /metrics lacks: {missing}"
