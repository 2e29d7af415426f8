"""Values are checked at install time and stay in step with windve's settings."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
import yaml
from helm_render import CHART_DIR, SCENARIOS, render, scenario_values

# Settings the chart sets itself (env), so values.schema.json keeps them out of `config`.
CHART_OWNED = {
    "host", "port", "api_key", "model", "revision", "trust_remote_code", "redis_url", "onnx_cache_dir",
}


def schema_config() -> dict[str, Any]:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    return schema["properties"]["config"]


def test_config_schema_names_every_user_setting() -> None:
    from windve.settings import Settings

    assert set(schema_config()["properties"]) == set(Settings.model_fields) - CHART_OWNED, (
        "helm/windve/values.schema.json `config` must list exactly the settings of "
        "windve/settings.py that the chart does not set itself"
    )


def test_config_schema_choices_match_the_settings() -> None:
    from windve.settings import Settings

    properties = schema_config()["properties"]
    for name, field in Settings.model_fields.items():
        if typing.get_origin(field.annotation) is typing.Literal:
            # log_level takes any case, as the setting lowercases it
            assert {str(v).lower() for v in properties[name]["enum"]} == set(typing.get_args(field.annotation)), name


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"config": {"slo": 1.0}}, "additional properties 'slo' not allowed"),
        ({"config": {"slo_seconds": 0}}, "/config/slo_seconds"),
        ({"config": {"port": 9000}}, "additional properties 'port' not allowed"),
        ({"config": {"plan": [{"pool": "gpu"}]}}, "/config/plan/0/pool"),
        ({"config": {"plan": [{"pool": "cpu", "name": "has space"}]}}, "/config/plan/0/name"),
        ({"accelerator": {"type": "tpu"}}, "/accelerator/type"),
        ({"replicacount": 3}, "additional properties 'replicacount' not allowed"),
        ({"redis": {"externalUrl": "localhost:6379"}}, "/redis/externalUrl"),
        ({"service": {"listenAddress": "10.0.0.7"}}, "/service/listenAddress"),
        # Each of these had passed the schema and stopped the pods at start (CrashLoopBackOff).
        ({"config": {"reserved_cores": "a-b"}}, "/config/reserved_cores"),
        ({"config": {"matryoshka_dims": "128;256"}}, "/config/matryoshka_dims"),
        ({"config": {"cors_allow_origins": "https://app.example/"}}, "/config/cors_allow_origins"),
        ({"config": {"cors_allow_origins": ["app.example"]}}, "/config/cors_allow_origins"),
        ({"redis": {"maxmemory": "lots"}}, "/redis/maxmemory"),
    ],
)
def test_schema_rejects_bad_values(chart: Any, helm: Any, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(chart, values)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"model": {"source": "volume", "path": "bge"}}, "model.source=volume needs model.volume"),
        ({"model": {"source": "volume", "volume": {"hostPath": {"path": "/m"}}}}, "needs model.path"),
        ({"config": {"cpu_layout": "explicit"}}, "config.cpu_layout=explicit needs a config.plan"),
        ({"config": {"default_prompt": "q: ", "default_prompt_name": "query"}}, "are both set"),
        ({"terminationGracePeriodSeconds": 30}, "killed mid-drain"),
        ({"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 2}}, "maxReplicas is below"),
    ],
)
def test_unstartable_combinations_fail_at_install(
    chart: Any, helm: Any, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=complaint):
        render(chart, values)


def test_explicit_plan_reaches_the_settings_file(chart: Any) -> None:
    from windve.settings import InstanceConfig

    plan = [
        {"pool": "accelerator", "device": "cuda:0", "name": "gpu0"},
        {"pool": "cpu", "cores": [4, 5, 6, 7], "engine": "onnx"},
    ]
    release = render(chart, {"config": {"cpu_layout": "explicit", "plan": plan}})
    written = yaml.safe_load(release.get("ConfigMap", "emb-windve")["data"]["config.yaml"])["plan"]
    assert [InstanceConfig(**item) for item in written] == [InstanceConfig(**item) for item in plan]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_chart_lints_clean(helm: Any, scenario: str) -> None:
    report = helm.lint(CHART_DIR, scenario_values(scenario), strict=True, namespace="search")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], report


@pytest.mark.parametrize(
    "values",
    [
        {"config": {"log_level": "DEBUG"}},
        {"config": {"reserved_cores": 0}},  # what --set config.reserved_cores=0 gives
        {"config": {"reserved_cores": "0-1, 4"}},
        {"config": {"matryoshka_dims": "128,256"}},
        {"autoscaling": {"enabled": True, "queueOccupancy": {"targetAverageValue": 1}}},
        {"podDisruptionBudget": {"minAvailable": "50%"}},
    ],
)
def test_documented_values_are_accepted_and_start(chart: Any, values: dict[str, Any]) -> None:
    """Values the service takes (or the docs give) that the schema had refused at install."""
    from windve.settings import Settings

    release = render(chart, values)
    config = yaml.safe_load(release.get("ConfigMap", release.server()["metadata"]["name"])["data"]["config.yaml"])
    Settings(**config)  # raises where the service would not start
    if "podDisruptionBudget" in values:
        (budget,) = release.all("PodDisruptionBudget")
        assert budget["spec"]["minAvailable"] == "50%" and "maxUnavailable" not in budget["spec"]
