"""The PrometheusRule's alerts: answers over the SLO read at the right histogram bound, and the BUSY
share; each over this release's server pods only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helm_render import FULLNAME, NAMESPACE, Release, render, values_file
from prometheus_client.utils import floatToGoString
from queried_metrics import ALERT_METRICS, metric_names

from queue_manager.metrics import LATENCY_BUCKETS


def alerts(release: Release) -> dict[str, dict[str, Any]]:
    (group,) = release.get("PrometheusRule", FULLNAME)["spec"]["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def with_slo(chart: Any, slo: float) -> Release:
    values = values_file("autoscaling-values.yaml")
    values["config"] = {"slo_seconds": slo}
    return render(chart, values)


def over_slo_bound(release: Release) -> str:
    (bound,) = set(re.findall(r'le="([^"]+)"', alerts(release)["WindVEAnswersOverSLO"]["expr"]))
    return bound


def test_off_by_default_and_labelled_for_the_operator_when_on(releases: dict[str, Release]) -> None:
    assert not releases["default"].all("PrometheusRule")
    rule = releases["autoscaling"].get("PrometheusRule", FULLNAME)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert set(alerts(releases["autoscaling"])) == {"WindVEAnswersOverSLO", "WindVEBusy"}


def test_every_alert_reads_this_releases_server_pods_only(releases: dict[str, Release]) -> None:
    exprs = [rule["expr"] for rule in alerts(releases["autoscaling"]).values()]
    assert set().union(*(metric_names(expr) for expr in exprs)) == ALERT_METRICS
    for expr in exprs:
        for selector in re.findall(r"windve_[a-z_]+\{([^}]*)\}", expr):
            labels = dict(re.findall(r'(\w+)=~?"([^"]*)"', selector))
            assert labels["namespace"] == NAMESPACE, expr
            pods = re.compile(labels["pod"])
            assert pods.fullmatch(f"{FULLNAME}-7c9d8f6b5d-x2x7q")
            assert not pods.fullmatch(f"{FULLNAME}-redis-6d5f7c9b8-abcde")


def test_the_chart_knows_the_services_latency_buckets(chart: Any) -> None:
    """Each bound /metrics writes for windve_request_seconds is one the rule can read: an SLO on a
    bound is read there."""
    for bucket in LATENCY_BUCKETS:
        assert over_slo_bound(with_slo(chart, bucket)) == floatToGoString(bucket)


@pytest.mark.parametrize(("slo", "bound"), [(1.0, "1.0"), (0.8, "1.0"), (2.5, "3.0"), (0.001, "0.005")])
def test_answers_over_the_slo_are_read_at_the_slo_or_the_next_bound(chart: Any, slo: float, bound: str) -> None:
    release = with_slo(chart, slo)
    assert over_slo_bound(release) == bound
    rule = alerts(release)["WindVEAnswersOverSLO"]
    # (answers - answers within the bound) / answers > 1 %: the answers' p99 is over the bound.
    assert rule["expr"].endswith("> 0.01")
    assert rule["expr"].count("windve_request_seconds_count") == 2


def test_an_slo_past_the_largest_bound_fails_at_install(chart: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match="largest bucket"):
        with_slo(chart, 30.0)


def test_the_busy_share_and_its_bounds_come_from_the_values(chart: Any, helm: Any) -> None:
    values = values_file("autoscaling-values.yaml")
    values["metrics"]["prometheusRule"] |= {"busyShare": 0.2, "window": "2m", "for": "15m"}
    busy = alerts(render(chart, values))["WindVEBusy"]
    assert busy["expr"].endswith("> 0.2") and "[2m]" in busy["expr"] and busy["for"] == "15m"
    values["metrics"]["prometheusRule"]["overSloShare"] = 5  # a share, not a percentage
    with pytest.raises(helm.HelmValuesError, match="overSloShare"):
        render(chart, values)
