"""The project's kafka-python group members (``dev/kafka_python_group.group_consumer``) stay clear
of kafka-python 3.0.12's stalled leader (docs/operations.md, "kafka-python: a leader that stops
after a metadata change").

A relay in front of the real broker holds every Metadata answer 1 s and every SyncGroup answer
1.5 s, longer than ``poll(timeout_ms=500)``. A consumer whose first JoinGroup goes before its
topic's metadata arrives assigns nothing, rejoins when the metadata comes, and then misses its
held SyncGroup answer for good: in place of ``group_consumer``, a plain ``KafkaConsumer`` read
nothing in 2 of these 3 starts (4 of 6 in trials; the first start of a process was the lucky one:
its FindCoordinator queued behind its held Metadata answer). Started through ``group_consumer``,
each member's first join knows its partitions, and every member reads its records.
(``dev/kafka_python_stall.py`` shows the stall itself, after a partition change.)
"""

from __future__ import annotations

import time
import uuid

import pytest

from dev.harness import KafkaCluster
from dev.kafka_python_group import group_consumer
from dev.kafka_python_stall import METADATA, SYNC_GROUP, DelayRelay

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_group_members_behind_slow_metadata_and_sync_answers_read_their_partitions(
    kafka_broker: KafkaCluster,
) -> None:
    from kafka import KafkaProducer

    bound, advertised = kafka_broker.nodes[0].relayed["RELAY"]
    relay = DelayRelay(advertised, bound, {METADATA: 1.0, SYNC_GROUP: 1.5})
    relay.start()
    seen = []
    try:
        for _ in range(3):
            topic, group = f"kpg-{uuid.uuid4().hex[:6]}", f"kpg-{uuid.uuid4().hex[:6]}"
            kafka_broker.create_topic(topic, 2)
            producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
            for partition in range(2):
                producer.send(topic, b"x", partition=partition)
            producer.flush(30)
            producer.close()
            consumer = group_consumer(
                topic,
                bootstrap_servers=f"127.0.0.1:{advertised}",
                group_id=group,
                auto_offset_reset="earliest",
            )
            read, began = 0, time.monotonic()
            try:
                while read < 2 and time.monotonic() - began < 15:
                    read += sum(len(records) for records in consumer.poll(timeout_ms=500).values())
                assigned = sorted(tp.partition for tp in consumer.assignment())
            finally:
                consumer.close()
            seen.append((read, assigned))
    finally:
        relay.stop()
    assert relay.held > 0, "the relay held no answer: the test ran without its delays"
    assert seen == [(2, [0, 1])] * 3, seen
