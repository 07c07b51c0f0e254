"""Producer-id (KIP-936), request-time and connection-rate (KIP-612) quotas through the proxy,
with real clients against a real broker (which has none of these quotas itself)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import ThrottleWatch, librdkafka_sasl, producer_id_storm
from tests.integration.conftest import SASL_USERS

pytestmark = pytest.mark.integration

USERS = SASL_USERS
PID_QUOTA = 5.0  # new producer ids per second per user (the storm goes ~16/s unchecked)
PID_FILTER_BYTES = 8192
STORM = 200  # connections opened at once from 127.0.0.2


@pytest.fixture(scope="module")
def sasl_cluster(kafka_sasl_broker: KafkaCluster) -> KafkaCluster:
    return kafka_sasl_broker


def _sasl(user: str) -> dict[str, Any]:
    return librdkafka_sasl(user, USERS[user])


@pytest.mark.timeout(240)
def test_producer_id_storm_is_slowed_and_others_are_not(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    """alice starts short-lived idempotent producers as fast as 8 threads can; bob runs one
    long-lived idempotent producer. Both users have the <default> user's producer_ids_rate."""
    storm_topic, steady_topic = f"pid-storm-{uuid.uuid4().hex[:6]}", f"pid-steady-{uuid.uuid4().hex[:6]}"
    sasl_cluster.create_topic(storm_topic)
    sasl_cluster.create_topic(steady_topic)
    cfg = gateway_config(sasl_cluster)
    cfg["gateway"]["upstream_bootstrap"] = sasl_cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "alice", "password": USERS["alice"]}
    cfg["quotas"] = {
        "users": {"<default>": {"producer_ids_rate": PID_QUOTA}},
        "producer_ids": {
            "window": {"num": 5, "size_seconds": 1},  # a 5 s cycle: several in a short storm
            "max_bytes_per_user": PID_FILTER_BYTES,
            "false_positive_rate": 0.01,
        },
    }
    duration, steady_from = 18.0, 6.0
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        result = producer_id_storm(
            proxy.bootstrap, _sasl("alice"), _sasl("bob"), storm_topic, steady_topic, duration
        )
        storm_rate = result.rate(steady_from, duration)
        alice = json.loads(proxy.admin_get("/quotas/entity?user=alice")[1])["producer_ids_rate"]
        bob = json.loads(proxy.admin_get("/quotas/entity?user=bob")[1])["producer_ids_rate"]
        total_bytes = proxy.metric("kthrottle_producer_id_filter_bytes_total", {})
        print(
            f"storm: {len(result.created)} producers, {storm_rate:.1f}/s steady (quota {PID_QUOTA}/s); "
            f"alice filters {alice['filters']}; all filters {total_bytes:.0f} bytes"
        )
        assert storm_rate <= PID_QUOTA * 1.3, f"storm held to {storm_rate:.1f} new ids/s"
        assert storm_rate >= PID_QUOTA * 0.3, f"storm starved at {storm_rate:.1f} new ids/s"
        assert alice["throttle_ms_total"] > 0
        labels = {"api": "InitProducerId", "quota": "producer-ids", "mode": "applied"}
        assert proxy.metric("kthrottle_quota_throttles_total", labels) > 0
        assert bob["throttle_ms_total"] == 0 and result.steady_throttles.never_throttled()
        assert result.steady_delivered > 0 and not result.steady_errors, result.steady_errors[:3]
        assert 0 < total_bytes <= 2 * PID_FILTER_BYTES  # two users, each within its bound


@pytest.mark.timeout(180)
def test_request_percentage_throttles_within_one_window(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """A producer keeping the broker busy far beyond 1% of a thread is throttled, never for more
    than one window sample (1 s), as Kafka caps request-time throttles."""
    from confluent_kafka import Producer

    topic = f"rt-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    quotas = {"clients": {"busy": {"request_percentage": 1}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        throttles = ThrottleWatch()
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "client.id": "busy",
                "acks": "all",
                "linger.ms": 0,
                **throttles.config(),
            }
        )
        delivered = [0]

        def on_delivery(err: object, _msg: object) -> None:
            if err is None:
                delivered[0] += 1

        start = time.monotonic()
        # Capped from its first report on; past one whole window (11 x 1 s), so the throttles once
        # the padded window is full are seen too.
        while time.monotonic() - start < 12:
            producer.produce(topic, b"r" * 512, on_delivery=on_delivery)
            producer.poll(0.001)
        assert producer.flush(30) == 0
        state = json.loads(proxy.admin_get("/quotas/entity?client_id=busy")[1])["request_percentage"]
        assert delivered[0] > 0
        assert state["throttle_ms_total"] > 0
        assert 0 < throttles.max <= 1000, throttles.seen[-5:]


@pytest.mark.timeout(120)
def test_connection_storm_from_one_ip_does_not_starve_another(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    """127.0.0.2 opens connections far over its rate: they are accepted, held and closed. A real
    client on 127.0.0.1 (its own rate, same default quota) works throughout."""
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"conn-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    quotas = {"ips": {"<default>": {"connection_creation_rate": 5}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        host, port = proxy.bootstrap.split(":")
        storm: list[socket.socket] = []
        for _ in range(STORM):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.connect((host, int(port)))
            storm.append(sock)

        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap)
        for i in range(20):
            producer.send(topic, f"m{i}".encode())
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest")
        got: list[bytes] = []
        deadline = time.monotonic() + 30  # until all 20 are in, not 10 s of silence after them
        while len(got) < 20 and time.monotonic() < deadline:
            got += [r.value for records in consumer.poll(timeout_ms=500).values() for r in records]
        consumer.close()
        assert got == [f"m{i}".encode() for i in range(20)]

        time.sleep(2.0)  # every held connection's throttle (at most one 1 s sample) is over
        closed = 0
        for sock in storm:
            sock.settimeout(0.05)
            with contextlib.suppress(TimeoutError, OSError):
                closed += sock.recv(1) == b""  # the proxy closed it without a byte
            sock.close()
        storm_ip = json.loads(proxy.admin_get("/quotas/ip?ip=127.0.0.2")[1])
        client_ip = json.loads(proxy.admin_get("/quotas/ip?ip=127.0.0.1")[1])
        # 5/s over a window padded to 10 s admits the first 50; the rest are over the rate.
        assert closed >= STORM - 60, f"only {closed} of {STORM} connections were closed"
        assert storm_ip["throttle_ms_total"] > 0
        assert client_ip["throttle_ms_total"] == 0
        assert proxy.metric("kthrottle_throttled_connections_total", {"mode": "applied"}) >= closed
