"""The harness itself: brokers come up, Kafka's Java tools and kafka-python clients work against them."""

from __future__ import annotations

import re
import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from dev.harness import KafkaCluster, run_tool
from dev.kafka_python_group import group_consumer

pytestmark = pytest.mark.integration


@pytest.mark.timeout(180)
def test_single_broker_topic_tool_and_python_clients(kafka_broker: KafkaCluster) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    created = run_tool(
        "org.apache.kafka.tools.TopicCommand",
        "--bootstrap-server", bootstrap,
        "--create", "--topic", "t", "--partitions", "3", "--replication-factor", "1",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "Created topic t." in created.stdout

    described = run_tool(
        "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--describe", "--topic", "t"
    )
    assert described.returncode == 0, described.stderr
    assert re.search(r"PartitionCount:\s*3\s+ReplicationFactor:\s*1", described.stdout), described.stdout
    assert len(re.findall(r"Partition: \d+\s+Leader: 1\b", described.stdout)) == 3, described.stdout

    sent = [(f"key-{i % 7}".encode(), f"value-{i}".encode()) for i in range(100)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        futures = [producer.send("t", key=key, value=value) for key, value in sent]
        producer.flush(timeout=30)
        partitions = {future.get(timeout=30).partition for future in futures}
    finally:
        producer.close(timeout=10)
    assert partitions <= {0, 1, 2}
    assert len(partitions) > 1, "7 distinct keys should land on more than one of 3 partitions"

    consumer = group_consumer(
        "t",
        bootstrap_servers=bootstrap,
        group_id="harness-test",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    received: list[tuple[int, int, bytes, bytes]] = []
    try:
        deadline = time.monotonic() + 60
        while len(received) < len(sent) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received += [(r.partition, r.offset, r.key, r.value) for r in records]
    finally:
        consumer.close()
    assert sorted((key, value) for _, _, key, value in received) == sorted(sent)
    # Per partition, records come back in the order they were sent (same key -> same partition).
    for key in {key for key, _ in sent}:
        got = [value for _, _, k, value in sorted(received) if k == key]
        assert got == [value for k, value in sent if k == key]


@pytest.mark.timeout(180)
def test_producer_performance_tool(kafka_broker: KafkaCluster) -> None:
    result = run_tool(
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic", "perf",
        "--num-records", "1000",
        "--record-size", "100",
        "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={kafka_broker.bootstrap_servers}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The summary line: "1000 records sent, 2785.5 records/sec (0.27 MB/sec), ... ms avg latency, ..."
    assert re.search(r"^1000 records sent, [\d.]+ records/sec", result.stdout, re.MULTILINE), result.stdout


@pytest.mark.timeout(240)
def test_three_node_cluster_spreads_replicas(kafka_cluster3: KafkaCluster) -> None:
    assert [node.node_id for node in kafka_cluster3.nodes] == [1, 2, 3]
    assert kafka_cluster3.bootstrap_servers == ",".join(node.address for node in kafka_cluster3.nodes)

    admin = KafkaAdminClient(bootstrap_servers=kafka_cluster3.bootstrap_servers, request_timeout_ms=30000)
    try:
        cluster = admin.describe_cluster()
        assert sorted(b["broker_id"] for b in cluster["brokers"]) == [1, 2, 3]
        assert not any(b.get("is_fenced") for b in cluster["brokers"])

        admin.create_topics({"t3": {"num_partitions": 3, "replication_factor": 3}})
        # kafka-python's wait_for_topics asks one node; the describe after it may ask another whose
        # metadata has not caught up yet (seen as a topic with no partitions). Wait for all three.
        kafka_cluster3.wait_for_topic("t3", partitions=3, timeout=30)
        [topic] = admin.describe_topics(["t3"])
    finally:
        admin.close()

    partitions = topic["partitions"]
    assert len(partitions) == 3
    for partition in partitions:
        assert sorted(partition["replica_nodes"]) == [1, 2, 3], partition
        assert sorted(partition["isr_nodes"]) == [1, 2, 3], partition
    leaders = {partition["leader_id"] for partition in partitions}
    # Kafka's striped replica placer puts the 3 leaders on 3 different brokers in a fresh cluster.
    assert leaders == {1, 2, 3}, partitions
