"""The Kafka capture sink end to end: a real client (librdkafka) through the proxy, the proxy's
records on a topic of the real broker, `kthrottle capture-export` back into Parquet capture files,
and those files saying what the client did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import REPO, ProxyProcess, gateway_config
from protocol.api_keys import ApiKey
from quota.capture_schema import CAPTURE_SCHEMA_VERSION, CAPTURE_VERSION_KEY, FIELD_NAMES

pytestmark = pytest.mark.integration

COUNTS = {0: 120, 1: 80}  # messages the client produces, per partition


def _roundtrip(bootstrap: str, topic: str) -> int:
    """Create the topic, produce COUNTS, consume them all back; returns the messages consumed."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    # confluent-kafka's typing: admin imports NewTopic from cimpl without re-exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "sink-admin"})
    admin.create_topics([NewTopic(topic, len(COUNTS), 1)])[topic].result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "sink-producer",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    for partition, n in COUNTS.items():
        for i in range(n):
            producer.produce(
                topic, value=f"value-{partition}-{i}-{uuid.uuid4().hex}".encode(), partition=partition
            )
            producer.poll(0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "sink-consumer",
            "group.id": f"g-{topic}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in COUNTS])
    got = 0
    deadline = time.monotonic() + 30
    while got < sum(COUNTS.values()) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got += 1
    consumer.close()
    return got


def _first_message(bootstrap: str, topic: str) -> Any:
    """One message of the capture topic, read straight from the broker."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"peek-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"no message on {topic}")
    finally:
        consumer.close()


@pytest.mark.timeout(240)
def test_kafka_sink_then_capture_export_match_what_the_client_did(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"sink-{uuid.uuid4().hex[:6]}"
    capture_topic = f"kthrottle-capture-{uuid.uuid4().hex[:6]}"
    cfg = gateway_config(
        kafka_broker,
        capture={
            "enabled": True,
            "sink": "kafka",
            "instance": "proxy-k",
            "flush_seconds": 0.2,
            "kafka": {"topic": capture_topic, "partitions": 2, "replication_factor": 1},
        },
    )
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        assert _roundtrip(proxy.bootstrap, topic) == sum(COUNTS.values())
        assert proxy.metric("kthrottle_capture_dropped_total") == 0
        assert proxy.metric("kthrottle_capture_write_errors_total") == 0
        assert proxy.stop() == 0  # flushes the capture producer on the way out
    log = proxy.log_text()
    assert "capture: producing to topic" in log and "records unacknowledged" not in log

    msg = _first_message(kafka_broker.bootstrap_servers, capture_topic)
    assert msg.key() == b"proxy-k"
    assert dict(msg.headers())[CAPTURE_VERSION_KEY] == str(CAPTURE_SCHEMA_VERSION).encode()
    assert list(json.loads(msg.value())) == list(FIELD_NAMES)

    out = tmp_path / "export"
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "capture-export",
            "--bootstrap-servers",
            kafka_broker.bootstrap_servers,
            "--topic",
            capture_topic,
            "--output",
            str(out),
            "--from-beginning",
            "--idle-timeout-s",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(out.glob("capture-*.parquet"))
    assert files and not list(out.glob("*.inprogress"))
    rows: list[dict[str, Any]] = []
    for f in files:
        table = pq.read_table(f)
        assert table.schema.metadata[CAPTURE_VERSION_KEY.encode()] == str(CAPTURE_SCHEMA_VERSION).encode()
        rows += table.to_pylist()
    assert f"capture-export: {len(rows)} records (0 skipped)" in done.stdout
    # What `kthrottle tune --input` checks before starting Spark: version, schema, rows.
    from analytics.session import check_local

    assert check_local(str(out)).rows == len(rows)

    assert {r["proxy"] for r in rows} == {"proxy-k"}
    assert not [r for r in rows if r["client_id"].startswith("kthrottle")]  # its own producer went direct
    assert {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.CREATE_TOPICS, ApiKey.PRODUCE, ApiKey.FETCH} <= {
        r["api_key"] for r in rows
    }
    create = [r for r in rows if r["api_key"] == ApiKey.CREATE_TOPICS]
    assert [(r["client_id"], r["mutations"]) for r in create] == [("sink-admin", len(COUNTS))]

    produce = [r for r in rows if r["api_key"] == ApiKey.PRODUCE]
    assert {r["client_id"] for r in produce} == {"sink-producer"}
    produced_records: Counter[int] = Counter()
    produced_bytes: Counter[int] = Counter()
    for r in produce:
        for p in r["partitions"]:
            assert p["topic"] == topic
            produced_records[p["partition"]] += p["records"]
            produced_bytes[p["partition"]] += p["bytes"]
    assert dict(produced_records) == COUNTS

    fetch = [r for r in rows if r["api_key"] == ApiKey.FETCH]
    assert {r["client_id"] for r in fetch} == {"sink-consumer"}
    fetched_bytes: Counter[int] = Counter()
    for r in fetch:
        for p in r["partitions"]:
            fetched_bytes[p["partition"]] += p["bytes"]
    # Every batch produced once and fetched once: the same bytes per partition both ways, and what
    # the broker holds in its log.
    assert dict(fetched_bytes) == dict(produced_bytes)
    assert _log_sizes(kafka_broker, topic) == dict(produced_bytes)


def _log_sizes(cluster: KafkaCluster, topic: str) -> dict[int, int]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        result = admin.describe_log_dirs(topic_partitions=[topic])
    finally:
        admin.close()
    sizes: dict[int, int] = {}
    for broker in result:
        for log_dir in broker.get("results", broker.get("log_dirs", [])):
            for t in log_dir["topics"]:
                if t["name"] == topic:
                    for p in t["partitions"]:
                        sizes[p["partition_index"]] = sizes.get(p["partition_index"], 0) + p["partition_size"]
    return sizes
