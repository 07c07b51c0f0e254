"""The Grafana dashboard: every metric it queries is one the proxy exports, under the name
Prometheus sees (counters with ``_total``, histograms as ``_bucket``), the panels an operator needs
are there, and the shipped JSON is what dev/grafana_dashboard.py writes."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from dev import grafana_dashboard
from tests.deploy.conftest import CHART, REPO

DASHBOARD = CHART / "dashboards" / "kthrottle.json"
# prometheus_client constructors, and the names each exposes.
SUFFIXES = {
    "Counter": ("_total",),
    "CounterMetricFamily": ("_total",),
    "Gauge": ("",),
    "GaugeMetricFamily": ("",),
    "Histogram": ("_bucket", "_sum", "_count"),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count"),
    "Summary": ("_sum", "_count"),
    "SummaryMetricFamily": ("_sum", "_count"),
}
PROMQL_FUNCTIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "rate",
    "increase",
    "irate",
    "topk",
    "bottomk",
    "histogram_quantile",
    "label_values",
    "by",
}


def exported_metrics() -> dict[str, str]:
    """Every metric the proxy defines (proxy/ and quota/ source), exposed name -> constructor."""
    names: dict[str, str] = {}
    for path in [*(REPO / "proxy").rglob("*.py"), *(REPO / "quota").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            kind = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            first = node.args[0]
            if kind in SUFFIXES and isinstance(first, ast.Constant) and isinstance(first.value, str):
                base = first.value.removesuffix("_total") if "Counter" in kind else first.value
                for suffix in SUFFIXES[kind]:
                    names[base + suffix] = kind
    return names


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


def test_the_source_scan_finds_the_proxys_metrics() -> None:
    names = exported_metrics()
    # One of each kind, from the files the dashboard draws on.
    assert names["kthrottle_rejected_frames_total"] == "Counter"  # proxy/metrics.py
    assert names["kthrottle_requests_total"] == "CounterMetricFamily"  # traffic_metrics.py
    assert names["kthrottle_upstream_latency_seconds_bucket"] == "HistogramMetricFamily"
    assert names["kthrottle_client_throttle_time_ms_total"] == "CounterMetricFamily"  # quota_metrics.py
    assert names["kthrottle_volume_state"] == "Gauge"  # volume_service.py
    assert names["kthrottle_exchange_connected"] == "Gauge"  # exchange.py
    assert names["kthrottle_cluster_quota_fallback"] == "Gauge"  # cluster_quotas.py
    assert "kthrottle_capture_dropped_total" in names
    assert "kthrottle_requests" not in names  # a counter is only seen with _total


def test_every_metric_in_the_dashboard_exists() -> None:
    exported = exported_metrics()
    used = {m for e in expressions(dashboard()) for m in re.findall(r"\bkthrottle_[a-z0-9_]+", e)}
    assert used, "no kthrottle metric in the dashboard"
    missing = sorted(used - set(exported))
    assert not missing, f"the dashboard queries metrics the proxy does not export: {missing}"


@pytest.mark.parametrize(
    "metric",
    [
        "kthrottle_throttle_seconds_total",  # throttle time by api
        "kthrottle_client_throttle_time_ms_total",  # ... by quota
        "kthrottle_throttled_requests_total",
        "kthrottle_client_byte_rate",  # byte rates per entity
        "kthrottle_connections_active",
        "kthrottle_rejected_frames_total",
        "kthrottle_upstream_latency_seconds_bucket",  # request latency by api
        "kthrottle_mutation_tokens",
        "kthrottle_mutation_rejected_topics_total",
        "kthrottle_volume_state",
        "kthrottle_exchange_connected",
        "kthrottle_config_reloads_total",
    ],
)
def test_the_dashboard_shows(metric: str) -> None:
    assert any(metric in e for e in expressions(dashboard()))


def test_expressions_are_well_formed() -> None:
    """What can be checked without a Prometheus: brackets balance, functions are PromQL's, every
    selector is narrowed to the dashboard's namespace and pod variables."""
    for expr in expressions(dashboard()):
        depth = {"(": 0, "{": 0, "[": 0}
        closing = {")": "(", "}": "{", "]": "["}
        for ch in re.sub(r'"[^"]*"', '""', expr):
            if ch in depth:
                depth[ch] += 1
            elif ch in closing:
                depth[closing[ch]] -= 1
                assert depth[closing[ch]] >= 0, expr
        assert all(v == 0 for v in depth.values()), expr
        for func in re.findall(r"\b([a-z_]+)\s*\(", expr):
            assert func in PROMQL_FUNCTIONS, f"{func} in {expr}"
        if "label_values" in expr:
            continue
        for selector in re.findall(r"kthrottle_[a-z0-9_]+(\{[^}]*\})?", expr):
            assert 'namespace=~"$namespace"' in selector and 'pod=~"$pod"' in selector, expr


def test_panels_fit_the_grid_and_have_unique_ids() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "pod"}


def test_the_shipped_json_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == grafana_dashboard.render(), (
        "helm/kthrottle/dashboards/kthrottle.json is out of date: run python -m dev.grafana_dashboard"
    )
    assert Path(grafana_dashboard.DASHBOARD) == DASHBOARD
