"""Traffic capture through the proxy with real clients: what each record holds, and what it never holds."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from protocol.api_keys import ApiKey

pytestmark = pytest.mark.integration

SECRET = "SECRET-PAYLOAD-7f3a"


def captured(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(directory.glob("*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


@pytest.mark.timeout(180)
def test_capture_records_what_quotas_need_and_no_payload(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"cap-{uuid.uuid4().hex[:6]}"
    capture_dir = tmp_path / "capture"
    cfg = gateway_config(
        kafka_broker,
        capture={"enabled": True, "directory": str(capture_dir), "instance": "proxy-a", "flush_seconds": 0.2},
    )
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="cap-admin")
        admin.create_topics([NewTopic(topic, 3, 1)])
        admin.close()
        producer = KafkaProducer(
            bootstrap_servers=proxy.bootstrap, client_id="cap-producer", enable_idempotence=True, acks="all"
        )
        for i in range(200):
            producer.send(
                topic, key=f"key-{SECRET}".encode(), value=f"{SECRET}-{i}".encode(), partition=i % 3
            )
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(
            topic, bootstrap_servers=proxy.bootstrap, client_id="cap-consumer", auto_offset_reset="earliest"
        )
        values: list[bytes] = []
        deadline = time.monotonic() + 30  # until all 200 are in, not 8 s of silence after them
        while len(values) < 200 and time.monotonic() < deadline:
            values += [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
        consumer.close()
        assert sorted(values) == sorted(f"{SECRET}-{i}".encode() for i in range(200))
    rows = captured(capture_dir)  # the proxy closed its last file on shutdown
    assert rows, "no capture files"
    assert SECRET not in repr(rows)  # sizes and ids, never payloads, keys or headers

    produce = [r for r in rows if r["api_key"] == ApiKey.PRODUCE]
    assert {r["client_id"] for r in produce} == {"cap-producer"}
    assert sum(p["records"] for r in produce for p in r["partitions"]) == 200
    assert {p["partition"] for r in produce for p in r["partitions"]} == {0, 1, 2}
    assert all(len(r["producer_ids"]) == 1 for r in produce)  # one idempotent producer id
    assert all(r["request_bytes"] > sum(p["bytes"] for p in r["partitions"]) for r in produce)
    assert all(r["upstream_ms"] >= 0 for r in produce)

    fetched = [p for r in rows if r["api_key"] == ApiKey.FETCH for p in r["partitions"] if p["bytes"]]
    assert sum(p["bytes"] for p in fetched) > 200 * len(SECRET)
    create = [r for r in rows if r["api_key"] == ApiKey.CREATE_TOPICS]
    assert len(create) == 1 and create[0]["mutations"] == 3 and create[0]["client_id"] == "cap-admin"
    assert all(r["proxy"] == "proxy-a" and r["principal"] == "ANONYMOUS" for r in rows)
    assert {ApiKey.API_VERSIONS, ApiKey.METADATA} <= {r["api_key"] for r in rows}
