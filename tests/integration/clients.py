"""Real Kafka clients driven through the proxy: create a topic, produce keyed messages with acks=all
and idempotence, consume them back in a group. Each returns what the consumer received."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from dev.kafka_python_group import group_consumer

Message = tuple[bytes, bytes]
RATE_CONSUMER = str(Path(__file__).parent / "java" / "RateConsumer.java")


def java_rate_consumer(
    bootstrap: str, topic: str, client_id: str, seconds: int, *settings: str
) -> tuple[list[tuple[float, float]], str]:
    """Kafka's Java consumer (Fetch by topic id) reading ``topic`` for ``seconds``: the value bytes
    it had received after each poll as (seconds, bytes), and its whole output."""
    from dev.harness import java_command

    cmd = java_command(RATE_CONSUMER, bootstrap, topic, client_id, str(seconds), *settings)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 100, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    polls = re.finditer(r"^AT (\d+) (\d+)$", done.stdout, re.M)
    return [(int(m[1]) / 1000.0, float(m[2])) for m in polls], done.stdout


def messages(n: int, tag: str) -> list[Message]:
    return [
        (f"{tag}-key-{i % 17}".encode(), f"{tag}-value-{i}-{uuid.uuid4().hex}".encode()) for i in range(n)
    ]


# --- kafka-python -----------------------------------------------------------------------------


def kafka_python_roundtrip(
    bootstrap: str,
    topic: str,
    msgs: list[Message],
    partitions: int = 3,
    replication: int = 1,
    timeout: float = 60,
) -> list[Message]:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="it-kafka-python-admin")
    try:
        admin.create_topics([NewTopic(topic, partitions, replication)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    for key, value in msgs:
        producer.send(topic, key=key, value=value)
    producer.flush(timeout)
    producer.close()
    consumer = group_consumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < len(msgs) and time.monotonic() < deadline:
        for record in consumer:
            got.append((record.key, record.value))
            if len(got) >= len(msgs):
                break
    consumer.commit()
    consumer.close()
    return got


# --- aiokafka -----------------------------------------------------------------------------------


async def _aiokafka(
    bootstrap: str, topic: str, msgs: list[Message], partitions: int, replication: int, timeout: float
) -> list[Message]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, replication)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in msgs]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest"
    )
    await consumer.start()
    got: list[Message] = []
    try:
        deadline = time.monotonic() + timeout
        while len(got) < len(msgs) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                got.extend((r.key, r.value) for r in records)
        await consumer.commit()
    finally:
        await consumer.stop()
    return got


def aiokafka_roundtrip(
    bootstrap: str,
    topic: str,
    msgs: list[Message],
    partitions: int = 3,
    replication: int = 1,
    timeout: float = 60,
) -> list[Message]:
    return asyncio.run(_aiokafka(bootstrap, topic, msgs, partitions, replication, timeout))


# --- confluent-kafka (librdkafka) ----------------------------------------------------------------


def confluent_roundtrip(
    bootstrap: str,
    topic: str,
    msgs: list[Message],
    partitions: int = 3,
    replication: int = 1,
    timeout: float = 60,
) -> list[Message]:
    from confluent_kafka import Consumer, Producer

    # confluent-kafka's typing: admin imports NewTopic from cimpl without re-exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(topic, partitions, replication)]).values():
        fut.result(timeout)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value in msgs:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    remaining = producer.flush(timeout)
    assert remaining == 0 and not errors, f"undelivered={remaining} errors={errors[:3]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(msgs) and time.monotonic() < deadline:
            for record in consumer.consume(num_messages=500, timeout=1.0):
                if record.error() is None:
                    got.append((cast(bytes, record.key()), cast(bytes, record.value())))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def confluent_brokers_seen(bootstrap: str) -> set[tuple[str, int]]:
    """The broker addresses librdkafka learned from the metadata it received."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    # confluent-kafka's BrokerMetadata sets host = None in __init__, so its host is typed None
    return {(cast(str, b.host), b.port) for b in md.brokers.values()}


def kafka_python_brokers_seen(bootstrap: str) -> set[tuple[str, int]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        consumer.topics()
        return {(b.host, b.port) for b in consumer._client.cluster.brokers()}
    finally:
        consumer.close()


def assert_same_messages(sent: Iterable[Message], got: Iterable[Message]) -> None:
    sent_list, got_list = sorted(sent), sorted(got)
    assert len(got_list) == len(sent_list), f"sent {len(sent_list)}, consumed {len(got_list)}"
    assert got_list == sent_list


# --- greedy librdkafka producers ------------------------------------------------------------------


def delivery_errors_into(errors: list[str]) -> Callable[[Any, Any], None]:
    """A librdkafka delivery callback that keeps every error except the purges of
    ``stop_greedy_producer``: what a quota test must see is that nothing failed while it measured."""
    from confluent_kafka import KafkaError

    purged = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None and err.code() not in purged:
            errors.append(str(err))

    return on_delivery


def stop_greedy_producer(producer: Any, timeout: float = 30) -> None:
    """End a producer that offered more than its quota, once the measurement is over: drop its
    backlog and its requests in flight. Flushing them would take as long as the quota makes the
    backlog last, and a request in flight waits behind every throttle of the requests before it
    on its connection (tens of seconds with librdkafka's default pipelining), measuring nothing."""
    producer.purge(in_queue=True, in_flight=True)
    left = producer.flush(timeout)
    assert left == 0, f"{left} records still unreported {timeout} s after the purge"


def close_kafka_python_producer(producer: Any, timeout: float = 5) -> None:
    """Close a kafka-python producer whose records may never be delivered (the proxy is gone, or
    a greedy producer's backlog outlasts the test), leaving no sender thread retrying behind.

    kafka-python's ``close(timeout)`` flushes first and raises at the flush timeout before it stops
    anything, so the sender thread would go on retrying for the rest of the session and the
    producer's ``__del__`` would raise again later, in whichever test collects it."""
    from kafka.errors import KafkaTimeoutError

    try:
        producer.close(timeout)
    except KafkaTimeoutError:
        # Force-closed, the sender thread fails what is left and ends by itself (at its next poll:
        # a request held by a throttle may keep it a while; and its abort of what is left takes
        # time quadratic in the batches left: keep buffer_memory small); the producer then counts
        # as closed, so its __del__ does nothing.
        producer._sender.force_close()
        producer._sender.wakeup()  # out of a poll that may wait out a request timeout
        producer._sender.join(timeout)
        producer._closed = True


def produce_until(stop: Any, producer: Any, topic: str, on_delivery: Callable[[Any, Any], None]) -> None:
    """librdkafka ``producer`` sending numbered records ("late0", "late1", ...) to ``topic`` as
    fast as it can until ``stop`` (a threading.Event) is set: a producer with requests always in
    flight, for the drain tests."""
    i = 0
    while not stop.is_set():
        producer.produce(topic, f"late{i}".encode(), on_delivery=on_delivery)
        producer.poll(0.001)
        i += 1
