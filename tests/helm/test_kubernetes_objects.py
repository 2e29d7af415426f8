"""Every rendered object is a valid Kubernetes object (JSON schemas of the API, offline).

`kubectl apply --dry-run=client` needs a reachable API server for validation, so the
objects are checked against the strict schemas shipped by kubernetes-validate, for the
oldest Kubernetes the chart supports and the newest the package knows.
"""

from __future__ import annotations

import pytest
from helm_render import SCENARIOS, Release

# Custom resources have no schema in the core API; the render tests check them field by field.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}
OLDEST_SUPPORTED = "1.25.0"  # Chart.yaml kubeVersion


def kubernetes_versions() -> list[str]:
    from kubernetes_validate.utils import latest_version

    return [OLDEST_SUPPORTED, latest_version()]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rendered_objects_match_the_kubernetes_api(releases: dict[str, Release], scenario: str) -> None:
    import kubernetes_validate

    checked = 0
    for obj in releases[scenario].objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        for version in kubernetes_versions():
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(part) for part in exc.path)
                name = f"{obj['kind']}/{obj['metadata']['name']}"
                pytest.fail(f"{name} invalid for Kubernetes {version} at {where}: {exc.message}")
        checked += 1
    assert checked >= 5


def test_strict_schemas_catch_a_misspelt_field(releases: dict[str, Release]) -> None:
    """The validator is not a rubber stamp: the same Deployment with one typo fails."""
    import copy

    import kubernetes_validate

    deployment = copy.deepcopy(releases["default"].server())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"tcpSocket": {"port": 8080}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, OLDEST_SUPPORTED, strict=True)
