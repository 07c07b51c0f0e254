"""The pieces of volume quotas around the policy: the paused produce answer, usage by statvfs,
the exchange client's settings, and the config section in the proxy's config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from proxy.config import ConfigError, parse_config
from proxy.shared.exchange import ExchangeSettings
from proxy.shared.volume_usage import statvfs_usage


@pytest.mark.parametrize("version", [3, 8, 9, 12])
def test_paused_produce_answer_names_every_partition_with_a_retriable_error(version: int) -> None:
    request = {
        "acks": -1,
        "timeout_ms": 30000,
        "topic_data": [
            {"name": "a", "partition_data": [{"index": 0, "records": b""}, {"index": 3, "records": b""}]},
            {"name": "b", "partition_data": [{"index": 1, "records": b""}]},
        ],
    }
    body = messages.produce_error_response(request, ErrorCode.NOT_ENOUGH_REPLICAS, "paused", 1500)
    encoded = messages.encode_response(ApiKey.PRODUCE, version, body)
    decoded = messages.decode_response(ApiKey.PRODUCE, version, encoded)
    assert decoded["throttle_time_ms"] == 1500
    seen = [
        (t["name"], p["index"], p["error_code"], p["base_offset"])
        for t in decoded["responses"]
        for p in t["partition_responses"]
    ]
    assert seen == [("a", 0, 19, -1), ("a", 3, 19, -1), ("b", 1, 19, -1)]


def test_statvfs_usage_counts_a_file_system_once(tmp_path: Path) -> None:
    one, two = tmp_path / "d1", tmp_path / "d2"
    one.mkdir()
    two.mkdir()
    ((name, capacity, consumed),) = statvfs_usage([str(one), str(two)])
    st = os.statvfs(one)
    assert name == str(one)
    assert capacity == st.f_blocks * st.f_frsize
    assert 0 <= consumed <= capacity
    with pytest.raises(OSError):
        statvfs_usage([str(tmp_path / "missing")])


GATEWAY = """
mode: gateway
gateway: {upstream_bootstrap: ["10.0.0.1:9092"]}
"""


def test_exchange_defaults_to_the_upstream_and_its_sasl_login() -> None:
    cfg = parse_config(GATEWAY + "upstream_sasl: {username: kt, password: pw}\n")
    s = ExchangeSettings.of(cfg)
    assert s.bootstrap_servers == ["10.0.0.1:9092"]
    assert s.client_kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert s.client_kwargs["sasl_plain_username"] == "kt"
    plain = ExchangeSettings.of(parse_config(GATEWAY + "exchange: {bootstrap_servers: ['k:9094']}\n"))
    assert plain.bootstrap_servers == ["k:9094"] and plain.client_kwargs == {"security_protocol": "PLAINTEXT"}


def test_volume_section_errors_name_the_line() -> None:
    text = GATEWAY + "volume:\n  enabled: true\n  source: {type: statvfs, log_dirs: [/data]}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "kthrottle.yaml")
    assert "kthrottle.yaml:6" in str(info.value) and "broker_id" in str(info.value)
    with pytest.raises(ConfigError, match="ssl_certfile and ssl_keyfile together"):
        parse_config(GATEWAY + "exchange: {ssl_certfile: /c.pem}\n")
