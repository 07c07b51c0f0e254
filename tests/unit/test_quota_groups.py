"""Quota groups and client-id prefixes (quotas.groups, quotas.client_id_prefixes): where they sit
beside KIP-55's eight levels, the one bucket each shares, and the config's refusals."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config
from quota.config import QuotaConfig
from quota.entities import bucket_quota, resolve
from quota.manager import ByteRateQuotas

P = "producer_byte_rate"
CFG = QuotaConfig.model_validate(
    {
        "users": {"alice": {P: 100}, "<default>": {"clients": {"pinned": {P: 400}}}},
        "clients": {"app-exact": {P: 200}, "<default>": {P: 1}},
        "client_id_prefixes": {"app-": {P: 1000}, "app-batch-": {P: 3000}},
        "groups": {
            "etl": {"users": ["alice", "loader"], P: 5000},
            "ops": {"client_ids": ["cli-1", "cli-2", "app-ops"], P: 50},
        },
    }
)


@pytest.mark.parametrize(
    ("user", "client_id", "level", "bucket", "quota", "via"),
    [
        ("alice", "x", 3, ("alice", ""), 100, ""),  # the exact user first
        ("loader", "x", 3, ("<group:etl>", ""), 5000, "group:etl"),  # then its group
        ("bob", "pinned", 4, ("bob", "pinned"), 400, ""),  # (<default> user, client) before level 7
        ("bob", "app-exact", 7, ("", "app-exact"), 200, ""),  # the exact client id first
        ("bob", "app-7f9c01", 7, ("", "<prefix:app->"), 1000, "prefix:app-"),  # then a prefix
        ("bob", "app-batch-02", 7, ("", "<prefix:app-batch->"), 3000, "prefix:app-batch-"),  # the longest
        ("bob", "app-ops", 7, ("", "<prefix:app->"), 1000, "prefix:app-"),  # a prefix before a group
        ("bob", "cli-2", 7, ("", "<group:ops>"), 50, "group:ops"),
        ("bob", "other", 8, ("", "other"), 1, ""),
    ],
)
def test_precedence(
    user: str, client_id: str, level: int, bucket: tuple[str, str], quota: float, via: str
) -> None:
    match = resolve(CFG, user, client_id, P)
    assert match is not None
    assert (match.level, match.bucket, match.quota, match.via) == (level, bucket, quota, via)
    assert bucket_quota(CFG, match.bucket, P) == match  # the metrics find the same quota


def test_generated_client_ids_share_one_bucket() -> None:
    """Twenty producers app-<random>, each at the prefix's quota: together they get it once."""
    q = ByteRateQuotas(CFG, produce=True, now_ms=0.0)
    burst = 10 * 1000  # quota x (num - 1) x size
    throttles = [q.record("bob", f"app-{i:04x}9c", burst // 10, [], 0.0).throttle_ms for i in range(20)]
    assert throttles[:10] == [0] * 10 and all(t > 0 for t in throttles[10:])
    assert set(q.clients) == {("", "<prefix:app->")}


def test_a_prefix_set_on_busy_clients_holds_from_their_next_request() -> None:
    """Two clients late-a and late-b at 1000 B/s each with no quota; a reload sets 1000 B/s on
    the prefix late-: their new shared bucket starts from what they sent together recently (as
    a quota set on one busy client does), so the next request is throttled, not given a burst."""
    base = {"window": {"num": 11, "size_seconds": 1}}
    q = ByteRateQuotas(QuotaConfig.model_validate(base), produce=True, now_ms=0.0)
    for t in range(0, 11_000, 100):
        for client in ("late-a", "late-b"):
            q.record("u", client, 100, [], float(t))
    prefixed = {**base, "client_id_prefixes": {"late-": {P: 1000}}}
    q.reconfigure(QuotaConfig.model_validate(prefixed))
    decision = q.record("u", "late-a", 100, [], 11_000.0)
    assert decision.bucket == ("", "<prefix:late->")
    assert decision.throttle_ms > 5_000, decision  # 2000 B/s against 1000: owes about 10 s of it
    # A bucket that already had history keeps it: a second reload adds nothing to it.
    q.reconfigure(QuotaConfig.model_validate(prefixed))
    assert q.record("u", "late-b", 0, [], 11_000.0).throttle_ms == decision.throttle_ms


@pytest.mark.parametrize(
    ("section", "field", "why"),
    [
        ("  groups: {g: {users: [a], client_ids: [c]}}", "quotas.groups.g", "users or client_ids"),
        ("  groups: {g: {users: [a]}, h: {users: [a]}}", "quotas.groups", "user 'a' is in groups g and h"),
        ("  groups: {g: {users: [User:a]}}", "quotas.groups.g.users.0", "without its type"),
        ("  groups: {g: {users: [a], producer_ids_rate: 1}}", "quotas.groups.g", "per user"),
        ("  client_id_prefixes: {'': {producer_byte_rate: 1}}", "quotas.client_id_prefixes", "not a prefix"),
        (
            "  client_id_prefixes: {app-: {producer_byte_rate: 0}}",
            "quotas.client_id_prefixes.app-.producer_byte_rate",
            "greater than 0",
        ),
    ],
)
def test_a_malformed_group_or_prefix_is_refused_with_its_line_and_field(
    section: str, field: str, why: str
) -> None:
    text = "gateway: {upstream_bootstrap: [b:9092]}\nquotas:\n" + section + "\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "kthrottle.yaml")
    assert f"kthrottle.yaml:3: {field}" in str(err.value) and why in str(err.value), str(err.value)
