"""The calibration choice: serving pods probe their own depths; the Job is opt-in and never
competes with the Deployment for its accelerator (a pre-install hook, before the Deployment exists)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest
from helm_render import (
    FULLNAME,
    Release,
    config_file,
    container,
    env_of,
    pod_spec,
    render,
    values_file,
)

JOB = f"{FULLNAME}-calibrate"
JOB_CONFIG = f"{FULLNAME}-calibration"
EXTERNAL_REDIS = {"enabled": False, "externalUrl": "redis://shared-redis.data.svc:6379/0"}


def hook_of(obj: dict[str, Any]) -> tuple[str, int]:
    annotations = obj["metadata"]["annotations"]
    return annotations["helm.sh/hook"], int(annotations["helm.sh/hook-weight"])


def test_default_release_has_no_job_and_pods_calibrate_themselves(releases: dict[str, Release]) -> None:
    release = releases["default"]
    assert not release.all("Job")
    assert config_file(release)["depth_control"] == "adaptive"
    assert "probes its queue depths for SLO 1 s at start" in release.notes
    assert "Depth control is adaptive" in release.notes


def test_static_depths_say_so(releases: dict[str, Release]) -> None:
    release = releases["calibration-off"]
    assert not release.all("Job")
    assert config_file(release)["depth_control"] == "static"
    assert "Depth control is static" in release.notes


def test_job_runs_before_the_deployment_and_only_at_install(releases: dict[str, Release]) -> None:
    """pre-install: nothing of the release runs yet, so the accelerator is free. Not on upgrade,
    when the serving pods hold it."""
    release = releases["calibration-job"]
    job = release.get("Job", JOB)
    assert hook_of(job) == ("pre-install", 0)
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # a hook Job is not removed by uninstall
    assert "Queue depths were calibrated" in release.notes and f"logs job/{JOB}" in release.notes


def test_job_brings_its_own_settings_and_no_release_object(releases: dict[str, Release]) -> None:
    """Before install nothing of the release exists: not its ConfigMap, not its ServiceAccount."""
    release = releases["calibration-job"]
    job = release.get("Job", JOB)
    settings = release.get("ConfigMap", JOB_CONFIG)
    hook, weight = hook_of(settings)
    assert hook == "pre-install" and weight < hook_of(job)[1]  # created before the Job
    assert "hook-succeeded" in settings["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert settings["data"] == release.get("ConfigMap", FULLNAME)["data"]
    volumes = {volume["name"]: volume for volume in pod_spec(job)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == JOB_CONFIG
    assert "serviceAccountName" not in pod_spec(job)  # the chart's is created after the hooks
    assert pod_spec(job)["automountServiceAccountToken"] is False


def test_job_uses_an_existing_service_account_when_the_chart_makes_none(chart: Any) -> None:
    values = values_file("calibration-job-values.yaml") | {"serviceAccount": {"create": False, "name": "ml"}}
    assert pod_spec(render(chart, values).get("Job", JOB))["serviceAccountName"] == "ml"


@pytest.mark.parametrize(
    "values",
    [
        pytest.param("calibration-job-values.yaml", id="gpu"),
        pytest.param({"redis": EXTERNAL_REDIS, "calibration": {"enabled": True}}, id="cpu"),
    ],
)
def test_job_measures_what_the_serving_pods_will_run(chart: Any, values: Any) -> None:
    """Same image, settings, model, node type and devices: its depths fit the serving pods."""
    release = render(chart, values_file(values) if isinstance(values, str) else values)
    job, server = release.get("Job", JOB), release.server()
    calibrate, windve = container(job, "calibrate"), container(server)
    assert calibrate["image"] == windve["image"]
    assert calibrate["resources"] == windve["resources"]
    assert calibrate["volumeMounts"] == windve["volumeMounts"]
    assert env_of(calibrate) == {k: v for k, v in env_of(windve).items() if k != "WINDVE_API_KEY"}
    for key in ("nodeSelector", "tolerations", "runtimeClassName"):
        assert pod_spec(job).get(key) == pod_spec(server).get(key), key
    # The servers keep off each other's nodes; the Job is not one of them.
    assert "podAntiAffinity" in pod_spec(server)["affinity"] and "affinity" not in pod_spec(job)


def test_npu_job_takes_the_npu_before_the_deployment_does(chart: Any) -> None:
    values = values_file("npu-values.yaml") | {"redis": EXTERNAL_REDIS, "calibration": {"enabled": True}}
    release = render(chart, values)
    assert container(release.get("Job", JOB), "calibrate")["resources"]["limits"]["huawei.com/Ascend910"] == 1
    assert hook_of(release.get("Job", JOB))[0] == "pre-install"


def test_job_publishes_to_redis(releases: dict[str, Release]) -> None:
    release = releases["calibration-job"]
    job = release.get("Job", JOB)
    calibrate = container(job, "calibrate")
    args = calibrate["args"]
    assert args[0] == "calibrate"
    assert float(args[args.index("--slo") + 1]) == config_file(release)["slo_seconds"]
    # windve calibrate publishes to WINDVE_REDIS_URL: the URL, password and all, stays out of
    # the arguments, which any process on the node can read.
    assert "WINDVE_REDIS_URL" in env_of(calibrate)
    assert not any("REDIS" in arg.upper() for arg in args)
    assert [c["name"] for c in pod_spec(job)["initContainers"]] == ["wait-for-redis"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert args[-3:] == ["--recheck", "--headroom", "0.2"]  # calibration.extraArgs


def test_job_writes_its_files_where_the_pod_can_write(releases: dict[str, Release]) -> None:
    calibrate = container(releases["calibration-job"].get("Job", JOB), "calibrate")
    assert calibrate["securityContext"]["readOnlyRootFilesystem"] is True
    writable = [m["mountPath"] for m in calibrate["volumeMounts"] if not m.get("readOnly")]
    args = calibrate["args"]
    # Both named: a default lands in the working directory, on the read-only root filesystem.
    for flag in ("--out", "--plot"):
        path = PurePosixPath(args[args.index(flag) + 1])
        assert any(path.is_relative_to(mount) for mount in writable), (flag, path, writable)


@pytest.mark.parametrize(
    "redis",
    [pytest.param({}, id="own-redis"), pytest.param({"enabled": False}, id="no-redis")],
)
def test_job_without_a_redis_that_exists_before_install_is_refused(chart: Any, helm: Any, redis: Any) -> None:
    """The chart's own Redis is created after pre-install hooks: the Job could never publish."""
    with pytest.raises(helm.HelmRenderError, match="needs a Redis that already exists"):
        render(chart, {"redis": redis, "calibration": {"enabled": True}})
