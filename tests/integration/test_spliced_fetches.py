"""Large Fetch responses spliced from the broker's socket to the client's arrive intact: every
record's value, in order, for each client library (the Fetch versions they speak run the
NodeEndpoints walk or not), against the real broker. The proxy's counter says the records did
not pass through user space; with ``splice_responses: false`` they all do, with the same result."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
from kafka import KafkaProducer

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
PARTITIONS = 3
RECORDS = 3000  # 4 to 12 KiB each: about 24 MiB
FETCH = {"partition": 8 * MiB, "total": 50 * MiB}

Consumed = dict[int, list[bytes]]  # partition -> values, in offset order


def _value(i: int) -> bytes:
    seed = hashlib.sha256(str(i).encode()).digest()
    return seed * ((4096 + (i * 977) % 8192) // len(seed))


def _produce_direct(bootstrap: str, topic: str) -> Consumed:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", batch_size=MiB, linger_ms=20)
    sent: Consumed = {p: [] for p in range(PARTITIONS)}
    try:
        for i in range(RECORDS):
            producer.send(topic, value=_value(i), key=str(i).encode(), partition=i % PARTITIONS)
            sent[i % PARTITIONS].append(_value(i))
        producer.flush(60)
    finally:
        producer.close()
    return sent


def _confluent(bootstrap: str, topic: str) -> Consumed:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.bytes": FETCH["total"],
            "max.partition.fetch.bytes": FETCH["partition"],
            "check.crcs": True,
        }
    )
    consumer.subscribe([topic])
    got: Consumed = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
            for record in consumer.consume(num_messages=1000, timeout=1.0):
                assert record.error() is None, record.error()
                got[cast(int, record.partition())].append(cast(bytes, record.value()))
    finally:
        consumer.close()
    return got


def _python_consumer() -> dict[str, Any]:
    """kafka-python's and aiokafka's settings (they share the names): large fetches, a new group."""
    return {
        "group_id": f"g-{uuid.uuid4().hex[:8]}",
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "fetch_max_bytes": FETCH["total"],
        "max_partition_fetch_bytes": FETCH["partition"],
        "check_crcs": True,
    }


def _kafka_python(bootstrap: str, topic: str) -> Consumed:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, **_python_consumer())
    got: Consumed = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    try:
        while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                got[tp.partition].extend(r.value for r in records)
    finally:
        consumer.close()
    return got


def _aiokafka(bootstrap: str, topic: str) -> Consumed:
    from aiokafka import AIOKafkaConsumer

    async def run() -> Consumed:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **_python_consumer())
        await consumer.start()
        got: Consumed = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 60
        try:
            while sum(map(len, got.values())) < RECORDS and time.monotonic() < deadline:
                for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                    got[tp.partition].extend(r.value for r in records)
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


CLIENTS: dict[str, Callable[[str, str], Consumed]] = {
    "confluent-kafka": _confluent,
    "kafka-python": _kafka_python,
    "aiokafka": _aiokafka,
}


@pytest.fixture(scope="module")
def stored(kafka_broker: KafkaCluster) -> tuple[str, Consumed]:
    topic = f"spliced-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, PARTITIONS)
    return topic, _produce_direct(kafka_broker.bootstrap_servers, topic)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("splice", [True, False], ids=["spliced", "copied"])
def test_every_record_arrives_intact(
    kafka_broker: KafkaCluster, stored: tuple[str, Consumed], client: str, splice: bool
) -> None:
    topic, sent = stored
    config = gateway_config(kafka_broker, log_level="WARNING", splice_responses=splice)
    with ProxyProcess(config) as proxy:
        got = CLIENTS[client](proxy.bootstrap, topic)
        spliced = proxy.metric("kthrottle_spliced_response_bytes_total")
        fetched = proxy.metric("kthrottle_response_bytes_total", {"api": "Fetch"})
        errors = proxy.metric("kthrottle_upstream_errors_total")
    for partition in range(PARTITIONS):
        assert len(got[partition]) == len(sent[partition]), f"partition {partition}"
        assert got[partition] == sent[partition], f"partition {partition}: values differ"
    assert fetched > RECORDS * 4096
    assert errors == 0
    if splice:  # the records went socket to socket; partition headers and heads through the proxy
        assert spliced > 0.8 * fetched, (spliced, fetched)
    else:
        assert spliced == 0


@pytest.mark.timeout(240)
def test_every_record_arrives_intact_from_three_brokers(kafka_cluster3: KafkaCluster) -> None:
    """Partition leaders on three brokers: one spliced connection to each, side by side."""
    topic = f"spliced3-{uuid.uuid4().hex[:8]}"
    kafka_cluster3.create_topic(topic, PARTITIONS, replication=3)
    sent = _produce_direct(kafka_cluster3.bootstrap_servers, topic)
    with ProxyProcess(gateway_config(kafka_cluster3, log_level="WARNING")) as proxy:
        got = _confluent(proxy.bootstrap, topic)
        spliced = proxy.metric("kthrottle_spliced_response_bytes_total")
        fetched = proxy.metric("kthrottle_response_bytes_total", {"api": "Fetch"})
        errors = proxy.metric("kthrottle_upstream_errors_total")
    assert got == sent
    assert errors == 0
    assert spliced > 0.8 * fetched, (spliced, fetched)
