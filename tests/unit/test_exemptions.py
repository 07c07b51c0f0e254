"""quotas.exempt: which requests no quota holds back (quota/exemptions.py), and the config's
refusals with their line."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config
from quota.config import ExemptConfig, QuotaConfig
from quota.exemptions import Exemptions, parse_address
from quota.manager import ByteRateQuotas, PartitionUsage

BASE = "gateway: {upstream_bootstrap: [b:9092]}\n"


def exemptions(**cfg: list[str]) -> Exemptions:
    return Exemptions(ExemptConfig.model_validate(cfg))


def test_nothing_listed_exempts_nothing() -> None:
    ex = exemptions()
    assert not ex.any
    assert not ex.request(ex.source("bootstrap", parse_address("10.0.0.1")), "alice", "app")


@pytest.mark.parametrize(
    ("listener", "address", "user", "client_id", "exempt"),
    [
        ("bootstrap", "192.168.1.5", "replicator", "any", True),  # by user
        ("bootstrap", "192.168.1.5", "alice", "ops-admin", True),  # by client id
        ("broker-3", "192.168.1.5", "alice", "app", True),  # every broker port
        ("bootstrap", "192.168.1.5", "alice", "app", False),
        ("bootstrap", "10.20.3.4", "alice", "app", True),  # by source network
        ("bootstrap", "fd00::7", "alice", "app", True),
        ("bootstrap", "fd01::7", "alice", "app", False),
        ("bootstrap", None, "alice", "app", False),  # not an IP: no network matches
    ],
)
def test_a_request_is_exempt_by_user_client_id_listener_or_source(
    listener: str, address: str | None, user: str, client_id: str, exempt: bool
) -> None:
    ex = exemptions(
        users=["replicator"],
        client_ids=["ops-admin"],
        listeners=["brokers"],
        source_cidrs=["10.20.0.0/16", "fd00::/16"],
    )
    assert ex.request(ex.source(listener, parse_address(address)), user, client_id) is exempt


def test_addresses_parse_as_sockets_give_them() -> None:
    assert str(parse_address("[fd00::7]")) == "fd00::7"
    assert str(parse_address("fe80::1%eth0")) == "fe80::1"
    assert parse_address("/run/kthrottle.sock") is None and parse_address(None) is None


@pytest.mark.parametrize(
    ("section", "line", "field", "why"),
    [
        (
            "  exempt: {source_cidrs: [10.0.0.1/8]}",
            3,
            "quotas.exempt.source_cidrs",
            "the network is 10.0.0.0/8",
        ),
        (
            "  exempt: {listeners: [admin]}",
            3,
            "quotas.exempt.listeners.0",
            "'bootstrap', 'brokers' or 'sidecar'",
        ),
        ("  exempt: {users: [User:ops]}", 3, "quotas.exempt.users.0", "without its type"),
        ("  exempt: {clients: [x]}", 3, "quotas.exempt.clients", "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_exempt_section_is_refused_with_its_line_and_field(
    section: str, line: int, field: str, why: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(BASE + "quotas:\n" + section + "\n", "kthrottle.yaml")
    assert f"kthrottle.yaml:{line}: {field}" in str(err.value) and why in str(err.value), str(err.value)


def test_an_exempt_clients_bytes_are_measured_but_owe_nothing() -> None:
    """What the enforcer does with an exempt request: decided (the throttle it would have had is
    reported), then its charge taken back from the buckets but not from the measured rate, so
    /quotas/entity and the metrics show it, and neither it, once taken off the list, nor the
    others of a bucket it shares (here a topic's partition) are held back by what it sent."""
    cfg = QuotaConfig.model_validate(
        {
            "clients": {"<default>": {"producer_byte_rate": 1000}},
            "topics": {"t": {"producer.byte.rate": 1000}},
            "exempt": {"client_ids": ["ops"]},
        }
    )
    q = ByteRateQuotas(cfg, produce=True, now_ms=0.0)
    parts = [PartitionUsage("t", 0, 50_000)]
    decision = q.record("u", "ops", 50_000, parts, 0.0)
    assert decision.throttle_ms > 0  # decided, and reported
    q.unrecord(decision, 50_000, parts, 0.0, keep_rates=True)
    assert q.clients[decision.bucket].measure(1.0) > 1000  # still measured
    other = q.record("u", "app", 100, [PartitionUsage("t", 0, 100)], 1.0)
    assert other.throttle_ms == 0  # the shared partition owes nothing for it
    again = q.record("u", "ops", 100, [], 2.0)
    assert again.client_throttle_ms == 0  # nor does its own bucket
