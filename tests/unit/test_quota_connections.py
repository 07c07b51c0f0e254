"""KIP-612 connection_creation_rate per IP in simulated time: Kafka's throttle, isolation, lookup."""

from __future__ import annotations

from typing import Any

import pytest

from quota.config import QuotaConfig
from quota.connections import ConnectionDecision, ConnectionRateQuotas, canonical_ip
from quota.keys import DEFAULT


def _cfg(**data: Any) -> QuotaConfig:
    return QuotaConfig.model_validate(data)


def _default(rate: float, **more: Any) -> QuotaConfig:
    return _cfg(ips={DEFAULT: {"connection_creation_rate": rate}}, **more)


def test_under_quota_no_throttle() -> None:
    q = ConnectionRateQuotas(_default(10), 0)
    assert q.active
    for i in range(100):  # 5 connections a second for 20 s
        decision = q.on_accept("10.0.0.1", i * 200.0)
        assert decision.throttle_ms == 0 and decision.quota == 10


def test_burst_over_quota_gets_kafkas_throttle_and_is_unrecorded() -> None:
    q = ConnectionRateQuotas(_default(10), 0)
    for _ in range(100):  # 100 in a window padded to 10 s: exactly 10/s, allowed
        assert q.on_accept("10.0.0.1", 0).throttle_ms == 0
    over = q.on_accept("10.0.0.1", 0)
    # 101 / 10 s = 10.1/s: (10.1 - 10) / 10 * 10 s = 100 ms; then the connection is taken back out.
    assert over.rate == pytest.approx(10.1) and over.throttle_ms == 100 and over.throttled
    assert q.rates["10.0.0.1"].total(0) == 100
    assert q.on_accept("10.0.0.1", 0).throttle_ms == 100  # the next one sees the same rate
    assert q.state("10.0.0.1", 0)["throttle_ms_total"] == 200


def test_throttle_is_capped_at_one_window_sample() -> None:
    q = ConnectionRateQuotas(_default(0.5), 0)
    for _ in range(5):
        assert q.on_accept("10.0.0.1", 0).throttle_ms == 0
    # 6 / 10 s = 0.6/s: uncapped (0.6 - 0.5) / 0.5 * 10 s = 2000 ms; Kafka caps at 1000.
    assert q.on_accept("10.0.0.1", 0).throttle_ms == 1000


def test_burst_stops_counting_once_its_sample_expires() -> None:
    q = ConnectionRateQuotas(_default(10), 0)
    for _ in range(101):
        q.on_accept("10.0.0.1", 0)
    assert q.on_accept("10.0.0.1", 10_000).throttled  # window 10 s: still 10.1/s
    assert not q.on_accept("10.0.0.1", 11_000).throttled


def test_one_ips_storm_does_not_affect_another() -> None:
    q = ConnectionRateQuotas(_default(2), 0)
    throttled = sum(q.on_accept("10.0.0.1", ms / 10).throttled for ms in range(1000))
    assert throttled == 1000 - 20
    assert q.on_accept("10.0.0.2", 100).throttle_ms == 0
    assert q.state("10.0.0.2", 100)["rate"] == pytest.approx(0.1)
    assert {ip for ip, _, _ in q.snapshot(100)} == {"10.0.0.1", "10.0.0.2"}


def test_exact_ip_beats_default() -> None:
    cfg = _cfg(ips={DEFAULT: {"connection_creation_rate": 1}, "10.0.0.7": {"connection_creation_rate": 100}})
    q = ConnectionRateQuotas(cfg, 0)
    assert not any(q.on_accept("10.0.0.7", 0).throttled for _ in range(50))
    assert sum(q.on_accept("10.0.0.8", 0).throttled for _ in range(50)) == 40
    assert q.state("10.0.0.7", 0)["source"] == "ip" and q.state("10.0.0.7", 0)["quota"] == 100
    assert q.state("10.0.0.8", 0)["source"] == "default" and q.state("10.0.0.8", 0)["quota"] == 1


def test_exact_ip_alone_leaves_others_unlimited() -> None:
    q = ConnectionRateQuotas(_cfg(ips={"10.0.0.7": {"connection_creation_rate": 1}}), 0)
    assert q.active
    assert not any(q.on_accept("10.0.0.8", 0).throttled for _ in range(1000))
    assert q.on_accept("10.0.0.8", 0).quota is None and q.state("10.0.0.8", 0)["source"] is None
    assert list(q.rates) == []


def test_ip_entry_without_a_rate_falls_back_to_default() -> None:
    cfg = _cfg(ips={DEFAULT: {"connection_creation_rate": 3}, "10.0.0.7": {}})
    assert ConnectionRateQuotas(cfg, 0).quota("10.0.0.7") == 3


def test_ips_are_compared_as_addresses() -> None:
    cfg = _cfg(
        ips={"10.0.0.7": {"connection_creation_rate": 7}, "2001:0db8:0::1": {"connection_creation_rate": 6}}
    )
    q = ConnectionRateQuotas(cfg, 0)
    assert q.quota("::ffff:10.0.0.7") == 7  # a dual-stack socket's spelling of an IPv4 peer
    assert q.quota("2001:db8::1") == 6
    assert q.on_accept("::ffff:10.0.0.7", 0).quota == 7 and list(q.rates) == ["10.0.0.7"]
    assert canonical_ip("not-an-ip") == "not-an-ip"


def test_no_quota_no_state() -> None:
    q = ConnectionRateQuotas(_cfg(), 0)
    assert not q.active
    assert q.on_accept("10.0.0.1", 0) == ConnectionDecision(0, 0.0, None)
    assert q.rates == {} and q.snapshot(0) == []


def test_reconfigure_keeps_rates_unless_the_window_changes() -> None:
    q = ConnectionRateQuotas(_default(10), 0)
    for _ in range(20):
        q.on_accept("10.0.0.1", 0)
    q.reconfigure(_default(1))
    assert q.on_accept("10.0.0.1", 0).throttle_ms == 1000  # 21 / 10 s against 1/s, capped
    q.reconfigure(_default(1, window={"num": 3, "size_seconds": 1}))
    assert q.rates == {}
    q.reconfigure(_cfg())
    assert not q.active and q.on_accept("10.0.0.1", 0).quota is None


def test_idle_ips_expire() -> None:
    q = ConnectionRateQuotas(_default(10, idle_expiry_seconds=60), 0)
    q.on_accept("10.0.0.1", 0)
    q.on_accept("10.0.0.2", 30_000)
    assert q.maybe_expire(60_000) == 0
    assert q.maybe_expire(61_000) == 1
    assert list(q.rates) == ["10.0.0.2"]
    assert q.maybe_expire(91_000) == 1 and q.snapshot(91_000) == []
