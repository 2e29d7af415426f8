"""The Grafana dashboard: a file in the chart, shipped (when asked) in a sidecar-labelled ConfigMap.

Without a Prometheus here, the queries are checked for what breaks dashboards silently:
a metric name the service does not export, rate() over a gauge, a quantile without `le`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helm_render import CHART_DIR, FULLNAME, NAMESPACE, Release, render
from queried_metrics import DASHBOARD_METRICS, metric_names

DASHBOARD_FILE = CHART_DIR / "dashboards" / "windve.json"
# Those two matchers first; a panel may narrow further with label matchers of its own.
FILTERED = r'\{namespace=~"\$namespace",pod=~"\$pod"(,[a-z_]+(=|!=|=~|!~)"[^"]*")*\}'
CONFIGMAP = f"{FULLNAME}-dashboard"


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def graph_panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def expressions() -> list[str]:
    return [target["expr"] for panel in graph_panels() for target in panel["targets"]]


def panel_titled(word: str) -> dict[str, Any]:
    (panel,) = [panel for panel in graph_panels() if word.lower() in panel["title"].lower()]
    return panel


def test_dashboard_queries_exactly_the_listed_metrics() -> None:
    queried = set().union(*(metric_names(expr) for expr in expressions()))
    variables = [variable["definition"] for variable in dashboard()["templating"]["list"] if "definition" in variable]
    assert queried | set().union(*(metric_names(query) for query in variables)) == DASHBOARD_METRICS


def test_rates_read_counters_and_quantiles_read_buckets() -> None:
    for expr in expressions():
        for function, argument in re.findall(r"\b(rate|increase)\(([a-z0-9_]+)\{", expr):
            # Counters only: a histogram's _sum is one too (seconds of compute per second).
            assert argument.endswith(("_total", "_bucket", "_sum")), (function, argument, expr)
        quantiles = re.findall(r"histogram_quantile\(([^,]+), sum by \(([^)]*)\) \(rate\(([a-z0-9_]+)", expr)
        assert len(quantiles) == expr.count("histogram_quantile"), expr  # each in the checked form
        for q, group, metric in quantiles:
            assert 0 < float(q) < 1 and metric.endswith("_bucket") and "le" in group.split(", "), expr
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr


def test_legends_name_only_labels_their_query_keeps() -> None:
    """A label summed away reads blank in the legend: "Engine compute per second" had shown {{pod}}
    after `sum by (pool, engine)`, and added up same-named engines of every replica."""
    aggregation = re.compile(r"^(?:sum|max|min|avg|count) by \(([^)]*)\)")
    for panel in graph_panels():
        for target in panel["targets"]:
            kept = aggregation.match(target["expr"])
            if kept:
                legend = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
                assert legend <= set(kept.group(1).split(", ")), (panel["title"], target["expr"])


def test_every_series_is_filtered_by_the_namespace_and_pod_variables() -> None:
    for expr in expressions():
        for selector in re.findall(r"windve_[a-z0-9_]+(\{[^}]*\})", expr):
            assert re.fullmatch(FILTERED, selector), expr
    names = {variable["name"] for variable in dashboard()["templating"]["list"]}
    assert {"datasource", "namespace", "pod"} <= names
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in graph_panels())


@pytest.mark.parametrize(
    ("word", "needed"),
    [
        ("throughput", {"windve_requests_total", "windve_inputs_total"}),
        ("latency p50", {"windve_request_seconds_bucket"}),
        ("busy share", {"windve_requests_total"}),
        ("depth against in flight", {"windve_pool_depth", "windve_pool_in_flight"}),
        ("batch size", {"windve_batch_size_bucket"}),
        ("accelerator / cpu split", {"windve_pool_dispatched_queries_total"}),
    ],
)
def test_the_asked_for_panels_are_there(word: str, needed: set[str]) -> None:
    panel = panel_titled(word)
    exprs = [target["expr"] for target in panel["targets"]]
    assert needed <= set().union(*(metric_names(expr) for expr in exprs))


def test_latency_shows_p50_and_p99_and_pools_are_split() -> None:
    latency = [target["expr"] for target in panel_titled("latency p50")["targets"]]
    assert [expr.split(",")[0] for expr in latency] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    for word in ("depth against in flight", "accelerator / cpu split", "batch size"):
        for target in panel_titled(word)["targets"]:
            assert "by (pool" in target["expr"] or "le, pool" in target["expr"], target["expr"]
    split = panel_titled("accelerator / cpu split")
    assert split["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "percent"


def test_busy_panels_count_every_429_and_errors_leave_busy_out() -> None:
    # The dispatcher's own BUSY counter misses what the front ends refuse themselves (a full board,
    # a request that waited too long, the drain): by status, every 429 is counted once.
    for word in ("busy (http 429) rate", "busy share"):
        assert 'status="429"' in panel_titled(word)["targets"][0]["expr"]
    assert 'error_type!="overloaded"' in panel_titled("errors by type")["targets"][0]["expr"]


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = dashboard()["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        covered = {(x, y) for x in range(box["x"], box["x"] + box["w"]) for y in range(box["y"], box["y"] + box["h"])}
        assert not covered & cells, panel["title"]
        cells |= covered


def test_dashboard_configmap_is_off_by_default(releases: dict[str, Release]) -> None:
    assert not releases["default"].has("ConfigMap", CONFIGMAP)


def test_dashboard_configmap_carries_the_file_for_the_grafana_sidecar(releases: dict[str, Release]) -> None:
    configmap = releases["production"].get("ConfigMap", CONFIGMAP)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's default label
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "WindVE"}
    assert json.loads(configmap["data"]["windve.json"]) == dashboard()


def test_dashboard_configmap_defaults_to_the_release_namespace(chart: Any) -> None:
    release = render(chart, {"metrics": {"grafanaDashboard": {"enabled": True}}})
    assert release.get("ConfigMap", CONFIGMAP)["metadata"]["namespace"] == NAMESPACE
