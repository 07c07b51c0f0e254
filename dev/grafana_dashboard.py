"""Writes the Grafana dashboard of the Helm chart, helm/kthrottle/dashboards/kthrottle.json.

    python -m dev.grafana_dashboard            # rewrite the file
    python -m dev.grafana_dashboard --check    # exit 1 if the file differs from what this writes

Every metric is one the proxy exports (tests/deploy/test_dashboard.py checks the names against
the source). Counters appear with Prometheus' ``_total`` suffix, histograms as ``_bucket``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parent.parent / "helm" / "kthrottle" / "dashboards" / "kthrottle.json"

# Every query is narrowed to the selected namespace and pods; ".*" also matches series without
# those labels (annotation-based scraping that does not add them).
SEL = 'namespace=~"$namespace", pod=~"$pod"'
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 8
    mappings: list[dict[str, Any]] = field(default_factory=list)
    stack: bool = False


def rate(metric: str, by: str = "", extra: str = "") -> str:
    """Per-second rate of a counter, summed (by the labels given)."""
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{SEL}{extra}}}[{RATE}]))"


def seconds(metric_ms: str, by: str = "") -> str:
    """Throttle seconds per second from a ``..._throttle_time_ms_total`` counter."""
    return f"{rate(metric_ms, by)} / 1000"


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Traffic",
        [
            Panel(
                "Connections",
                [
                    (f"sum by (listener) (kthrottle_connections_active{{{SEL}}})", "open {{listener}}"),
                    (rate("kthrottle_connections_total", "listener"), "new/s {{listener}}"),
                ],
                description="Open client connections and new connections per second, by listener.",
            ),
            Panel(
                "Requests by API",
                [(rate("kthrottle_requests_total", "api"), "{{api}}")],
                unit="reqps",
                stack=True,
            ),
            Panel(
                "Bytes by API",
                [
                    (rate("kthrottle_request_bytes_total", "api"), "in {{api}}"),
                    (rate("kthrottle_response_bytes_total", "api"), "out {{api}}"),
                ],
                unit="Bps",
            ),
            Panel(
                "Request latency by API (p99, p50)",
                [
                    (
                        "histogram_quantile(0.99, sum by (api, le) "
                        f"(rate(kthrottle_upstream_latency_seconds_bucket{{{SEL}}}[{RATE}])))",
                        "p99 {{api}}",
                    ),
                    (
                        "histogram_quantile(0.5, sum by (api, le) "
                        f"(rate(kthrottle_upstream_latency_seconds_bucket{{{SEL}}}[{RATE}])))",
                        "p50 {{api}}",
                    ),
                ],
                unit="s",
                description="Upstream time: from forwarding a request to its response arriving.",
            ),
            Panel(
                "Rejected frames",
                [(rate("kthrottle_rejected_frames_total", "reason"), "{{reason}}")],
                unit="short",
                description="Client connections closed for bad input, per second, by reason.",
            ),
            Panel(
                "TLS handshake failures",
                [(f"sum(rate(kthrottle_tls_handshake_failures_total{{{SEL}}}[{RATE}]))", "failed/s")],
                unit="short",
                description="Client TLS handshakes refused (bad or missing certificate) or cut off.",
            ),
            Panel(
                "Upstream errors",
                [(rate("kthrottle_upstream_errors_total", "kind"), "{{kind}}")],
            ),
        ],
    ),
    (
        "Quotas and throttling",
        [
            Panel(
                "Throttle time by API",
                [(rate("kthrottle_throttle_seconds_total", "api"), "{{api}}")],
                unit="s",
                description="Seconds of throttle decided per second, by API (all quota kinds).",
                stack=True,
            ),
            Panel(
                "Throttle time by quota",
                [
                    (
                        seconds("kthrottle_client_throttle_time_ms_total", "direction"),
                        "byte rate {{direction}}",
                    ),
                    (
                        seconds("kthrottle_partition_throttle_time_ms_total", "direction"),
                        "topic-partition {{direction}}",
                    ),
                    (seconds("kthrottle_mutation_throttle_time_ms_total"), "controller_mutation_rate"),
                    (seconds("kthrottle_producer_id_throttle_time_ms_total"), "producer_ids_rate"),
                    (seconds("kthrottle_request_time_throttle_time_ms_total"), "request_percentage"),
                    (seconds("kthrottle_connection_throttle_time_ms_total"), "connection_creation_rate"),
                ],
                unit="s",
                description="Seconds of throttle decided per second, by the quota that decided it.",
            ),
            Panel(
                "Throttled requests",
                [
                    (rate("kthrottle_throttled_requests_total", "api, mode"), "{{api}} ({{mode}})"),
                    (
                        rate("kthrottle_quota_throttles_total", "api, quota, mode"),
                        "{{quota}} {{api}} ({{mode}})",
                    ),
                ],
                unit="reqps",
                description="Requests over a quota per second; mode dry-run: decided, not applied.",
            ),
            Panel(
                "Byte rate per entity (top 10)",
                [
                    (
                        "topk(10, sum by (direction, user, client_id) "
                        f"(kthrottle_client_byte_rate{{{SEL}}}))",
                        "{{direction}} {{user}}/{{client_id}}",
                    )
                ],
                unit="Bps",
                width=12,
                description="Rate of each quota bucket as the quota measures it (Kafka's window); "
                "compare with the entity's quota in /quotas/entity. Per proxy instance summed.",
            ),
            Panel(
                "Usage against quota per entity (top 10)",
                [
                    (
                        "topk(10, max by (direction, user, client_id) "
                        f"(kthrottle_client_quota_usage_ratio{{{SEL}}}))",
                        "{{direction}} {{user}}/{{client_id}}",
                    )
                ],
                unit="percentunit",
                width=12,
                description="Each quota bucket's rate over its quota (1: held at its quota). The "
                "chart's alerts (metrics.prometheusRule) fire at 80% and 100% sustained 5 minutes.",
            ),
            Panel(
                "Throttle time per entity (top 10)",
                [
                    (
                        "topk(10, sum by (direction, user, client_id) "
                        f"(rate(kthrottle_client_throttle_time_ms_total{{{SEL}}}[{RATE}]))) / 1000",
                        "{{direction}} {{user}}/{{client_id}}",
                    )
                ],
                unit="s",
                width=12,
                description="Above zero: the entity is over its byte-rate quota.",
            ),
            Panel(
                "Topic-partition byte rate (top 10)",
                [
                    (
                        "topk(10, sum by (direction, topic, partition) "
                        f"(kthrottle_partition_byte_rate{{{SEL}}}))",
                        "{{direction}} {{topic}}-{{partition}}",
                    )
                ],
                unit="Bps",
            ),
            Panel(
                "Mutation tokens (lowest 10)",
                [
                    (
                        f"bottomk(10, min by (user, client_id) (kthrottle_mutation_tokens{{{SEL}}}))",
                        "{{user}}/{{client_id}}",
                    )
                ],
                description="KIP-599 token buckets; below zero the bucket is throttled.",
            ),
            Panel(
                "Mutations and rejected topics",
                [
                    (
                        f"topk(10, sum by (user, client_id) (kthrottle_mutation_rate{{{SEL}}}))",
                        "mutations/s {{user}}/{{client_id}}",
                    ),
                    (
                        rate("kthrottle_mutation_rejected_topics_total", "api, mode"),
                        "rejected {{api}} ({{mode}})",
                    ),
                ],
            ),
            Panel(
                "Producer ids and request time",
                [
                    (
                        f"topk(10, sum by (user) (kthrottle_producer_id_rate{{{SEL}}}))",
                        "new producer ids/s {{user}}",
                    ),
                    (
                        f"topk(10, max by (user, client_id) (kthrottle_request_time_percentage{{{SEL}}}))",
                        "request % {{user}}/{{client_id}}",
                    ),
                ],
            ),
            Panel(
                "Connection creation (top 10 IPs)",
                [
                    (
                        f"topk(10, sum by (ip) (kthrottle_connection_creation_rate{{{SEL}}}))",
                        "{{ip}}",
                    ),
                    (rate("kthrottle_throttled_connections_total", "mode"), "throttled ({{mode}})"),
                ],
            ),
            Panel(
                "Producer-id filter memory",
                [(f"sum(kthrottle_producer_id_filter_bytes_total{{{SEL}}})", "bloom filters")],
                unit="bytes",
            ),
            Panel(
                "Quota state tracked",
                [(f"sum by (direction, kind) (kthrottle_quota_tracked{{{SEL}}})", "{{direction}} {{kind}}")],
                unit="short",
                description="Byte-rate buckets and partitions held in memory; idle ones expire.",
            ),
        ],
    ),
    (
        "Disk volumes and cluster quotas",
        [
            Panel(
                "Volume state",
                [
                    (f"max(kthrottle_volume_state{{{SEL}}})", "state"),
                    (f"max(kthrottle_volume_fail_safe{{{SEL}}})", "fail-safe"),
                ],
                kind="stat",
                width=6,
                mappings=[
                    {
                        "type": "value",
                        "options": {
                            "0": {"text": "OPEN", "color": "green"},
                            "1": {"text": "THROTTLE", "color": "orange"},
                            "2": {"text": "PAUSE", "color": "red"},
                        },
                    }
                ],
                description="0 OPEN, 1 THROTTLE, 2 PAUSE; fail-safe 1 while a live broker has no "
                "fresh usage snapshot.",
            ),
            Panel(
                "Volume produce delay and fill",
                [
                    (f"max(kthrottle_volume_produce_delay_ms{{{SEL}}})", "produce delay ms"),
                    (f"max(kthrottle_volume_worst_fraction{{{SEL}}})", "worst volume, soft to hard"),
                ],
                width=6,
            ),
            Panel(
                "Parked produce requests",
                [
                    (f"sum(kthrottle_volume_parked_bytes{{{SEL}}})", "parked bytes"),
                    (rate("kthrottle_volume_parked_requests_total", "outcome"), "{{outcome}}/s"),
                ],
                width=6,
            ),
            Panel(
                "Usage snapshots",
                [
                    (f"max by (broker) (kthrottle_volume_snapshot_age_seconds{{{SEL}}})", "age {{broker}}"),
                    (rate("kthrottle_volume_publications_total", "broker"), "published/s {{broker}}"),
                    (
                        f"sum(rate(kthrottle_volume_measure_errors_total{{{SEL}}}[{RATE}]))",
                        "measure errors/s",
                    ),
                ],
                width=6,
            ),
            Panel(
                "Exchange connectivity",
                [
                    (f"min by (topic) (kthrottle_exchange_connected{{{SEL}}})", "connected {{topic}}"),
                    (rate("kthrottle_exchange_publish_errors_total", "topic"), "publish errors/s {{topic}}"),
                    (rate("kthrottle_exchange_records_total", "topic"), "records read/s {{topic}}"),
                ],
                description="The proxies' state-exchange topics (volume usage, cluster quotas): "
                "connected is 1 on every instance when healthy.",
            ),
            Panel(
                "Cluster quotas",
                [
                    (f"max(kthrottle_cluster_quota_instances{{{SEL}}})", "replicas"),
                    (f"max(kthrottle_cluster_quota_fallback{{{SEL}}})", "fallback"),
                    (f"min(kthrottle_cluster_quota_multiplier{{{SEL}}})", "part of each quota held (lowest)"),
                    (f"sum(kthrottle_cluster_quota_buckets{{{SEL}}})", "buckets reported"),
                ],
                description="Replicas sharing the quotas through the exchange; fallback 1 while a "
                "replica cannot trust it (then each holds its part: 1/replicas alone, or what the "
                "others leave of a replica cut off).",
            ),
            Panel(
                "Shared byte rate per entity: all replicas and each one's part (top 5)",
                [
                    (
                        f"topk(5, max by (direction, user, client_id) (kthrottle_client_byte_rate{{{SEL}}}))",
                        "{{direction}} {{user}} {{client_id}} (all replicas)",
                    ),
                    (
                        f"topk(15, kthrottle_client_byte_rate_this_replica{{{SEL}}})",
                        "{{direction}} {{user}} {{client_id}} on {{pod}}",
                    ),
                ],
                unit="Bps",
                description="Every replica measures an entity's shared bucket at the rate of all "
                "replicas together; each one's part is what its own clients use.",
            ),
            Panel(
                "Exchange lag",
                [
                    (
                        f"max by (pod) (kthrottle_cluster_quota_exchange_lag_seconds{{{SEL}}})",
                        "{{pod}}",
                    )
                ],
                unit="s",
            ),
        ],
    ),
    (
        "Operations",
        [
            Panel(
                "Config reloads",
                [
                    (
                        f"sum by (result) (increase(kthrottle_config_reloads_total{{{SEL}}}[1h]))",
                        "{{result}} (last hour)",
                    )
                ],
                description="Quota and config file reloads; rejected keeps the last good config "
                "(the proxy logs file:line and the reason).",
            ),
            Panel(
                "Traffic capture",
                [
                    (f"sum(rate(kthrottle_capture_records_total{{{SEL}}}[{RATE}]))", "records/s"),
                    (f"sum(rate(kthrottle_capture_dropped_total{{{SEL}}}[{RATE}]))", "dropped/s"),
                    (f"sum(rate(kthrottle_capture_write_errors_total{{{SEL}}}[{RATE}]))", "write errors/s"),
                    (f"sum(rate(kthrottle_capture_files_total{{{SEL}}}[{RATE}]))", "files/s"),
                ],
            ),
            Panel(
                "Rewritten broker addresses",
                [(f"sum(rate(kthrottle_rewritten_addresses_total{{{SEL}}}[{RATE}]))", "addresses/s")],
            ),
        ],
    ),
]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(p: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": p.unit}
    if p.mappings:
        defaults["mappings"] = p.mappings
    if p.kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if p.stack else "none"}, "fillOpacity": 10}
    panel: dict[str, Any] = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(p.targets)
        ],
    }
    if p.description:
        panel["description"] = p.description
    if p.kind == "timeseries":
        panel["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom"},
            "tooltip": {"mode": "multi"},
        }
    return panel


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        pid, y, x = pid + 1, y + 1, 0
        for p in row:
            if x + p.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(p, pid, x, y))
            pid, x = pid + 1, x + p.width
        y += 8
    return {
        "title": "kthrottle",
        "uid": "kthrottle-overview",
        "description": "kthrottle Kafka throttling proxy: traffic, quotas and throttling, disk volumes, "
        "cluster quotas, reloads.",
        "tags": ["kafka", "kthrottle"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                _variable("namespace", "label_values(kthrottle_requests_total, namespace)"),
                _variable("pod", 'label_values(kthrottle_requests_total{namespace=~"$namespace"}, pod)'),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not up to date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = DASHBOARD.read_text(encoding="utf-8") if DASHBOARD.exists() else ""
        if current != text:
            print(f"{DASHBOARD} is out of date: run python -m dev.grafana_dashboard", file=sys.stderr)
            return 1
        return 0
    DASHBOARD.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD.write_text(text, encoding="utf-8")
    print(f"wrote {DASHBOARD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
