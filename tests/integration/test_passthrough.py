"""Real clients through the proxy in front of a real broker: nothing lost, nothing leaked."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster, run_tool
from dev.proc import own_tcp_sockets
from dev.proxy_process import ProxyProcess, gateway_config
from tests.integration.clients import (
    aiokafka_roundtrip,
    assert_same_messages,
    confluent_brokers_seen,
    confluent_roundtrip,
    kafka_python_brokers_seen,
    kafka_python_roundtrip,
    messages,
)

pytestmark = pytest.mark.integration

ROUNDTRIPS = {
    "kafka-python": kafka_python_roundtrip,
    "aiokafka": aiokafka_roundtrip,
    "confluent-kafka": confluent_roundtrip,
}


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster) -> Iterator[ProxyProcess]:
    with ProxyProcess(gateway_config(kafka_broker)) as proc:
        yield proc


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("client", sorted(ROUNDTRIPS))
def test_client_roundtrip_single_broker(proxy: ProxyProcess, client: str) -> None:
    msgs = messages(300, client)
    got = ROUNDTRIPS[client](proxy.bootstrap, _topic(client), msgs)
    assert_same_messages(msgs, got)
    assert proxy.metric("kthrottle_requests_total", {"api": "Produce"}) > 0
    assert proxy.metric("kthrottle_requests_total", {"api": "Fetch"}) > 0


@pytest.mark.timeout(120)
def test_clients_only_see_proxy_addresses(proxy: ProxyProcess, kafka_broker: KafkaCluster) -> None:
    proxy_ports = set(proxy.ports.values())
    for seen in (confluent_brokers_seen(proxy.bootstrap), kafka_python_brokers_seen(proxy.bootstrap)):
        assert seen, "no brokers in metadata"
        assert {port for _host, port in seen} <= proxy_ports
        assert not {port for _host, port in seen} & {n.port for n in kafka_broker.nodes}


@pytest.mark.timeout(240)
def test_java_tools_through_proxy(proxy: ProxyProcess) -> None:
    topic = _topic("java")
    boot = ["--bootstrap-server", proxy.bootstrap]
    created = run_tool(
        "org.apache.kafka.tools.TopicCommand",
        *boot,
        "--create",
        "--topic",
        topic,
        "--partitions",
        "3",
        "--replication-factor",
        "1",
    )
    assert created.returncode == 0, created.stderr
    described = run_tool("org.apache.kafka.tools.TopicCommand", *boot, "--describe", "--topic", topic)
    assert described.returncode == 0, described.stderr
    assert described.stdout.count("Partition:") == 3
    produced = run_tool(
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        "20000",
        "--record-size",
        "512",
        "--throughput",
        "-1",
        "--producer-props",
        f"bootstrap.servers={proxy.bootstrap}",
        "acks=all",
        "enable.idempotence=true",
    )
    assert produced.returncode == 0, produced.stderr
    assert re.search(r"^20000 records sent", produced.stdout, re.M), produced.stdout
    consumed = run_tool(
        "org.apache.kafka.tools.ConsumerPerformance",
        *boot,
        "--topic",
        topic,
        "--messages",
        "20000",
        "--timeout",
        "60000",
    )
    assert consumed.returncode == 0, consumed.stderr
    # Summary line: start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, ...
    summary = [line for line in consumed.stdout.splitlines() if line[:1].isdigit()]
    assert summary and int(summary[-1].split(",")[4].strip()) == 20000, consumed.stdout
    altered = run_tool(
        "kafka.admin.ConfigCommand",
        *boot,
        "--alter",
        "--entity-type",
        "topics",
        "--entity-name",
        topic,
        "--add-config",
        "retention.ms=3600000",
    )
    assert altered.returncode == 0, altered.stderr
    configs = run_tool(
        "kafka.admin.ConfigCommand", *boot, "--describe", "--entity-type", "topics", "--entity-name", topic
    )
    assert configs.returncode == 0, configs.stderr
    assert "retention.ms=3600000" in configs.stdout
    deleted = run_tool("org.apache.kafka.tools.TopicCommand", *boot, "--delete", "--topic", topic)
    assert deleted.returncode == 0, deleted.stderr
    listed = run_tool("org.apache.kafka.tools.TopicCommand", *boot, "--list")
    assert topic not in listed.stdout.split()


@pytest.mark.timeout(300)
def test_three_broker_gateway(kafka_cluster3: KafkaCluster) -> None:
    from confluent_kafka import Producer
    from kafka.admin import KafkaAdminClient, NewTopic

    with ProxyProcess(gateway_config(kafka_cluster3)) as proxy:
        broker_ports = {n.port for n in kafka_cluster3.nodes}
        topic = _topic("spread")
        admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
        # One partition led by each broker.
        admin.create_topics([NewTopic(topic, replica_assignments={0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]})])
        admin.close()
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(topic, timeout=30)
        leaders = {p.leader for p in md.topics[topic].partitions.values()}
        assert leaders == {1, 2, 3}

        # A live librdkafka producer keeps its connections open while we look at our own sockets.
        live = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": True})
        for i in range(30):
            live.produce(topic, key=str(i).encode(), value=b"x", partition=i % 3)
        assert live.flush(30) == 0
        peers = {remote for _local, remote, _state in own_tcp_sockets()}
        assert not peers & broker_ports, f"test process talks to brokers directly: {peers & broker_ports}"

        for name, roundtrip in sorted(ROUNDTRIPS.items()):
            msgs = messages(300, name)
            got = roundtrip(proxy.bootstrap, _topic(f"c3-{name}"), msgs, 3, 3)
            assert_same_messages(msgs, got)
        for seen in (confluent_brokers_seen(proxy.bootstrap), kafka_python_brokers_seen(proxy.bootstrap)):
            assert {port for _h, port in seen} == {proxy.ports[f"broker-{n}"] for n in (1, 2, 3)}

        # Every broker's proxy listener was used; no client ever learned a broker port.
        for node in (1, 2, 3):
            assert proxy.metric("kthrottle_connections_total", {"listener": f"broker-{node}"}) > 0
        del live
