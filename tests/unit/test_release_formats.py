"""This release reads what earlier releases wrote, and says by name what it cannot read.

The fixtures under tests/fixtures/releases/<commit>/ were written by that release's own code
(``dev/release_fixtures.py``): its chart's config files and its config reference's examples, a
capture file and Kafka capture messages, the exchange topic's records, the client-quota store's
records. Each is read here with the current code, and what it says is checked, not only that it
parses.
"""

from __future__ import annotations

import base64
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from dev.release_fixtures import _ROWS
from proxy.capture.export import _problem
from proxy.config import ConfigError, load_config, parse_config
from quota import client_quota_ops, cluster_report, volume_message
from quota.capture_schema import CAPTURE_SCHEMA_VERSION, CAPTURE_VERSION_KEY, FIELDS
from quota.config import CONFIG_VERSION

RELEASES = sorted((Path(__file__).parent.parent / "fixtures" / "releases").iterdir())
NAMES = [f.name for f in FIELDS]


def _release_ids() -> list[str]:
    return [r.name for r in RELEASES]


@pytest.fixture(params=RELEASES, ids=_release_ids())
def release(request: pytest.FixtureRequest) -> Path:
    return Path(request.param)


def test_there_is_a_previous_release_and_its_manifest_names_every_file(release: Path) -> None:
    manifest = json.loads((release / "MANIFEST.json").read_text())
    assert manifest["commit"].startswith(release.name)
    for name in manifest["files"]:
        assert (release / name).is_file(), name


def _expected(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in NAMES)


# --- config files --------------------------------------------------------------------------------


def test_every_config_file_of_the_release_loads(release: Path) -> None:
    mains = sorted(p for p in (release / "config").rglob("*.yaml") if p.name != "quotas.yaml")
    assert len(mains) >= 10
    for path in mains:
        cfg = load_config(path)
        assert cfg.config_version == 1, path  # files before the key are version 1


def test_the_charts_quotas_come_through(release: Path) -> None:
    gateway = load_config(release / "config" / "chart-gateway" / "kthrottle.yaml")
    assert gateway.mode == "gateway" and gateway.cluster_quotas.enabled
    assert gateway.quotas.clients, "the gateway values' quotas were not read from quotas.yaml"
    sidecar = load_config(release / "config" / "chart-sidecar" / "kthrottle.yaml")
    assert sidecar.mode == "sidecar" and sidecar.sidecar is not None


def test_a_config_of_a_newer_format_is_refused_by_name(tmp_path: Path) -> None:
    text = f"config_version: {CONFIG_VERSION + 1}\nmode: gateway\nsomething_new: {{a: 1}}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "kthrottle.yaml")
    message = str(err.value)
    assert f"kthrottle.yaml:1: config_version: {CONFIG_VERSION + 1} is a newer format" in message
    assert "something_new" not in message  # the version says it all
    (tmp_path / "quotas.yaml").write_text(f"config_version: {CONFIG_VERSION + 1}\nquotas: {{}}\n")
    (tmp_path / "kthrottle.yaml").write_text(
        "gateway: {upstream_bootstrap: [b:9092]}\nquotas_file: quotas.yaml\n"
    )
    with pytest.raises(ConfigError, match=r"quotas.yaml:1: config_version: \d+ is a newer format"):
        load_config(tmp_path / "kthrottle.yaml")


def test_a_config_version_below_one_is_refused_with_its_line() -> None:
    with pytest.raises(ConfigError, match=r"kthrottle.yaml:2: config_version: Input should be greater"):
        parse_config("mode: gateway\nconfig_version: 0\n", "kthrottle.yaml")


# --- capture -------------------------------------------------------------------------------------


def test_the_capture_file_reads_as_the_records_written(release: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from analytics.session import check_local

    shutil.copy(release / "capture" / "capture.parquet", tmp_path / "part-0.parquet")
    found = check_local(str(tmp_path))  # the tuning job's own check of its input
    assert (found.files, found.rows) == (1, 3)
    table = pq.read_table(tmp_path / "part-0.parquet").to_pylist()
    for got, want in zip(table, _ROWS, strict=True):
        got["partitions"] = [tuple(p.values()) for p in got["partitions"]]
        assert tuple(got[name] for name in NAMES) == _expected(want)


def test_the_kafka_capture_messages_read_as_the_records_written(release: Path) -> None:
    lines = (release / "capture" / "kafka-records.jsonl").read_text().splitlines()
    for line, want in zip(lines, _ROWS, strict=True):
        message = json.loads(line)
        headers = [(k, v.encode()) for k, v in message["headers"]]
        row, why = _problem(headers, message["value"].encode())
        assert why == ""
        assert row is not None
        read = dict(zip(NAMES, row, strict=True))
        read["partitions"] = [tuple(p) for p in read["partitions"]]
        assert _expected(read) == _expected(want)


def test_a_capture_of_a_newer_schema_is_refused_by_name(release: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from analytics.session import InputError, check_local

    table = pq.read_table(release / "capture" / "capture.parquet")
    newer = table.replace_schema_metadata({CAPTURE_VERSION_KEY: str(CAPTURE_SCHEMA_VERSION + 1)})
    pq.write_table(newer, tmp_path / "part-0.parquet")
    newer_version = f"capture schema version {CAPTURE_SCHEMA_VERSION + 1}; this job reads"
    with pytest.raises(InputError, match=newer_version):
        check_local(str(tmp_path))
    line = (release / "capture" / "kafka-records.jsonl").read_text().splitlines()[0]
    row, why = _problem([(CAPTURE_VERSION_KEY, b"2")], json.loads(line)["value"].encode())
    assert row is None and "capture schema version '2'; this kthrottle reads version 1" in why


# --- the exchange topic --------------------------------------------------------------------------


def test_the_exchange_usage_report_reads_as_written(release: Path) -> None:
    report = cluster_report.decode_record((release / "exchange" / "usage-report.bin").read_bytes())
    assert isinstance(report, cluster_report.UsageReport)
    assert (report.instance, report.seq, report.address) == ("replica-0", 42, "10.0.0.9:9644")
    assert sorted(report.entries()) == sorted(
        [
            (cluster_report.PRODUCE, "User:alice", "orders-app", 65_536.0),
            (cluster_report.FETCH, "<default>", "reporting", 1_048_576.0),
            (cluster_report.PRODUCE_PARTITION, "orders", "3", 16_384.0),
            (cluster_report.PRODUCER_ID, "User:alice", "4001", 1.0),
        ]
    )


def test_the_exchange_mutation_record_reads_as_written(release: Path) -> None:
    record = cluster_report.decode_record((release / "exchange" / "mutation-record.bin").read_bytes())
    assert record == cluster_report.MutationRecord(
        "replica-1", 5, "User:ops", "admin-1", ("User:ops", "admin-1"), (3, 6), True, 5.0, 11.0
    )


def test_an_exchange_record_of_a_newer_version_is_refused_by_name(release: Path) -> None:
    data = bytearray((release / "exchange" / "usage-report.bin").read_bytes())
    struct.pack_into(">B", data, 3, 9)
    with pytest.raises(cluster_report.ReportError, match="version 9 is newer than this release reads"):
        cluster_report.decode_record(bytes(data))


def test_the_volume_record_reads_as_written(release: Path) -> None:
    record = json.loads((release / "exchange" / "volume-record.json").read_text())
    assert volume_message.decode_key(base64.b64decode(record["key"])) == 2
    snapshot = volume_message.decode(record["value"].encode())
    volume = snapshot.volume("/var/lib/kafka")
    assert volume is not None and (volume.capacity, volume.consumed) == (1000, 800)
    assert (snapshot.soft_limit.level, snapshot.hard_limit.level) == (900, 950)


# --- the client-quota store ----------------------------------------------------------------------


def test_the_quota_store_records_read_as_written(release: Path) -> None:
    read = []
    for line in (release / "quota_api" / "store-records.jsonl").read_text().splitlines():
        record = json.loads(line)
        entity, key = client_quota_ops.decode_key(record["key"].encode())
        value = None if record["value"] is None else record["value"].encode()
        read.append((dict(entity), key, client_quota_ops.decode_value(entity, key, value)))
    assert read == [
        ({"client-id": "orders-app", "user": "alice"}, "producer_byte_rate", (True, 1_048_576.0)),
        ({"user": None}, "consumer_byte_rate", (True, 2_097_152.0)),
        ({"client-id": "reporting"}, "request_percentage", (False, None)),
        ({"ip": "10.0.0.5"}, "connection_creation_rate", (True, 10.0)),
    ]
