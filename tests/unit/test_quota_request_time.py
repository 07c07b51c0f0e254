"""request_percentage quotas in simulated time: Kafka's percentages, its cap, precedence, expiry."""

from __future__ import annotations

from typing import Any

import pytest

from quota.config import QuotaConfig
from quota.keys import DEFAULT
from quota.request_time import RequestTimeQuotas, exempt, seconds_to_percentage


def _cfg(**data: Any) -> QuotaConfig:
    return QuotaConfig.model_validate(data)


ONE_PERCENT = _cfg(users={"alice": {"clients": {"app": {"request_percentage": 1}}}})


def test_seconds_become_percent_of_one_second() -> None:
    assert seconds_to_percentage(1.0) == 100.0
    assert seconds_to_percentage(0.004) == pytest.approx(0.4)


def test_kafka_worked_example_gives_210_ms() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    for second in range(10):  # 4 ms a second: 0.4 % against a quota of 1 %
        assert q.record("alice", "app", 0.004, second * 1000.0).throttle_ms == 0
    # 40 ms + 67.1 ms = 10.71 % over 10.5 s: 1.02 % per second, (1.02 - 1) / 1 * 10.5 s = 210 ms.
    decision = q.record("alice", "app", 0.0671, 10_500)
    assert decision.percentage == pytest.approx(1.02)
    assert decision.throttle_ms == 210
    assert decision.throttled and decision.bucket == ("alice", "app") and decision.match is not None


def test_half_a_second_in_the_padded_window_is_capped_at_one_sample() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    # 0.5 s = 50 % in a window padded to 10 s: 5 % per second, uncapped (5 - 1) / 1 * 10 s = 40 s.
    first = q.record("alice", "app", 0.5, 0)
    assert first.percentage == pytest.approx(5.0)
    assert first.throttle_ms == 1000  # Kafka: at most quota.window.size.seconds
    for second in range(1, 11):  # the spike keeps every request at the cap while it is in the window
        assert q.record("alice", "app", 0.0, second * 1000.0).throttle_ms == 1000
    assert q.record("alice", "app", 0.0, 11_000).throttle_ms == 0  # its sample is 11 windows old


def test_under_the_cap_the_formula_is_kafkas() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    # 105 ms = 10.5 % over 10 s: 1.05 % per second, (1.05 - 1) / 1 * 10 s = 500 ms.
    assert q.record("alice", "app", 0.105, 0).throttle_ms == 500


def test_cap_follows_the_window_sample_size() -> None:
    cfg = _cfg(window={"num": 11, "size_seconds": 2}, clients={DEFAULT: {"request_percentage": 1}})
    q = RequestTimeQuotas(cfg, 0)
    assert q.record("bob", "x", 5.0, 0).throttle_ms == 2000


def test_clients_of_a_user_quota_share_one_bucket() -> None:
    cfg = _cfg(users={"alice": {"request_percentage": 1, "clients": {"own": {"request_percentage": 50}}}})
    q = RequestTimeQuotas(cfg, 0)
    assert q.record("alice", "app-1", 0.05, 0).throttle_ms == 0
    second = q.record("alice", "app-2", 0.055, 0)  # 10.5 % in the shared (alice, "") bucket
    assert second.bucket == ("alice", "") and second.match is not None and second.match.level == 3
    assert second.throttle_ms == 500
    # A (user, client-id) quota is more specific: its own bucket, untouched by the others.
    own = q.record("alice", "own", 0.01, 0)
    assert own.bucket == ("alice", "own") and own.match is not None and own.match.level == 1
    assert own.throttle_ms == 0


def test_client_id_quota_is_shared_across_users() -> None:
    cfg = _cfg(clients={DEFAULT: {"request_percentage": 1}})
    q = RequestTimeQuotas(cfg, 0)
    assert q.record("alice", "app", 0.05, 0).throttle_ms == 0
    assert q.record("bob", "app", 0.055, 0).throttle_ms == 500  # bucket ("", "app") across users
    assert q.record("bob", "other", 0.05, 0).throttle_ms == 0  # each client id has its own


def test_no_quota_no_throttle_and_no_state() -> None:
    q = RequestTimeQuotas(_cfg(users={"alice": {"producer_byte_rate": 10}}), 0)
    assert not q.active
    decision = q.record("alice", "app", 30.0, 0)
    assert (decision.throttle_ms, decision.percentage, decision.match) == (0, 0.0, None)
    assert q.rates == {} and q.snapshot(0) == []
    assert q.state("alice", "app", 0)["quota"] is None


def test_state_and_snapshot() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    q.record("alice", "app", 0.5, 0)
    state = q.state("alice", "app", 0)
    assert state["quota"] == 1 and state["level"] == 1
    assert state["bucket"] == {"user": "alice", "client_id": "app"}
    assert state["percentage"] == pytest.approx(5.0) and state["throttle_ms_total"] == 1000
    [(bucket, percentage, throttled)] = q.snapshot(0)
    assert (bucket, throttled) == (("alice", "app"), 1000) and percentage == pytest.approx(5.0)
    assert q.state("bob", "app", 0)["quota"] is None and len(q.rates) == 1  # state creates nothing


def test_negative_time_counts_as_none() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    assert q.record("alice", "app", -3.0, 0).percentage == 0.0


def test_reconfigure_keeps_rates_unless_the_window_changes() -> None:
    q = RequestTimeQuotas(ONE_PERCENT, 0)
    q.record("alice", "app", 0.105, 0)
    q.reconfigure(_cfg(users={"alice": {"clients": {"app": {"request_percentage": 0.5}}}}))
    assert q.record("alice", "app", 0.0, 0).throttle_ms == 1000  # 1.05 % against 0.5 %, capped
    q.reconfigure(_cfg(window={"num": 5}, users={"alice": {"clients": {"app": {"request_percentage": 1}}}}))
    assert q.rates == {}
    q.reconfigure(_cfg())
    assert not q.active and q.record("alice", "app", 1.0, 0).throttle_ms == 0


def test_idle_buckets_expire() -> None:
    cfg = _cfg(idle_expiry_seconds=60, clients={DEFAULT: {"request_percentage": 1}})
    q = RequestTimeQuotas(cfg, 0)
    q.record("alice", "a", 0.01, 0)
    q.record("alice", "b", 0.01, 30_000)
    assert q.maybe_expire(60_000) == 0  # not idle for longer than 60 s yet
    assert q.maybe_expire(60_500) == 0  # at most once a window sample
    assert q.maybe_expire(61_000) == 1
    assert list(q.rates) == [("", "b")]


def test_exempt_requests_follow_kafka() -> None:
    assert exempt(0, acks=0) and not exempt(0, acks=1) and not exempt(0, acks=-1)
    assert exempt(1, replica_id=2) and not exempt(1, replica_id=-1)
    assert exempt(4) and exempt(27) and exempt(56)  # LeaderAndIsr, WriteTxnMarkers, AlterPartition
    assert not exempt(3) and not exempt(18)  # Metadata, ApiVersions are charged
    assert exempt(17) and exempt(36)  # a SASL login (and re-login) is the authenticator's, not charged
