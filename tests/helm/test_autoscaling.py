"""Autoscaling on queue occupancy: the prometheus-adapter rule the chart ships for its HPA, and
the KEDA ScaledObject that replaces the HPA when asked for. One target, one set of bounds."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from helm_render import CHART_DIR, FULLNAME, NAMESPACE, Release, render, values_file
from queried_metrics import AUTOSCALING_METRICS, metric_names

ADAPTER_VALUES = CHART_DIR / "autoscaling" / "prometheus-adapter-values.yaml"


def adapter_rule() -> dict[str, Any]:
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    return rule


def trigger(release: Release) -> dict[str, Any]:
    (only,) = release.get("ScaledObject", FULLNAME)["spec"]["triggers"]
    return only


def test_adapter_serves_the_metric_the_hpa_asks_for(releases: dict[str, Release]) -> None:
    (metric,) = releases["autoscaling"].get("HorizontalPodAutoscaler", FULLNAME)["spec"]["metrics"]
    rule = adapter_rule()
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"] == "windve_queue_occupancy"
    assert re.fullmatch(rule["name"]["matches"], metric_names(rule["seriesQuery"]).pop())
    # A Pods metric is looked up by namespace and pod: both labels must map to those resources.
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert 'namespace!=""' in rule["seriesQuery"] and 'pod!=""' in rule["seriesQuery"]


def test_adapter_query_is_per_pod_and_honours_the_hpa_selector() -> None:
    """<<.GroupBy>> is `pod` for a Pods metric; <<.LabelMatchers>> carries the namespace, the pods
    and the HPA's `pool` selector, so each series read is filtered by them."""
    query = adapter_rule()["metricsQuery"]
    assert metric_names(query) | metric_names(adapter_rule()["seriesQuery"]) <= AUTOSCALING_METRICS
    selectors = re.findall(r"windve_[a-z_]+\{([^}]*)\}", query)
    assert selectors and all(selector == "<<.LabelMatchers>>" for selector in selectors)
    assert query.count("sum by (<<.GroupBy>>)") == 2  # in flight (of the pools that serve) / depth
    # A pool whose warm-up probe runs counts nothing in flight: starting pods had read as demand.
    assert "windve_pool_in_flight{<<.LabelMatchers>>} * windve_pool_serving{<<.LabelMatchers>>}" in query


def test_hpa_can_scale_on_one_pool(chart: Any) -> None:
    values = values_file("autoscaling-values.yaml")
    values["autoscaling"]["queueOccupancy"]["pool"] = "cpu"
    (metric,) = render(chart, values).get("HorizontalPodAutoscaler", FULLNAME)["spec"]["metrics"]
    assert metric["pods"]["metric"]["selector"] == {"matchLabels": {"pool": "cpu"}}


def test_keda_replaces_the_hpa_with_the_same_bounds(releases: dict[str, Release]) -> None:
    release = releases["production"]
    values = values_file("production-values.yaml")["autoscaling"]
    assert not release.all("HorizontalPodAutoscaler")  # KEDA makes its own; two would fight
    scaled = release.get("ScaledObject", FULLNAME)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
        values["minReplicas"], values["maxReplicas"]
    )
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleDown": {"stabilizationWindowSeconds": 300}}  # the chart's default
    assert "replicas" not in release.server()["spec"]  # the autoscaler owns the replica count


def test_keda_trigger_reads_this_releases_pod_occupancy(releases: dict[str, Release]) -> None:
    only = trigger(releases["production"])
    assert only["type"] == "prometheus" and only["metricType"] == "AverageValue"
    metadata = only["metadata"]
    assert metadata["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert metadata["threshold"] == "0.6"  # targetAverageValue "600m"
    query = metadata["query"]
    assert metric_names(query) <= AUTOSCALING_METRICS
    selectors = set(re.findall(r"windve_[a-z_]+\{([^}]*)\}", query))
    (selector,) = selectors  # every series read with the same filter
    labels = dict(re.findall(r'(\w+)=~?"([^"]*)"', selector))
    assert labels["namespace"] == NAMESPACE and "pool" not in labels  # CPU-only pods: both pools
    # PromQL regexes are anchored: the server Deployment's pods, not Redis's or another release's.
    pods = re.compile(labels["pod"])
    assert pods.fullmatch(f"{FULLNAME}-7c9d8f6b5d-x2x7q")
    assert not pods.fullmatch(f"{FULLNAME}-redis-6d5f7c9b8-abcde")
    assert not pods.fullmatch("other-windve-7c9d8f6b5d-x2x7q")
    # Summed per-pod occupancy over an AverageValue target: replicas = ceil(sum / target), as the HPA.
    assert query.startswith("sum(sum by (pod) (")
    assert "windve_pool_in_flight{" + selector + "} * windve_pool_serving{" + selector + "}" in query


@pytest.mark.parametrize(("target", "threshold"), [("700m", "0.7"), ("1500m", "1.5"), ("1", "1"), ("0.8", "0.8")])
def test_keda_threshold_is_the_hpa_target_as_a_number(chart: Any, target: str, threshold: str) -> None:
    values = values_file("production-values.yaml")
    values["autoscaling"]["queueOccupancy"]["targetAverageValue"] = target
    assert trigger(render(chart, values))["metadata"]["threshold"] == threshold


def test_keda_query_can_be_replaced(chart: Any) -> None:
    values = values_file("production-values.yaml")
    values["autoscaling"]["keda"]["query"] = "sum(windve_queue_occupancy)"
    assert trigger(render(chart, values))["metadata"]["query"] == "sum(windve_queue_occupancy)"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"keda": {"serverAddress": ""}}, "needs autoscaling.keda.serverAddress"),
        ({"queueOccupancy": {"enabled": False}}, "autoscaling.keda scales on queue occupancy"),
    ],
)
def test_keda_without_what_it_needs_fails_at_install(
    chart: Any, helm: Any, change: dict[str, Any], complaint: str
) -> None:
    values = values_file("production-values.yaml")
    for key, part in change.items():
        values["autoscaling"][key] |= part
    with pytest.raises(helm.HelmRenderError, match=complaint):
        render(chart, values)


def test_scaling_on_an_accelerator_pool_the_pods_lack_fails_at_install(chart: Any, helm: Any) -> None:
    values = values_file("production-values.yaml")
    values["autoscaling"]["queueOccupancy"]["pool"] = "accelerator"
    with pytest.raises(helm.HelmRenderError, match="no accelerator pool"):
        render(chart, values)
    # An explicit plan may put a CPU engine in the accelerator pool: that one is left alone.
    values["config"] = {"cpu_layout": "explicit", "plan": [{"pool": "accelerator", "device": "cpu", "cores": [0]}]}
    assert trigger(render(chart, values))["metadata"]["query"].count('pool="accelerator"') == 3


def test_target_must_be_a_quantity(chart: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="targetAverageValue"):
        render(chart, {"autoscaling": {"queueOccupancy": {"targetAverageValue": "70%"}}})


SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery's rand: pod-template hashes and pod ids


def pod_name(deployment: str, template_hash: str, pod_id: str = "x7k2q") -> str:
    """The name Kubernetes gives a Deployment's pod: its generateName cut to 58, then the id."""
    return f"{deployment}-{template_hash}-"[:58] + pod_id


@pytest.mark.parametrize("length", [20, 46, 47, 50, 55])
def test_the_pod_matcher_holds_for_long_release_names(chart: Any, length: int) -> None:
    """A fullname over 46 characters loses the dash before the pod's id (or part of its hash): the
    old pattern, <fullname>-[a-z0-9]+-[a-z0-9]+, then matched no pod, and KEDA read 0 for ever."""
    fullname = ("semantic-search-embeddings-production-eu1-windve-abcdefgh")[: length - 1] + "x"
    values = values_file("production-values.yaml") | {"fullnameOverride": fullname}
    (scaled,) = render(chart, values).all("ScaledObject")
    (only,) = scaled["spec"]["triggers"]
    query = only["metadata"]["query"]
    labels = dict(re.findall(r'(\w+)=~?"((?:[^"\\]|\\.)*)"', query))
    pods = re.compile(labels["pod"].encode().decode("unicode_escape"))
    for template_hash in ("5d4f8c7b9d", "7b9d8f6b5", "6b5d"):
        assert pods.fullmatch(pod_name(fullname, template_hash)), (fullname, template_hash)
        redis = f"{fullname}-redis"[:63].rstrip("-")
        assert not pods.fullmatch(pod_name(redis, template_hash))
    assert not pods.fullmatch(f"{fullname}-calibrate-"[:58] + "x7k2q")  # the calibration Job's pod
    assert not pods.fullmatch(pod_name("other-" + fullname, "5d4f8c7b9d"))


def test_a_release_name_too_long_to_tell_its_pods_apart_is_refused(chart: Any, helm: Any) -> None:
    values = values_file("production-values.yaml") | {"fullnameOverride": "w" * 56}
    with pytest.raises(helm.HelmRenderError, match="over 55 characters"):
        render(chart, values)
