"""The pieces of volume quotas around the policy: the paused produce answer, usage by statvfs,
the exchange client's settings and how it hands records over, the records of the volume topic as
the service takes them, and the config section in the proxy's config."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from proxy.config import ConfigError, parse_config
from proxy.net.upstream_client import UpstreamLogin
from proxy.ratelog import RateLimitedLog
from proxy.shared import exchange, volume_service
from proxy.shared.exchange import RECORD_OUTCOMES as EXCHANGE_OUTCOMES
from proxy.shared.exchange import CompactedTopic, ExchangeSettings, exchange_metrics
from proxy.shared.volume_service import RECORD_OUTCOMES, VolumeService
from proxy.shared.volume_usage import statvfs_usage
from quota.volume import BrokerStatus
from quota.volume_message import LimitDefinition, LimitType, VolumeDetails, VolumeSnapshot


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


# --- the exchange hands every record over, and counts what became of it ------------------------


class FollowedConsumer:
    """Stands in for aiokafka's consumer in ``CompactedTopic._follow``: hands out ``batches``,
    then stops the topic."""

    def __init__(self, topic: CompactedTopic, batches: list[list[SimpleNamespace]]) -> None:
        self.topic = topic
        self.batches = batches

    async def position(self, _tp: object) -> int:
        return 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[str, list[SimpleNamespace]]:
        if not self.batches:
            self.topic._stopping = True
            return {}
        return {"tp": self.batches.pop(0)}


def _exchange_records(registry: CollectorRegistry, topic: str) -> dict[str, float | None]:
    return {
        outcome: registry.get_sample_value(
            "kthrottle_exchange_records_total", {"topic": topic, "outcome": outcome}
        )
        for outcome in EXCHANGE_OUTCOMES
    }


async def test_a_record_its_reader_fails_on_is_counted_logged_and_the_next_one_read(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(exchange, "record_log", RateLimitedLog(exchange.log, clock=lambda: now[0]))
    registry = CollectorRegistry()
    read: list[bytes | None] = []

    def reader(key: bytes | None, value: bytes | None) -> None:
        if key == b"bad":
            raise ValueError("a reader's bug")
        read.append(key)

    topic = CompactedTopic(ExchangeSettings(["k:9092"], {}, 1000), "t", reader, exchange_metrics(registry))
    assert _exchange_records(registry, "t") == {"handled": 0.0, "failed": 0.0}  # each series from the start
    records = [
        SimpleNamespace(key=key, value=b"v", timestamp=0, partition=0, offset=offset)
        for offset, key in enumerate([b"a", b"bad", b"b"])
    ]
    with caplog.at_level(logging.ERROR, logger="proxy.shared.exchange"):
        await topic._follow(FollowedConsumer(topic, [records]), {})
    assert read == [b"a", b"b"]  # the one after the failure too
    assert _exchange_records(registry, "t") == {"handled": 2.0, "failed": 1.0}
    (line,) = [r for r in caplog.records if r.name == "proxy.shared.exchange"]
    assert line.getMessage() == "exchange t: record at partition 0 offset 1 skipped: its reader failed"
    assert line.exc_info is not None and "a reader's bug" in str(line.exc_info[1])

    caplog.clear()
    flood = [SimpleNamespace(key=b"bad", value=b"v", timestamp=0, partition=0, offset=i) for i in range(100)]
    with caplog.at_level(logging.ERROR, logger="proxy.shared.exchange"):
        topic._stopping = False
        await topic._follow(FollowedConsumer(topic, [flood]), {})
    assert _exchange_records(registry, "t") == {"handled": 2.0, "failed": 101.0}  # every one counted
    assert len([r for r in caplog.records if r.name == "proxy.shared.exchange"]) == 4  # 5 per 10 s


# --- the volume topic's records as the service takes them ----------------------------------------

NOW_S = 1_714_564_800.0


def _volume_service() -> tuple[VolumeService, CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = parse_config(GATEWAY + "volume: {enabled: true}\n")
    return VolumeService(cfg, registry, UpstreamLogin, wall_clock=lambda: NOW_S), registry


def _usage(consumed: int = 100, age_s: float = 0.0) -> bytes:
    return VolumeSnapshot(
        int((NOW_S - age_s) * 1000),
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 20),
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10),
        (VolumeDetails("/data", 1000, consumed),),
    ).encode()


def _volume_records(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        outcome: registry.get_sample_value("kthrottle_volume_records_total", {"outcome": outcome})
        for outcome in RECORD_OUTCOMES
    }


def _held(service: VolumeService) -> list[tuple[int, BrokerStatus, int | None, str | None]]:
    return [(b.broker_id, b.status, b.snapshot_at_ms, b.error) for b in service.quotas.brokers(NOW_S * 1000)]


def test_volume_records_are_counted_and_bad_ones_change_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record read from the volume topic is counted by its outcome; one skipped (a key
    that is not a broker id, or none) changes nothing and is logged."""
    monkeypatch.setattr(volume_service, "skip_log", RateLimitedLog(volume_service.log))
    service, registry = _volume_service()
    assert _volume_records(registry) == dict.fromkeys(RECORD_OUTCOMES, 0.0)  # each series from the start
    service._on_record(b"1", _usage())
    held = _held(service)
    assert held == [(1, BrokerStatus.FRESH, int(NOW_S * 1000), None)]
    with caplog.at_level(logging.WARNING, logger="proxy.shared.volume_service"):
        service._on_record(b"broker-1", _usage(900))  # not a broker id
        service._on_record(b"99999999999", _usage(900))  # past int32
        service._on_record(b"", None)  # an empty key, and a tombstone: nothing to forget
        service._on_record(None, _usage(900))
    assert _held(service) == held
    assert _volume_records(registry) == {
        "applied": 1.0,
        "cleared": 0.0,
        "invalid": 0.0,
        "unreadable": 3.0,
        "no_key": 1.0,
    }
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(skipped) == 4 and all(" skipped" in line for line in skipped)
    assert skipped[0] == (
        "volume topic __kthrottle_volume_usage: record with a bad key skipped: "
        "(key): must be a broker id in decimal ASCII, got b'broker-1'"
    )
    assert skipped[-1].startswith(
        'volume topic __kthrottle_volume_usage: a record without a key skipped (value b\'{"SnapshotAt"'
    )

    # A value that is no usage message is not skipped: it superseded the broker's last snapshot,
    # whose state is unknown until a good one (the fail-safe applies meanwhile).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="proxy.shared.volume_service"):
        service._on_record(b"1", b"not json")
    (b1,) = _held(service)
    assert (b1[1], b1[2]) == (BrokerStatus.INVALID, int(NOW_S * 1000))
    (invalid,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert invalid.startswith(
        "volume topic: broker 1's record is not a usage message: (message): is not JSON"
    )
    assert invalid.endswith("; its state is unknown until a good one")
    service._on_record(b"1", _usage())
    assert _held(service) == held
    service._on_record(b"1", None)  # a tombstone: forgotten
    assert _held(service) == []
    assert _volume_records(registry) == {
        "applied": 2.0,
        "cleared": 1.0,
        "invalid": 1.0,
        "unreadable": 3.0,
        "no_key": 1.0,
    }


def test_a_snapshot_stale_or_ahead_on_arrival_is_held_yet_not_counted_and_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker's reporter that fell behind (or a clock ahead) is an operator's problem to see:
    its snapshot is held for display, judged STALE or FUTURE, and logged as it arrives once the
    topic's history at start was read."""
    monkeypatch.setattr(volume_service, "skip_log", RateLimitedLog(volume_service.log))
    service, registry = _volume_service()
    with caplog.at_level(logging.WARNING, logger="proxy.shared.volume_service"):
        service._on_record(b"1", _usage(age_s=3600))  # the history read at start: old by nature
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    service.exchange.caught_up.set()
    with caplog.at_level(logging.WARNING, logger="proxy.shared.volume_service"):
        service._on_record(b"1", _usage(age_s=3600))
        service._on_record(b"2", _usage(age_s=-3600))
        service._on_record(b"3", _usage())
    assert [(b, status) for b, status, _at, _err in _held(service)] == [
        (1, BrokerStatus.STALE),
        (2, BrokerStatus.FUTURE),
        (3, BrokerStatus.FRESH),
    ]
    assert _volume_records(registry)["applied"] == 4.0
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2, lines
    assert lines[0].startswith("volume topic: broker 1's snapshot is stale on arrival (age 3600.0 s, ")
    assert lines[1].startswith("volume topic: broker 2's snapshot is future on arrival (age -3600.0 s, ")


def test_a_flood_of_bad_volume_records_is_counted_in_full_and_logged_in_part(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(volume_service, "skip_log", RateLimitedLog(volume_service.log, clock=lambda: now[0]))
    service, registry = _volume_service()
    with caplog.at_level(logging.WARNING, logger="proxy.shared.volume_service"):
        for i in range(1000):
            service._on_record(f"x{i}".encode(), _usage())
        now[0] = 10.0
        service._on_record(b"x", _usage())
    assert _volume_records(registry)["unreadable"] == 1001.0
    assert _held(service) == []
    lines = [r.getMessage() for r in caplog.records if "bad key" in r.getMessage()]
    assert len(lines) == 6  # five per 10 s, then one saying how many were not written
    assert lines[-1].endswith("(995 similar lines suppressed)")
