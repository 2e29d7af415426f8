"""Render the WindVE chart with Helm's own engine (helm-python-sdk) and look objects up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "windve"
EXAMPLE_VALUES = CHART_DIR / "ci"
RELEASE = "emb"
NAMESPACE = "search"
FULLNAME = "emb-windve"


@dataclass
class Release:
    """One rendered release: its Kubernetes objects and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [obj for obj in self.all(kind) if obj["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind}/{name}, found {self.names()}"
        return found[0]

    def has(self, kind: str, name: str) -> bool:
        return any(obj["metadata"]["name"] == name for obj in self.all(kind))

    def names(self) -> set[tuple[str, str]]:
        return {(obj["kind"], obj["metadata"]["name"]) for obj in self.objects}

    def server(self) -> dict[str, Any]:
        return self.get("Deployment", FULLNAME)

    def job(self) -> dict[str, Any]:
        jobs = self.all("Job")
        assert len(jobs) == 1, f"expected one calibration Job, found {self.names()}"
        return jobs[0]


def values_file(name: str) -> dict[str, Any]:
    """An example values file from helm/windve/ci, parsed as `helm -f` parses it."""
    import helm_python

    return helm_python.values_from_yaml((EXAMPLE_VALUES / name).read_text())


def render(chart: Any, values: dict[str, Any] | None = None, revision: int = 1) -> Release:
    """Render as `helm install emb helm/windve -n search` would (schema checked, hooks kept)."""
    manifests = chart.render(
        values=values, name=RELEASE, namespace=NAMESPACE, revision=revision, is_install=True
    )
    objects: list[dict[str, Any]] = []
    notes = ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Release(objects, notes)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = pod_spec(workload)["containers"]
    if name is None:
        assert len(containers) == 1
        return containers[0]
    return next(c for c in containers if c["name"] == name)


def all_containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def env_of(cont: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Container env by name: each entry as written (value or valueFrom)."""
    return {entry["name"]: entry for entry in cont.get("env", [])}


def config_file(release: Release) -> dict[str, Any]:
    """The settings file the ConfigMap mounts as WINDVE_CONFIG."""
    configmap = release.get("ConfigMap", FULLNAME)
    return yaml.safe_load(configmap["data"]["config.yaml"])


def workloads(release: Release) -> list[dict[str, Any]]:
    return release.all("Deployment") + release.all("Job")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# Every release the tests look at: the defaults and each example values file.
SCENARIOS: dict[str, dict[str, Any] | str | None] = {
    "default": None,
    "gpu": "gpu-values.yaml",
    "npu": "npu-values.yaml",
    "external-redis": "external-redis-values.yaml",
    "calibration-off": "calibration-off-values.yaml",
    "autoscaling": "autoscaling-values.yaml",
    "no-redis": {"redis": {"enabled": False}},
    "api-key": {"apiKey": {"value": "s3cret"}},
    "cpu-hpa": {"autoscaling": {"enabled": True, "queueOccupancy": {"enabled": False}}},
    "calibration-job": "calibration-job-values.yaml",
    "production": "production-values.yaml",
    # The chart's Redis with its password in a Secret the operator manages.
    "redis-existing-secret": {
        "redis": {"auth": {"existingSecret": "windve-redis-auth", "existingSecretPasswordKey": "password"}}
    },
}


def scenario_values(name: str) -> dict[str, Any] | None:
    source = SCENARIOS[name]
    return values_file(source) if isinstance(source, str) else source
