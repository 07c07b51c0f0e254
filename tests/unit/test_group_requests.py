"""Consumer-group guard rails (quota/group_requests.py): which rate a request counts against, the
wait before the coordinator sees it, the throttle its charge leaves, reconfiguration, and the
config's refusals with their line and field."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config import ConfigError, parse_config
from quota.config import QuotaConfig
from quota.group_requests import JOIN_GROUP, OFFSET_COMMIT, SYNC_GROUP, GroupRequestQuotas, quota_key

BASE = "gateway: {upstream_bootstrap: [b:9092]}\n"


def quotas(window: dict[str, Any] | None = None, **clients: dict[str, float]) -> QuotaConfig:
    return QuotaConfig.model_validate(
        {"window": window or {"num": 10, "size_seconds": 1}, "clients": clients}
    )


def test_each_request_counts_against_its_own_rate() -> None:
    assert quota_key(JOIN_GROUP, "") == "join_group_rate"  # a new member
    assert quota_key(JOIN_GROUP, "rdkafka-1c2d") == "rejoin_group_rate"
    assert quota_key(SYNC_GROUP) == "sync_group_rate"
    assert quota_key(OFFSET_COMMIT) == "offset_commit_rate"


def test_nothing_configured_is_inactive_and_free() -> None:
    g = GroupRequestQuotas(quotas(), 0.0)
    assert not g.active and not g.api_keys
    assert g.wait_ms("join_group_rate", "u", "c", 0.0) == 0
    assert g.record("join_group_rate", "u", "c", 0.0).throttle_ms == 0
    assert not g.buckets


def test_a_crash_loop_gets_its_burst_then_joins_at_the_rate() -> None:
    # 0.5 joins/s, window 10 x 1 s: a burst of 5 joins, then one every 2 s.
    g = GroupRequestQuotas(quotas(**{"looper": {"join_group_rate": 0.5}}), 0.0)
    assert g.active and g.api_keys == {JOIN_GROUP}
    throttles = [g.record("join_group_rate", "ANONYMOUS", "looper", 0.0).throttle_ms for _ in range(5)]
    assert throttles == [0, 0, 0, 0, 0]
    assert g.record("join_group_rate", "ANONYMOUS", "looper", 0.0).throttle_ms == 2000  # owes one
    # The next join, on whatever connection, waits until the bucket owes nothing.
    assert g.wait_ms("join_group_rate", "ANONYMOUS", "looper", 500.0) == 1500
    assert g.wait_ms("join_group_rate", "ANONYMOUS", "looper", 2000.0) == 0
    assert g.record("join_group_rate", "ANONYMOUS", "looper", 2000.0).throttle_ms == 2000
    # Other clients and other rates are not affected.
    assert g.wait_ms("join_group_rate", "ANONYMOUS", "healthy", 2000.0) == 0
    assert g.wait_ms("rejoin_group_rate", "ANONYMOUS", "looper", 2000.0) == 0


def test_the_kip55_levels_decide_the_bucket_and_the_admin_view_shows_it() -> None:
    cfg = quotas(**{"<default>": {"offset_commit_rate": 10.0}, "special": {"offset_commit_rate": 1.0}})
    g = GroupRequestQuotas(cfg, 0.0)
    g.record("offset_commit_rate", "u", "a", 0.0)
    state = g.state("u", "a", 0.0)["offset_commit_rate"]
    assert state["quota"] == 10.0 and state["bucket"] == {"user": "", "client_id": "a"}
    assert state["tokens"] == pytest.approx(99.0) and state["burst"] == 100.0
    assert g.state("u", "special", 0.0)["offset_commit_rate"]["quota"] == 1.0
    assert "join_group_rate" not in g.state("u", "a", 0.0)


def test_a_reload_keeps_the_debt_at_the_new_rate_and_drops_removed_quotas() -> None:
    g = GroupRequestQuotas(quotas(**{"looper": {"join_group_rate": 0.5}}), 0.0)
    for _ in range(6):
        g.record("join_group_rate", "u", "looper", 0.0)
    g.reconfigure(quotas(**{"looper": {"join_group_rate": 1.0}}), 0.0)
    assert g.wait_ms("join_group_rate", "u", "looper", 0.0) == 1000  # one owed, at 1/s now
    g.reconfigure(quotas(), 0.0)
    assert not g.active and not g.buckets


@pytest.mark.parametrize(
    ("section", "field", "why"),
    [
        ("{clients: {a: {join_group_rate: 0}}}", "quotas.clients.a.join_group_rate", "greater than 0"),
        ("{clients: {a: {sync_group_rate: fast}}}", "quotas.clients.a.sync_group_rate", "valid number"),
        ("{clients: {a: {offset_commit_rate: 1, scope: cluster}}}", "quotas.clients.a", "scope cluster"),
        ("{clients: {a: {join_rate: 1}}}", "quotas.clients.a.join_rate", "Extra inputs"),
    ],
)
def test_a_malformed_group_rate_is_refused_with_its_line_and_field(
    section: str, field: str, why: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + "quotas: " + section + "\n", "kthrottle.yaml")
    assert f"kthrottle.yaml:2: {field}" in str(err.value) and why in str(err.value), str(err.value)
