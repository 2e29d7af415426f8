"""The chart, rendered by Helm's own engine, holds what a WindVE deployment needs."""

from __future__ import annotations

import os
import posixpath
from typing import Any

import pytest
from helm_render import (
    FULLNAME,
    NAMESPACE,
    SCENARIOS,
    Release,
    all_containers,
    config_file,
    container,
    env_of,
    pod_spec,
    render,
    selects,
    values_file,
    workloads,
)

REDIS = f"{FULLNAME}-redis"


def test_default_release_has_server_and_redis_and_no_calibration_job(releases: dict[str, Release]) -> None:
    assert releases["default"].names() == {
        ("ConfigMap", FULLNAME),
        ("ServiceAccount", FULLNAME),
        ("Deployment", FULLNAME),
        ("Service", FULLNAME),
        ("PodDisruptionBudget", FULLNAME),
        ("Deployment", REDIS),
        ("Service", REDIS),
        ("Secret", REDIS),
    }


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_probes_watch_health_on_the_served_port(releases: dict[str, Release], scenario: str) -> None:
    server = container(releases[scenario].server())
    ports = {port["name"]: port["containerPort"] for port in server["ports"]}
    assert ports == {"http": 8080}
    assert env_of(server)["WINDVE_PORT"]["value"] == "8080"
    assert env_of(server)["WINDVE_HOST"]["value"] == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    # A loaded replica keeps answering; restart only after minutes without an answer,
    # and give model load + warm-up far longer than readiness would.
    liveness, startup = server["livenessProbe"], server["startupProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_an_ipv6_cluster_listens_on_the_ipv6_wildcard(chart: Any) -> None:
    release = render(chart, {"service": {"listenAddress": "::"}})
    assert env_of(container(release.server()))["WINDVE_HOST"]["value"] == "::"


def test_pod_drains_before_it_is_killed(releases: dict[str, Release]) -> None:
    spec = pod_spec(releases["default"].server())
    server = container(releases["default"].server())
    pre_stop = server["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # SIGTERM comes after preStop; admitted queries (bounded by the SLO) still need time.
    slo = config_file(releases["default"])["slo_seconds"]
    assert spec["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + 10 * slo


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_pod_runs_non_root_on_a_read_only_root(releases: dict[str, Release], scenario: str) -> None:
    for workload in workloads(releases[scenario]):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for cont in all_containers(workload):
            context = cont["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, cont["name"]
            assert context["allowPrivilegeEscalation"] is False, cont["name"]
            assert context["capabilities"]["drop"] == ["ALL"], cont["name"]


def test_the_serving_containers_added_capabilities_are_not_redis(chart: Any) -> None:
    # SYS_NICE lets the CPU workers bind memory to their NUMA node (docs/deploy.md); Redis has no use for it.
    context = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
               "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]}}  # fmt: skip
    release = render(chart, {"securityContext": context})
    assert container(release.server())["securityContext"]["capabilities"]["add"] == ["SYS_NICE"]
    assert "add" not in container(release.get("Deployment", REDIS))["securityContext"]["capabilities"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_path_windve_writes_is_a_writable_volume(releases: dict[str, Release], scenario: str) -> None:
    """The root filesystem is read-only: caches, /tmp and /dev/shm must be emptyDirs."""
    release = releases[scenario]
    for workload in release.all("Job") + [release.server()]:
        volumes = {volume["name"]: volume for volume in pod_spec(workload)["volumes"]}
        cont = container(workload, "calibrate" if workload["kind"] == "Job" else "windve")
        writable = [
            mount["mountPath"]
            for mount in cont["volumeMounts"]
            if "emptyDir" in volumes[mount["name"]] and not mount.get("readOnly")
        ]
        env = env_of(cont)
        cache_vars = ("WINDVE_ONNX_CACHE_DIR", "HF_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR")
        written = [env[name]["value"] for name in cache_vars]
        for path in written + ["/tmp", "/dev/shm"]:
            assert any(posixpath.commonpath([path, mount]) == mount for mount in writable), path
        assert volumes["shm"]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_volume_mounts_name_declared_volumes(releases: dict[str, Release], scenario: str) -> None:
    for workload in workloads(releases[scenario]):
        declared = {volume["name"] for volume in pod_spec(workload).get("volumes", [])}
        for cont in all_containers(workload):
            mounted = {mount["name"] for mount in cont.get("volumeMounts", [])}
            assert mounted <= declared, (workload["metadata"]["name"], mounted - declared)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_config_file_and_env_make_valid_windve_settings(
    releases: dict[str, Release], scenario: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pod gets (mounted file + plain env) is accepted by windve's own settings."""
    from windve.settings import load_settings

    release = releases[scenario]
    server = container(release.server())
    env = env_of(server)
    config_mount = next(m for m in server["volumeMounts"] if m["name"] == "config")
    assert env["WINDVE_CONFIG"]["value"] == posixpath.join(config_mount["mountPath"], "config.yaml")
    (tmp_path / "config.yaml").write_text(release.get("ConfigMap", FULLNAME)["data"]["config.yaml"])

    for name in list(os.environ):
        if name.startswith("WINDVE_"):
            monkeypatch.delenv(name)
    for name, entry in env.items():
        if name.startswith("WINDVE_") and "value" in entry:
            monkeypatch.setenv(name, entry["value"])
    monkeypatch.setenv("WINDVE_CONFIG", str(tmp_path / "config.yaml"))
    settings = load_settings()

    expected = config_file(release)
    assert settings.slo_seconds == expected["slo_seconds"]
    assert settings.heterogeneous == expected["heterogeneous"]
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)


def test_example_values_reach_the_settings_file(releases: dict[str, Release]) -> None:
    gpu = config_file(releases["gpu"])
    assert (gpu["slo_seconds"], gpu["heterogeneous"], gpu["dtype"]) == (2.0, True, "auto")
    off = config_file(releases["calibration-off"])
    assert (off["heterogeneous"], off["device"], off["cpu_depth"]) == (False, "cpu", 24)


def test_default_redis_is_the_charts_own(releases: dict[str, Release]) -> None:
    release = releases["default"]
    redis_service = release.get("Service", REDIS)
    assert redis_service["spec"]["ports"][0]["port"] == 6379
    redis_pod = release.get("Deployment", REDIS)["spec"]["template"]
    assert selects(redis_service["spec"]["selector"], redis_pod["metadata"]["labels"])
    assert container(release.get("Deployment", REDIS))["image"].startswith("redis:")
    # The URL carries the password, so it comes from the chart's Secret (test_redis_auth.py).
    reference = env_of(container(release.server()))["WINDVE_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": REDIS, "key": "redis-url"}


def test_external_redis_replaces_the_charts_own(releases: dict[str, Release]) -> None:
    release = releases["external-redis"]
    assert not release.has("Deployment", REDIS) and not release.has("Service", REDIS)
    assert not release.has("Secret", REDIS)
    url = values_file("external-redis-values.yaml")["redis"]["externalUrl"]
    assert env_of(container(release.server()))["WINDVE_REDIS_URL"]["value"] == url


def test_external_redis_url_can_come_from_a_secret(releases: dict[str, Release]) -> None:
    release = releases["calibration-job"]
    for workload in (release.server(), release.job()):
        for cont in all_containers(workload):
            reference = env_of(cont)["WINDVE_REDIS_URL"]["valueFrom"]["secretKeyRef"]
            assert reference == {"name": "shared-redis", "key": "url"}


def test_own_and_external_redis_together_is_refused(chart: Any, helm: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match="redis.enabled=true runs the chart's own Redis"):
        render(chart, {"redis": {"externalUrl": "redis://elsewhere:6379/0"}})


def test_without_redis_there_is_no_url_and_no_calibration(releases: dict[str, Release]) -> None:
    release = releases["no-redis"]
    assert not release.all("Job") and not release.has("Deployment", REDIS)
    assert "WINDVE_REDIS_URL" not in env_of(container(release.server()))
    assert "probes its queue depths for SLO 1 s at start." in release.notes


def test_gpu_values_request_one_gpu_and_mount_the_model(releases: dict[str, Release]) -> None:
    release = releases["gpu"]
    server = release.server()
    windve = container(server)
    assert windve["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert windve["image"] == "windve:0.1.0-cuda"
    spec = pod_spec(server)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    model_volume = next(v for v in spec["volumes"] if v["name"] == "model")
    assert model_volume["persistentVolumeClaim"]["claimName"] == "embedding-models"
    model_mount = next(m for m in windve["volumeMounts"] if m["name"] == "model")
    assert model_mount["readOnly"] is True
    assert env_of(windve)["WINDVE_MODEL"]["value"] == f"{model_mount['mountPath']}/bge-large-en-v1.5"


def test_npu_values_request_the_ascend_resource(releases: dict[str, Release]) -> None:
    release = releases["npu"]
    limits = container(release.server())["resources"]["limits"]
    assert limits["huawei.com/Ascend910"] == 1
    assert "nvidia.com/gpu" not in limits
    volumes = {v["name"]: v for v in pod_spec(release.server())["volumes"]}
    assert volumes["model"]["hostPath"]["path"] == "/data/models"
    assert volumes["ascend-driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"


def test_accelerator_resource_name_is_a_value(chart: Any) -> None:
    accelerator = {"type": "npu", "count": 2, "resourceName": "huawei.com/Ascend310P"}
    release = render(chart, {"accelerator": accelerator})
    limits = container(release.server())["resources"]["limits"]
    assert limits == {"memory": "4Gi", "huawei.com/Ascend310P": 2}


@pytest.mark.parametrize(
    ("values", "image"),
    [({}, "windve:0.1.0"), ({"accelerator": {"type": "gpu"}}, "windve:0.1.0-cuda"),
     ({"accelerator": {"type": "gpu"}, "image": {"tag": "mine"}}, "windve:mine"),
     ({"accelerator": {"type": "npu"}}, "windve:0.1.0")],
)  # fmt: skip
def test_a_gpu_release_without_a_tag_takes_the_cuda_build(chart: Any, values: dict[str, Any], image: str) -> None:
    # The CPU build's torch sees no GPU: the pod would hold one and serve on its CPUs.
    assert container(render(chart, values).server())["image"] == image


def test_cpu_only_default_requests_no_accelerator(releases: dict[str, Release]) -> None:
    limits = container(releases["default"].server())["resources"]["limits"]
    assert set(limits) == {"memory"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_server_selectors_pick_only_server_pods(releases: dict[str, Release], scenario: str) -> None:
    release = releases[scenario]
    server = release.server()
    server_labels = server["spec"]["template"]["metadata"]["labels"]
    other_pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(release) if w is not server]
    selectors = [release.get("Service", FULLNAME)["spec"]["selector"], server["spec"]["selector"]["matchLabels"]]
    selectors += [pdb["spec"]["selector"]["matchLabels"] for pdb in release.all("PodDisruptionBudget")]
    for selector in selectors:
        assert selects(selector, server_labels)
        assert not any(selects(selector, labels) for labels in other_pods)


def test_service_reaches_the_named_container_port(releases: dict[str, Release]) -> None:
    release = releases["default"]
    (port,) = release.get("Service", FULLNAME)["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container(release.server())["ports"]}


def test_api_key_comes_from_a_secret(releases: dict[str, Release], chart: Any) -> None:
    release = releases["api-key"]
    secret = release.get("Secret", f"{FULLNAME}-api-key")
    assert secret["data"] == {"api-key": "czNjcmV0"}  # base64("s3cret")
    reference = env_of(container(release.server()))["WINDVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": f"{FULLNAME}-api-key", "key": "api-key"}
    assert 'Authorization: Bearer $WINDVE_API_KEY' in release.notes

    existing = render(chart, {"apiKey": {"existingSecret": "team-keys", "existingSecretKey": "windve"}})
    assert not existing.has("Secret", f"{FULLNAME}-api-key")
    reference = env_of(container(existing.server()))["WINDVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "team-keys", "key": "windve"}
    assert "WINDVE_API_KEY" not in env_of(container(releases["default"].server()))


def test_a_changed_api_key_rolls_the_pods(chart: Any, releases: dict[str, Release]) -> None:
    """A key changed in the values had left the pods on the old one (revoked, it kept working)."""

    def annotations(key: str) -> dict[str, str]:
        return render(chart, {"apiKey": {"value": key}}).server()["spec"]["template"]["metadata"]["annotations"]

    first, second = annotations("first-key"), annotations("second-key")
    assert first["checksum/api-key"] != second["checksum/api-key"]
    assert "first-key" not in str(first)
    assert "checksum/api-key" not in releases["default"].server()["spec"]["template"]["metadata"]["annotations"]


def test_a_published_example_asks_for_a_key(releases: dict[str, Release]) -> None:
    server = releases["production"].server()
    assert releases["production"].all("Ingress")
    assert "WINDVE_API_KEY" in env_of(container(server))


def test_replicas_take_a_node_each(chart: Any, releases: dict[str, Release]) -> None:
    """Each replica plans its engines over every CPU of its node: two on one node pin the same cores."""
    server = releases["default"].server()
    anti = pod_spec(server)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [term["topologyKey"] for term in anti] == ["kubernetes.io/hostname"]
    assert selects(anti[0]["labelSelector"]["matchLabels"], server["spec"]["template"]["metadata"]["labels"])
    assert "affinity" not in pod_spec(render(chart, {"oneReplicaPerNode": False}).server())
    given = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    assert pod_spec(render(chart, {"affinity": given}).server())["affinity"] == given


@pytest.mark.parametrize("example", ["gpu-values.yaml", "npu-values.yaml", "calibration-job-values.yaml"])
def test_accelerator_examples_leave_the_cpu_pool_its_own_dtype(example: str) -> None:
    """`dtype: fp16` sets every instance's, the CPU pool's too, where fp16 is slow: a calibration
    in fp16 found depth 8 where the pool serves 79 in bf16. `auto` picks per device."""
    values = values_file(example)
    assert values["config"].get("dtype", "auto") == "auto"


def test_queue_occupancy_autoscaler(releases: dict[str, Release]) -> None:
    release = releases["autoscaling"]
    hpa = release.get("HorizontalPodAutoscaler", FULLNAME)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "windve_queue_occupancy"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "700m"}
    assert "replicas" not in release.server()["spec"]  # the HPA owns the replica count


def test_cpu_autoscaler_when_custom_metrics_are_off(releases: dict[str, Release]) -> None:
    (metric,) = releases["cpu-hpa"].get("HorizontalPodAutoscaler", FULLNAME)["spec"]["metrics"]
    assert metric == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
    }
    assert not releases["default"].all("HorizontalPodAutoscaler")


def test_service_monitor_scrapes_the_service(releases: dict[str, Release]) -> None:
    release = releases["autoscaling"]
    monitor = release.get("ServiceMonitor", FULLNAME)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = release.get("Service", FULLNAME)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    annotations = release.server()["spec"]["template"]["metadata"]["annotations"]
    assert "prometheus.io/scrape" not in annotations


def test_scrape_annotations_by_default(releases: dict[str, Release]) -> None:
    annotations = releases["default"].server()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    (port,) = container(releases["default"].server())["ports"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert not releases["default"].all("ServiceMonitor")


def test_settings_change_rolls_the_pods(chart: Any, releases: dict[str, Release]) -> None:
    def checksum(release: Release) -> str:
        return release.server()["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    changed = render(chart, {"config": {"slo_seconds": 2.5}})
    assert checksum(changed) != checksum(releases["default"])
    assert checksum(render(chart, None)) == checksum(releases["default"])


def test_notes_tell_how_to_call_embed(releases: dict[str, Release]) -> None:
    notes = releases["default"].notes
    assert f"kubectl -n {NAMESPACE} port-forward service/{FULLNAME} 8080:8080" in notes
    assert "curl -s http://127.0.0.1:8080/embed" in notes
    assert '{"inputs": ["What is WindVE?"]}' in notes
    assert "probes its queue depths for SLO 1 s at start (or takes a calibration published to Redis)" in notes
    assert "Depth control is adaptive" in notes
