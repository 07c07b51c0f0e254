"""Per-entity quota metrics are collected at scrape time with bounded label cardinality."""

from __future__ import annotations

import pytest
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


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_named_series_are_stable_and_other_counters_only_go_up() -> None:
    """Entities whose rates cross each other between scrapes keep their series (hysteresis), and
    __other__'s throttle counter never goes down, whoever is named."""
    from proxy.admin.quota_metrics import HOLD_SCRAPES

    now = [100.0]
    cfg = QuotaConfig.model_validate({"clients": {"<default>": {"producer_byte_rate": 100}}})
    enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(QuotaCollector(enforcer, max_series=2))
    throttle, rate = "kthrottle_client_throttle_time_ms_total", "kthrottle_client_byte_rate"
    other = (("client_id", OTHER), ("direction", "produce"), ("user", OTHER))
    previous_other = 0.0
    named_seen: list[set[str]] = []
    for step in range(3 * HOLD_SCRAPES):
        # Four clients over their quota; a different one busiest each step.
        for i in range(4):
            size = 5000 if i == step % 4 else 1000
            enforcer.produce.record("ANONYMOUS", f"c{i}", size, [], enforcer.now_ms())
        samples = _scrape(registry)
        names = {dict(labels)["client_id"] for name, labels in samples if name == rate} - {OTHER}
        assert len(names) <= 2
        named_seen.append(names)
        assert samples[(throttle, other)] >= previous_other
        previous_other = samples[(throttle, other)]
        now[0] += 1.0
    assert previous_other > 0


def test_a_named_entity_keeps_its_series_until_it_has_been_out_of_the_busiest_for_a_while() -> None:
    """The busiest two swap with two others every scrape: without hysteresis every series would
    come and go each scrape; here the first two keep theirs, and the other two's counters go to
    __other__, which never goes down."""
    from proxy.admin.quota_metrics import HOLD_SCRAPES, SeriesSelector

    selector = SeriesSelector()
    totals = {k: 0.0 for k in "abcd"}
    other_before = 0.0
    assert HOLD_SCRAPES >= 10  # a few minutes at Prometheus's usual 15-30 s scrape interval
    for scrape in range(9):
        busy = "ab" if scrape % 2 == 0 else "cd"
        for k in totals:
            totals[k] += 10.0 if k in busy else 1.0
        rows = sorted((((k,), 10.0 if k in busy else 1.0, totals[k]) for k in totals), key=lambda r: -r[1])
        named, _rest = selector.select(rows, 2, counters=[1])
        assert {r[0][0] for r in named} == {"a", "b"}, scrape
        assert selector.other_counters.get(1, 0.0) >= other_before
        other_before = selector.other_counters.get(1, 0.0)
    assert other_before == totals["c"] + totals["d"]  # all they throttled, none lost or doubled
    for _ in range(HOLD_SCRAPES):  # a and b go quiet for good: c and d take their places
        rows = [
            (("c",), 10.0, totals["c"]),
            (("d",), 10.0, totals["d"]),
            (("a",), 0.0, totals["a"]),
            (("b",), 0.0, totals["b"]),
        ]
        named, _rest = selector.select(rows, 2, counters=[1])
    assert {r[0][0] for r in named} == {"c", "d"}


def test_each_named_bucket_has_its_quota_beside_its_rate() -> None:
    now = [100.0]
    cfg = QuotaConfig.model_validate(
        {"clients": {"<default>": {"producer_byte_rate": 1000}, "big": {"producer_byte_rate": 5000}}}
    )
    enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
    enforcer.produce.record("ANONYMOUS", "big", 100, [], enforcer.now_ms())
    enforcer.produce.record("ANONYMOUS", "small", 100, [], enforcer.now_ms())
    registry = CollectorRegistry()
    registry.register(QuotaCollector(enforcer))
    quotas = {
        dict(labels)["client_id"]: v
        for (name, labels), v in _scrape(registry).items()
        if name == "kthrottle_client_quota"
    }
    assert quotas == {"big": 5000.0, "small": 1000.0}  # small's bucket is its own, at the <default> quota


def test_each_named_bucket_has_its_usage_against_its_quota() -> None:
    """kthrottle_client_quota_usage_ratio: the rate over the quota, what the chart's alerts read."""
    now = [100.0]
    cfg = QuotaConfig.model_validate({"clients": {"big": {"producer_byte_rate": 5000}}})
    enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
    enforcer.produce.record("ANONYMOUS", "big", 40_000, [], enforcer.now_ms())
    enforcer.produce.record("ANONYMOUS", "free", 40_000, [], enforcer.now_ms())  # no quota: no ratio
    registry = CollectorRegistry()
    registry.register(QuotaCollector(enforcer))
    scraped = _scrape(registry)
    ratios = {
        dict(labels)["client_id"]: v
        for (name, labels), v in scraped.items()
        if name == "kthrottle_client_quota_usage_ratio"
    }
    rates = {
        dict(labels)["client_id"]: v
        for (name, labels), v in scraped.items()
        if name == "kthrottle_client_byte_rate"
    }
    assert set(ratios) == {"big"}
    assert ratios["big"] == pytest.approx(rates["big"] / 5000)
