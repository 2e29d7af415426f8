"""Reaching and placing the service on a real cluster: Ingress, Gateway API HTTPRoute,
topology spread constraints and the RuntimeClass (e.g. nvidia)."""

from __future__ import annotations

from typing import Any

import pytest
from helm_render import FULLNAME, Release, pod_spec, render, selects, values_file

REDIS = f"{FULLNAME}-redis"


def service_ports(release: Release) -> dict[str, int]:
    return {port["name"]: port["port"] for port in release.get("Service", FULLNAME)["spec"]["ports"]}


def test_nothing_is_exposed_by_default(releases: dict[str, Release]) -> None:
    assert not releases["default"].all("Ingress") and not releases["default"].all("HTTPRoute")


def test_ingress_routes_the_hosts_to_the_service(releases: dict[str, Release]) -> None:
    release = releases["production"]
    ingress = release.get("Ingress", FULLNAME)["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [{"secretName": "embed-tls", "hosts": ["embed.example.com"]}]
    (rule,) = ingress["rules"]
    assert rule["host"] == "embed.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    backend = path["backend"]["service"]
    assert backend["name"] == FULLNAME and backend["port"]["name"] in service_ports(release)
    # Requests up to max_request_bytes (2 MiB) pass ingress-nginx's 1 MiB default only with this.
    annotations = release.get("Ingress", FULLNAME)["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "4m"


def test_ingress_without_hosts_serves_any_host(chart: Any) -> None:
    (rule,) = render(chart, {"ingress": {"enabled": True}}).get("Ingress", FULLNAME)["spec"]["rules"]
    assert "host" not in rule
    assert [(p["path"], p["pathType"]) for p in rule["http"]["paths"]] == [("/", "Prefix")]


def test_httproute_attaches_to_the_gateway_and_reaches_the_service(releases: dict[str, Release]) -> None:
    release = releases["production"]
    route = release.get("HTTPRoute", FULLNAME)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    spec = route["spec"]
    assert spec["parentRefs"] == [{"name": "shared-gateway", "namespace": "gateway-system", "sectionName": "https"}]
    assert spec["hostnames"] == ["embed.example.com"]
    (rule,) = spec["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": service_ports(release)["http"]}]


def test_httproute_without_a_gateway_fails_at_install(chart: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match="httpRoute.enabled needs httpRoute.parentRefs"):
        render(chart, {"httpRoute": {"enabled": True}})


def test_spread_constraints_count_this_releases_server_pods(releases: dict[str, Release]) -> None:
    release = releases["production"]
    constraints = pod_spec(release.server())["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    server_labels = release.server()["spec"]["template"]["metadata"]["labels"]
    redis_labels = release.get("Deployment", REDIS)["spec"]["template"]["metadata"]["labels"]
    for constraint in constraints:
        selector = constraint["labelSelector"]["matchLabels"]
        assert selects(selector, server_labels) and not selects(selector, redis_labels)
    assert "topologySpreadConstraints" not in pod_spec(release.get("Deployment", REDIS))


def test_a_given_spread_selector_is_kept(chart: Any) -> None:
    given = {"matchLabels": {"team": "search"}}
    constraint = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": given}
    (rendered,) = pod_spec(render(chart, {"topologySpreadConstraints": [constraint]}).server())[
        "topologySpreadConstraints"
    ]
    assert rendered == constraint


def test_runtime_class_reaches_the_serving_pods_only_when_set(releases: dict[str, Release]) -> None:
    gpu = releases["gpu"]
    assert pod_spec(gpu.server())["runtimeClassName"] == "nvidia"
    assert values_file("gpu-values.yaml")["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in pod_spec(gpu.get("Deployment", REDIS))  # Redis needs no GPU runtime
    assert "runtimeClassName" not in pod_spec(releases["default"].server())
    job = releases["calibration-job"].job()  # the Job takes the same GPU, so the same runtime
    assert pod_spec(job)["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"runtimeClassName": "NVIDIA GPU"}, "/runtimeClassName"),
        ({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]}, "whenUnsatisfiable"),
        ({"ingress": {"enabled": True, "hosts": [{"host": "a", "paths": [{"path": "api"}]}]}}, "/path"),
        ({"ingress": {"enabled": True, "hostname": "a"}}, "additional properties 'hostname' not allowed"),
        ({"httpRoute": {"enabled": True, "parentRefs": [{"namespace": "gw"}]}}, "name"),
    ],
)
def test_schema_rejects_bad_exposure_values(chart: Any, helm: Any, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(chart, values)
