"""The chart's alerting rules (metrics.prometheusRule), checked and evaluated by Prometheus's own
promtool against series shaped as the proxy exports them: each alert fires when what it names has
lasted its ``for``, not before, and not for what it leaves out."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART

USAGE = (
    "kthrottle_client_quota_usage_ratio"
    + '{{direction="produce",user="alice",client_id="{cid}",instance="{inst}"}}'
)
THROTTLE = (
    "kthrottle_client_throttle_time_ms_total"
    + '{{direction="fetch",user="ANONYMOUS",client_id="{cid}",instance="a"}}'
)
REFUSED = 'kthrottle_mutation_rejected_topics_total{{api="CreateTopics",mode="{mode}",instance="a"}}'


def _rules(helm: str, tmp_path: Path, **rule: Any) -> Path:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"metrics": {"prometheusRule": {"enabled": True, **rule}}}))
    cmd = [
        helm,
        "template",
        "r",
        str(CHART),
        "--set",
        "gateway.upstreamBootstrap={b:9092}",
        "-f",
        str(values),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    (rule,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _alert(name: str, labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    return {
        "exp_labels": {"alertname": name, **labels},
        "exp_annotations": {"summary": summary, "description": description},
    }


HIGH = (
    "Sustained for 5m: it will be throttled soon, or its quota is too tight "
    "(kthrottle tune proposes one from its traffic)."
)
REACHED = "At or over its quota for 5m: the proxy throttles it; it wants more than it is given."


def _run(promtool: str, rules: Path, series: list[dict[str, str]], checks: list[dict[str, Any]]) -> None:
    for check in checks:
        for alert in check["exp_alerts"]:
            alert["exp_labels"].pop("alertname")
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": checks}],
    }
    path = rules.parent / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", path.name], cwd=rules.parent, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_load_in_prometheus(helm: str, promtool: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(_rules(helm, tmp_path))], capture_output=True, text=True
    )
    assert result.returncode == 0 and "SUCCESS: 4 rules found" in result.stdout, result.stdout + result.stderr


def test_usage_alerts_fire_once_sustained_and_name_the_entity(
    helm: str, promtool: str, tmp_path: Path
) -> None:
    labels = {"severity": "warning", "direction": "produce", "user": "alice"}
    series = [
        {"series": USAGE.format(cid="near", inst="a"), "values": "0.85x10"},
        {"series": USAGE.format(cid="near", inst="b"), "values": "0.85x10"},  # a second replica: one alert
        {"series": USAGE.format(cid="held", inst="a"), "values": "1x10"},
        {"series": USAGE.format(cid="blip", inst="a"), "values": "0.9 0.9 0.9 0.3x7"},  # not sustained
        {"series": USAGE.format(cid="__other__", inst="a"), "values": "1x10"},  # no entity to name
    ]
    checks: list[dict[str, Any]] = [
        {"eval_time": "4m", "alertname": "KthrottleQuotaUsageHigh", "exp_alerts": []},
        {"eval_time": "4m", "alertname": "KthrottleQuotaReached", "exp_alerts": []},
        {
            "eval_time": "6m",
            "alertname": "KthrottleQuotaUsageHigh",
            "exp_alerts": [
                _alert(
                    "KthrottleQuotaUsageHigh",
                    {**labels, "client_id": "near"},
                    "produce of user alice, client near at 85% of its quota",
                    HIGH,
                )
            ],
        },
        {
            "eval_time": "6m",
            "alertname": "KthrottleQuotaReached",
            "exp_alerts": [
                _alert(
                    "KthrottleQuotaReached",
                    {**labels, "client_id": "held"},
                    "produce of user alice, client held held at its quota",
                    REACHED,
                )
            ],
        },
    ]
    _run(promtool, _rules(helm, tmp_path), series, checks)


def test_throttle_time_and_refused_mutations_alert(helm: str, promtool: str, tmp_path: Path) -> None:
    series = [
        {"series": THROTTLE.format(cid="slow"), "values": "0+36000x12"},  # 600 ms of throttle a second
        {"series": THROTTLE.format(cid="fine"), "values": "0+6000x12"},  # 100 ms a second
        {"series": REFUSED.format(mode="applied"), "values": "0+2x12"},
        {
            "series": REFUSED.format(mode="dry-run").replace("CreateTopics", "DeleteTopics"),
            "values": "0+2x12",
        },
    ]
    checks = [
        {
            "eval_time": "11m",
            "alertname": "KthrottleClientThrottled",
            "exp_alerts": [
                _alert(
                    "KthrottleClientThrottled",
                    {"severity": "warning", "direction": "fetch", "user": "ANONYMOUS", "client_id": "slow"},
                    "fetch of user ANONYMOUS, client slow throttled 60% of the time",
                    "Throttle time decided per second of wall time, summed over the replicas and "
                    "connections, for 5m.",
                )
            ],
        },
        {
            "eval_time": "11m",
            "alertname": "KthrottleMutationsRefused",
            "exp_alerts": [
                _alert(
                    "KthrottleMutationsRefused",
                    {"severity": "warning", "api": "CreateTopics"},
                    "CreateTopics: topics refused with THROTTLING_QUOTA_EXCEEDED",
                    "controller_mutation_rate has refused topic creations, deletions or partition changes "
                    "for 5m (KIP-599).",
                )
            ],
        },
    ]
    _run(promtool, _rules(helm, tmp_path), series, checks)


@pytest.mark.parametrize(
    ("setting", "fires_at_6m"),
    [({"usageWarning": 0.9}, False), ({"for": "2m"}, True)],
)
def test_the_thresholds_are_values(
    helm: str, promtool: str, tmp_path: Path, setting: dict[str, Any], fires_at_6m: bool
) -> None:
    series = [{"series": USAGE.format(cid="near", inst="a"), "values": "0.85x10"}]
    got = setting.get("for", "5m")
    expected = [
        _alert(
            "KthrottleQuotaUsageHigh",
            {"severity": "warning", "direction": "produce", "user": "alice", "client_id": "near"},
            "produce of user alice, client near at 85% of its quota",
            HIGH.replace("5m", got),
        )
    ]
    checks = [
        {
            "eval_time": "6m",
            "alertname": "KthrottleQuotaUsageHigh",
            "exp_alerts": expected if fires_at_6m else [],
        }
    ]
    _run(promtool, _rules(helm, tmp_path, **setting), series, checks)
