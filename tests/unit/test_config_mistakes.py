"""Config mistakes that would load and never match are refused at load, with the line, the
field and the fix (issue 30 item 5)."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config
from quota.config import QuotaConfig

GATEWAY = "mode: gateway\ngateway:\n  upstream_bootstrap: [127.0.0.1:9092]\n"


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        (
            "  ips:\n    kafka.example.com: {connection_creation_rate: 5}\n",
            r"k\.yaml:6: quotas\.ips\.kafka\.example\.com: .*not an IP address.*networks never match",
        ),
        (
            "  ips:\n    10.0.0.0/8: {connection_creation_rate: 5}\n",
            r"k\.yaml:6: quotas\.ips\.10\.0\.0\.0/8: ",
        ),
        (
            "  users:\n    User:alice: {producer_byte_rate: 1000}\n",
            r"k\.yaml:6: quotas\.users\.User:alice: .*without its type; write 'alice'",
        ),
    ],
)
def test_a_key_that_can_never_match_is_refused_with_its_line(quotas: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(GATEWAY + "quotas:\n" + quotas, "k.yaml")


def test_addresses_and_plain_user_names_load() -> None:
    text = (
        "quotas:\n  ips:\n    10.0.0.5: {connection_creation_rate: 5}\n"
        "    '2001:db8::5': {connection_creation_rate: 5}\n"
        "    <default>: {connection_creation_rate: 50}\n  users:\n    alice: {producer_byte_rate: 1000}\n"
    )
    cfg = parse_config(GATEWAY + text, "k.yaml").quotas
    assert set(cfg.ips) == {"10.0.0.5", "2001:db8::5", "<default>"} and set(cfg.users) == {"alice"}


def test_names_from_kafkas_admin_api_are_kept_as_kafka_has_them() -> None:
    """Only a config file is held to the rule: a quota set through the Admin API (or proposed
    from a capture) on a user whose name starts with User: is Kafka's to allow."""
    assert set(QuotaConfig.model_validate({"users": {"User:x": {"producer_byte_rate": 5}}}).users) == {
        "User:x"
    }
