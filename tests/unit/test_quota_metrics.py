"""Per-entity quota metrics are collected at scrape time with bounded label cardinality."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from proxy.metrics import ProxyMetrics
from proxy.quota_metrics import OTHER, QuotaCollector
from proxy.throttling import QuotaEnforcer
from quota.config import QuotaConfig


def test_series_are_bounded_and_the_rest_summed() -> None:
    now = [100.0]
    cfg = QuotaConfig.model_validate({"clients": {"<default>": {"producer_byte_rate": 1000}}})
    enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
    for i in range(50):
        enforcer.produce.record("ANONYMOUS", f"c{i}", 100 * (i + 1), [], enforcer.now_ms())
    registry = CollectorRegistry()
    registry.register(QuotaCollector(enforcer, max_series=10))
    text = generate_latest(registry).decode()
    rate_lines = [line for line in text.splitlines() if line.startswith("kthrottle_client_byte_rate{")]
    assert len(rate_lines) == 11  # the 10 busiest, plus one series for the rest
    assert 'client_id="c49"' in text  # the busiest client has its own series
    assert f'client_id="{OTHER}"' in text
    # 40 clients summed under __other__: (100 + ... + 4000) bytes over the padded 10 s window.
    other = next(line for line in rate_lines if OTHER in line)
    assert float(other.rsplit(" ", 1)[1]) == sum(100 * (i + 1) for i in range(40)) / 10
