"""Per-entity quota metrics are collected at scrape time with bounded label cardinality."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from proxy.admin.quota_metrics import OTHER, QuotaCollector
from proxy.metrics import ProxyMetrics
from proxy.shared.throttling import QuotaEnforcer
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


def test_admission_quota_series() -> None:
    now = [100.0]
    cfg = QuotaConfig.model_validate(
        {
            "clients": {"<default>": {"controller_mutation_rate": 2, "request_percentage": 10}},
            "users": {"<default>": {"producer_ids_rate": 1}},
            "ips": {"<default>": {"connection_creation_rate": 1}},
        }
    )
    enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
    t = enforcer.now_ms()
    for i in range(3):
        enforcer.mutations.admit("ANONYMOUS", f"admin{i}", [30], True, t)  # burst 22: each goes to -8
    enforcer.producer_ids.record("alice", range(1, 50), t)
    enforcer.request_time.record("ANONYMOUS", "busy", 0.5, t)
    enforcer.connections.on_accept("10.0.0.1", t)
    registry = CollectorRegistry()
    registry.register(QuotaCollector(enforcer, max_series=2))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }
    tokens = {labels: v for (name, labels), v in samples.items() if name == "kthrottle_mutation_tokens"}
    assert len(tokens) == 3  # two buckets, and __other__ with the lowest of the rest
    assert tokens[(("client_id", OTHER), ("user", OTHER))] == -8
    assert samples[("kthrottle_producer_id_rate", (("user", "alice"),))] > 0
    assert samples[("kthrottle_producer_id_filter_bytes_total", ())] > 0
    assert samples[("kthrottle_request_time_percentage", (("client_id", "busy"), ("user", "")))] == 5.0
    assert samples[("kthrottle_connection_creation_rate", (("ip", "10.0.0.1"),))] > 0
