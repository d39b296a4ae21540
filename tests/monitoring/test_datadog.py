"""deploy/datadog/: every metric the Agent's OpenMetrics check maps, and every metric the
dashboard and the monitors query, is one a served redline exports (a real server, scraped);
the dashboard and the monitors have the fields and types of Datadog's public API reference;
they cover what the Grafana dashboard and the Prometheus rules watch."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.monitoring.served import start

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DATADOG = DEPLOY / "datadog"
# Datadog API reference: Dashboards (widget definition types) and Monitors (monitor types)
WIDGET_TYPES = {
    "alert_graph", "alert_value", "change", "check_status", "distribution", "event_stream",
    "event_timeline", "free_text", "funnel", "geomap", "group", "heatmap", "hostmap", "iframe",
    "image", "list_stream", "log_stream", "manage_status", "note", "powerpack", "query_table",
    "query_value", "run_workflow", "scatterplot", "servicemap", "slo", "slo_list", "split_group",
    "sunburst", "timeseries", "toplist", "topology_map", "trace_service", "treemap"}
MONITOR_TYPES = {
    "composite", "event alert", "log alert", "metric alert", "process alert", "query alert",
    "rum alert", "service check", "synthetics alert", "trace-analytics alert", "slo alert",
    "event-v2 alert", "audit alert", "ci-pipelines alert", "ci-tests alert",
    "error-tracking alert", "database-monitoring alert", "network-performance alert"}
QUERY_METRIC = re.compile(r"(?:^|[:(\s])(redline\.[a-z0-9_.]+?)\{")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Metric family -> type, from a served redline's GET /metrics."""
    server = start(tmp_path_factory.mktemp("repo"))
    try:
        text = httpx.get(f"{server.http}/metrics").text
    finally:
        server.stop()
    yield {f.name: f.type for f in text_string_to_metric_families(text)}


def _check() -> dict[str, Any]:
    conf = yaml.safe_load((DATADOG / "conf.d" / "openmetrics.d" / "conf.yaml").read_text())
    assert "init_config" in conf and len(conf["instances"]) == 1
    instance: dict[str, Any] = conf["instances"][0]
    return instance


def _mapping() -> dict[str, str]:
    """Prometheus family -> Datadog name (without the namespace), as the check maps them."""
    out: dict[str, str] = {}
    for item in _check()["metrics"]:
        assert isinstance(item, dict) and len(item) == 1, item
        out.update(item)
    return out


def _datadog_names(exported: dict[str, str]) -> dict[str, str]:
    """Datadog metric -> Prometheus family, for what the check sends (OpenMetrics V2: a counter
    as <name>.count; a histogram as the distribution <name>, with collect_counters_with_
    distributions its .count and .sum too; a gauge as <name>)."""
    instance = _check()
    ns = instance["namespace"]
    out = {}
    for family, name in _mapping().items():
        kind = exported[family]
        base = f"{ns}.{name}"
        if kind == "counter":
            out[f"{base}.count"] = family
        elif kind == "histogram":
            assert instance["histogram_buckets_as_distributions"] is True
            out[base] = family
            if instance.get("collect_counters_with_distributions"):
                out[f"{base}.count"] = out[f"{base}.sum"] = family
        else:
            out[base] = family
    return out


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((DATADOG / "dashboard.json").read_text())
    out = []
    for widget in dashboard["widgets"]:
        for request in widget["definition"].get("requests", []):
            out += [q["query"] for q in request.get("queries", [])]
            if "q" in request:
                out.append(request["q"])
    return out


def _monitors() -> list[dict[str, Any]]:
    monitors: list[dict[str, Any]] = json.loads((DATADOG / "monitors.json").read_text())
    return monitors


def test_every_metric_the_check_and_the_queries_name_is_exported(exported) -> None:
    instance = _check()
    assert instance["openmetrics_endpoint"].endswith("/metrics")
    mapped = _mapping()
    missing = sorted(f for f in mapped if f not in exported)
    assert not missing, f"the check maps metrics redline does not export: {missing}"
    names = _datadog_names(exported)
    queries = _dashboard_queries() + [m["query"] for m in _monitors()]
    used = {m for q in queries for m in QUERY_METRIC.findall(q)}
    assert len(used) >= 20
    unknown = sorted(used - set(names))
    assert not unknown, (f"dashboard or monitors query metrics the check does not send: "
                         f"{unknown}; it sends {sorted(names)}")
    # the distributions the latency percentiles need are histograms redline exports
    percentiles = {m for q in queries for m in re.findall(r"p\d\d:(redline\.[a-z_.]+)\{", q)}
    assert percentiles and all(exported[names[p]] == "histogram" for p in percentiles)


def test_the_dashboard_watches_what_the_grafana_dashboard_watches(exported) -> None:
    grafana = json.loads((DEPLOY / "grafana" / "redline.json").read_text())
    exprs = "\n".join(t["expr"] for p in grafana["panels"] for t in p["targets"])
    families = {re.sub(r"_(total|bucket|count|sum)$", "", m)
                for m in re.findall(r"\bredline_[a-z_]+", exprs)}
    names = _datadog_names(exported)
    shown = {names[m] for q in _dashboard_queries() for m in QUERY_METRIC.findall(q)}
    assert families - shown == set()


def test_dashboard_has_the_fields_of_datadogs_dashboard_api() -> None:
    dashboard = json.loads((DATADOG / "dashboard.json").read_text())
    assert dashboard["title"] and dashboard["layout_type"] in {"ordered", "free"}
    variables = {v["name"] for v in dashboard.get("template_variables", [])}
    widgets = dashboard["widgets"]
    assert len(widgets) >= 20
    for widget in widgets:
        definition = widget["definition"]
        assert definition["type"] in WIDGET_TYPES, definition["type"]
        for request in definition.get("requests", []):
            if "q" in request:
                continue
            queries, formulas = request["queries"], request["formulas"]
            assert queries and formulas, definition["title"]
            named = set()
            for q in queries:
                assert q["data_source"] == "metrics" and q["name"] and q["query"]
                named.add(q["name"])
                for var in re.findall(r"\$(\w+)", q["query"]):
                    assert var in variables, (definition["title"], var)
            for f in formulas:
                refs = set(re.findall(r"\b[a-z]\b", f["formula"]))
                assert refs and refs <= named, (definition["title"], f["formula"])
            assert request["response_format"] in {"timeseries", "scalar"}


def test_monitors_have_the_fields_of_datadogs_monitor_api() -> None:
    monitors = _monitors()
    assert len(monitors) >= 5
    for m in monitors:
        assert m["type"] in MONITOR_TYPES and m["name"] and m["message"]
        thresholds = m["options"]["thresholds"]
        # the API refuses a monitor whose critical threshold is not the query's
        op, bound = re.search(r"(>=|<=|>|<)\s*([0-9.]+)\s*$", m["query"]).groups()  # type: ignore[union-attr]
        assert float(bound) == thresholds["critical"], m["name"]
        if "warning" in thresholds:
            assert (thresholds["warning"] < thresholds["critical"]) == op.startswith(">")
        assert re.match(r"^(sum|avg|min|max|percentile)\(last_\d+[mhd]\):", m["query"])


def test_monitors_match_the_prometheus_rules() -> None:
    """p99 over the objective, both budgets' fast burn, drift and live quality, with the
    objectives and burn rates of deploy/prometheus/redline-rules.yml."""
    rules = (DEPLOY / "prometheus" / "redline-rules.yml").read_text()
    error_budget = float(re.search(r"request_errors:ratio_rate1h > \(14\.4 \* ([0-9.]+)\)",
                                   rules).group(1))  # type: ignore[union-attr]
    latency_budget = float(re.search(
        r"requests_over_objective:ratio_rate1h > \(14\.4 \* ([0-9.]+)\)",
        rules).group(1))  # type: ignore[union-attr]
    errors = re.search(r'status=~"([a-z_|]+)"', rules).group(1).split("|")  # type: ignore[union-attr]
    by_metric: dict[str, dict[str, Any]] = {}
    for m in _monitors():
        key = " ".join(sorted(set(QUERY_METRIC.findall(m["query"]))))
        by_metric.setdefault(key, m) if "last_1h" not in m["query"] else by_metric.setdefault(
            key + " 1h", m)
    burn_errors = by_metric["redline.requests.count 1h"]
    assert burn_errors["options"]["thresholds"]["critical"] == pytest.approx(14.4 * error_budget)
    assert sorted(re.search(r"status IN \(([a-z_,]+)\)", burn_errors["query"])  # type: ignore[union-attr]
                  .group(1).split(",")) == sorted(errors)
    over = "redline.request_duration_seconds.count redline.requests_over_objective.count"
    assert by_metric[over + " 1h"]["options"]["thresholds"]["critical"] == pytest.approx(
        14.4 * latency_budget)
    assert by_metric[over]["options"]["thresholds"]["critical"] == pytest.approx(latency_budget)
    assert "last_15m" in by_metric["redline.drift_alarm"]["query"]  # the rule's for: 15m
    assert "last_30m" in by_metric["redline.quality_alarm"]["query"]  # the rule's for: 30m


def test_the_agent_takes_otlp_traces_where_redline_sends_them() -> None:
    agent = yaml.safe_load((DATADOG / "datadog.yaml").read_text())
    endpoint = agent["otlp_config"]["receiver"]["protocols"]["http"]["endpoint"]
    assert endpoint.endswith(":4318")  # OTLP/HTTP; redline posts to <agent>:4318/v1/traces
