"""KIP-55 precedence across all eight levels, buckets, topic quotas, expiry, in simulated time."""

from __future__ import annotations

from typing import Any

import pytest

from quota.config import QuotaConfig
from quota.entities import resolve, topic_quota
from quota.keys import DEFAULT, PRODUCER_BYTE_RATE
from quota.manager import ByteRateQuotas, PartitionUsage

ALL_LEVELS: dict[str, Any] = {
    "users": {
        "alice": {
            "producer_byte_rate": 3,
            "clients": {"app": {"producer_byte_rate": 1}, DEFAULT: {"producer_byte_rate": 2}},
        },
        DEFAULT: {
            "producer_byte_rate": 6,
            "clients": {"app": {"producer_byte_rate": 4}, DEFAULT: {"producer_byte_rate": 5}},
        },
    },
    "clients": {"app": {"producer_byte_rate": 7}, DEFAULT: {"producer_byte_rate": 8}},
}


def _without(data: dict[str, Any], level: int) -> dict[str, Any]:
    """Remove the quota that sits at ``level`` (levels as numbered in quota.entities)."""
    import copy

    d = copy.deepcopy(data)
    where = {
        1: lambda: d["users"]["alice"]["clients"].pop("app"),
        2: lambda: d["users"]["alice"]["clients"].pop(DEFAULT),
        3: lambda: d["users"]["alice"].pop("producer_byte_rate"),
        4: lambda: d["users"][DEFAULT]["clients"].pop("app"),
        5: lambda: d["users"][DEFAULT]["clients"].pop(DEFAULT),
        6: lambda: d["users"][DEFAULT].pop("producer_byte_rate"),
        7: lambda: d["clients"].pop("app"),
        8: lambda: d["clients"].pop(DEFAULT),
    }
    where[level]()
    return d


EXPECTED_BUCKETS = {
    1: ("alice", "app"),
    2: ("alice", "app"),
    3: ("alice", ""),
    4: ("alice", "app"),
    5: ("alice", "app"),
    6: ("alice", ""),
    7: ("", "app"),
    8: ("", "app"),
}


def test_precedence_walks_all_eight_levels() -> None:
    data = ALL_LEVELS
    for level in range(1, 9):
        match = resolve(QuotaConfig.model_validate(data), "alice", "app", PRODUCER_BYTE_RATE)
        assert match is not None
        assert (match.level, match.quota, match.bucket) == (level, level, EXPECTED_BUCKETS[level])
        data = _without(data, level)
    assert resolve(QuotaConfig.model_validate(data), "alice", "app", PRODUCER_BYTE_RATE) is None


def test_quota_kinds_resolve_independently() -> None:
    cfg = QuotaConfig.model_validate(
        {"users": {"bob": {"consumer_byte_rate": 10}}, "clients": {DEFAULT: {"producer_byte_rate": 20}}}
    )
    produce = resolve(cfg, "bob", "x", "producer_byte_rate")
    fetch = resolve(cfg, "bob", "x", "consumer_byte_rate")
    assert produce is not None and (produce.level, produce.bucket) == (8, ("", "x"))
    assert fetch is not None and (fetch.level, fetch.bucket) == (3, ("bob", ""))


def test_topic_quota_falls_back_to_default_topic() -> None:
    cfg = QuotaConfig.model_validate(
        {
            "topics": {
                "orders": {"producer.byte.rate": 100},
                DEFAULT: {"producer.byte.rate": 5, "consumer.byte.rate": 7},
            }
        }
    )
    assert topic_quota(cfg, "orders", produce=True) == 100
    assert topic_quota(cfg, "orders", produce=False) == 7
    assert topic_quota(cfg, "other", produce=True) == 5


def test_user_level_bucket_is_shared_by_its_clients() -> None:
    cfg = QuotaConfig.model_validate({"users": {"alice": {"producer_byte_rate": 1000}}})
    q = ByteRateQuotas(cfg, produce=True, now_ms=0)
    assert q.record("alice", "a", 10_000, [], 0).throttle_ms == 0  # 10 kB over a padded 10 s window
    # The second client id shares alice's bucket: 20 kB in 10 s is 2000 B/s, twice the quota.
    d = q.record("alice", "b", 10_000, [], 0)
    assert d.bucket == ("alice", "") and d.throttle_ms == 10_000


def test_client_level_buckets_are_separate() -> None:
    cfg = QuotaConfig.model_validate({"clients": {DEFAULT: {"producer_byte_rate": 1000}}})
    q = ByteRateQuotas(cfg, produce=True, now_ms=0)
    assert q.record("u1", "a", 10_000, [], 0).throttle_ms == 0
    assert q.record("u2", "b", 10_000, [], 0).throttle_ms == 0
    assert q.record("u3", "a", 10_000, [], 0).throttle_ms == 10_000  # client a's own bucket, across users


def test_partition_quota_throttles_by_partition() -> None:
    cfg = QuotaConfig.model_validate({"topics": {"t": {"producer.byte.rate": 100}}})
    q = ByteRateQuotas(cfg, produce=True, now_ms=0)
    parts = [PartitionUsage("t", 0, 1000), PartitionUsage("t", 1, 3000), PartitionUsage("u", 0, 10**6)]
    d = q.record("alice", "app", 4000, parts, 0)
    # Partition 1: 3000 B over 10 s = 300 B/s, 200% over 100 B/s -> 20 s; partition 0 is at quota.
    assert (d.client_throttle_ms, d.partition_throttle_ms, d.throttle_ms) == (0, 20_000, 20_000)
    assert d.worst_partition == ("t", 1)
    assert ("u", 0) not in q.partitions  # no quota for topic u, no state kept


def test_fetch_unrecord_and_window_cap() -> None:
    cfg = QuotaConfig.model_validate({"clients": {"c": {"consumer_byte_rate": 1000}}})
    q = ByteRateQuotas(cfg, produce=False, now_ms=0)
    assert q.max_bytes_in_window("x", "c") == 10_000
    assert q.max_bytes_in_window("x", "other") is None
    d = q.record("x", "c", 20_000, [], 0)
    assert d.throttled
    q.unrecord(d, 20_000, [], 0)
    assert q.clients[("", "c")].total(0) == 0


def test_idle_state_expires() -> None:
    cfg = QuotaConfig.model_validate(
        {"clients": {DEFAULT: {"producer_byte_rate": 1000}}, "idle_expiry_seconds": 60}
    )
    q = ByteRateQuotas(cfg, produce=True, now_ms=0)
    for i in range(1000):
        q.record("ANONYMOUS", f"client-{i}", 10, [], 0)
    assert len(q.clients) == 1000
    q.record("ANONYMOUS", "late", 10, [], 59_000)
    assert len(q.clients) == 1001
    assert q.maybe_expire(61_000) == 1000
    assert list(q.clients) == [("", "late")]


def test_reconfigure_moves_entity_to_new_level() -> None:
    cfg = QuotaConfig.model_validate({"clients": {DEFAULT: {"producer_byte_rate": 1000}}})
    q = ByteRateQuotas(cfg, produce=True, now_ms=0)
    assert q.record("alice", "app", 100, [], 0).bucket == ("", "app")
    q.reconfigure(QuotaConfig.model_validate({"users": {"alice": {"producer_byte_rate": 50}}}))
    d = q.record("alice", "app", 100, [], 0)
    assert d.bucket == ("alice", "") and d.match is not None and d.match.quota == 50


@pytest.mark.parametrize(
    "bad", [{"clients": {"a": {"producer_byte_rate": 0}}}, {"users": {"a": {"nope": 1}}}]
)
def test_invalid_quota_config_is_refused(bad: dict[str, Any]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        QuotaConfig.model_validate(bad)
