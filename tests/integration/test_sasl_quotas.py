"""User quotas with SASL principals: the proxy reads who authenticated (PLAIN, SCRAM) from the
exchange it forwards, and the broker's verdict decides whether that name is ever charged."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from tests.integration.clients import delivery_errors_into, stop_greedy_producer
from tests.integration.conftest import SASL_USERS
from tests.integration.test_quotas import CYCLE, STEADY, WINDOW, OffsetSampler, steady_rate

pytestmark = pytest.mark.integration

USERS = SASL_USERS
KiB = 1024
ALICE, BOB, SPECIAL, DEFAULT_CLIENT = 128 * KiB, 384 * KiB, 768 * KiB, 32 * KiB


@pytest.fixture(scope="module")
def sasl_cluster(kafka_sasl_broker: KafkaCluster) -> KafkaCluster:
    return kafka_sasl_broker


def _proxy_config(cluster: KafkaCluster) -> dict[str, object]:
    cfg = gateway_config(cluster)
    cfg["gateway"]["upstream_bootstrap"] = cluster.sasl_bootstrap_servers.split(",")  # type: ignore[index]
    cfg["upstream_sasl"] = {"username": "alice", "password": USERS["alice"]}
    cfg["quotas"] = {
        "window": WINDOW,
        "users": {
            "alice": {"producer_byte_rate": ALICE, "clients": {"special": {"producer_byte_rate": SPECIAL}}},
            "bob": {"producer_byte_rate": BOB},
        },
        # A shared default client quota: the user quotas above are more specific and win.
        "clients": {"<default>": {"producer_byte_rate": DEFAULT_CLIENT}},
    }
    return cfg


def _producer(bootstrap: str, user: str, password: str, mechanism: str, client_id: str) -> object:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 16384,
            "acks": 1,
        }
    )


@pytest.mark.timeout(240)
def test_each_user_held_to_its_own_quota(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    """alice (PLAIN) and bob (SCRAM) as client "app" get their user quotas, not the <default>
    client quota; alice as client "special" at the same time gets her (user, client-id) override,
    a bucket of its own beside her user bucket."""
    runs = {  # label: (user, mechanism, client id, quota, level, bucket)
        "alice": ("alice", "PLAIN", "app", ALICE, 3, {"user": "alice", "client_id": ""}),
        "bob": ("bob", "SCRAM-SHA-256", "app", BOB, 3, {"user": "bob", "client_id": ""}),
        "special": (
            "alice",
            "SCRAM-SHA-256",
            "special",
            SPECIAL,
            1,
            {"user": "alice", "client_id": "special"},
        ),
    }
    topics = {label: f"sasl-{label}-{uuid.uuid4().hex[:6]}" for label in runs}
    for topic in topics.values():
        sasl_cluster.create_topic(topic)
    with ProxyProcess(_proxy_config(sasl_cluster), workdir=tmp_path) as proxy:
        stop = threading.Event()
        errors: list[str] = []

        def produce(label: str) -> None:
            user, mechanism, client_id = runs[label][:3]
            producer = _producer(proxy.bootstrap, user, USERS[user], mechanism, client_id)
            payload = b"s" * 1024
            while not stop.is_set():
                try:
                    producer.produce(
                        topics[label],
                        payload,  # type: ignore[attr-defined]
                        on_delivery=delivery_errors_into(errors),
                    )
                except BufferError:
                    producer.poll(0.05)  # type: ignore[attr-defined]
                producer.poll(0)  # type: ignore[attr-defined]
            stop_greedy_producer(producer)

        samplers = {label: OffsetSampler(sasl_cluster, topic) for label, topic in topics.items()}
        workers = [threading.Thread(target=produce, args=(label,), daemon=True) for label in runs]
        start = time.monotonic()
        for worker in workers:
            worker.start()
        try:
            deadline = STEADY[1]
            while time.monotonic() - start < deadline:
                for sampler in samplers.values():
                    sampler.sample_until(start, time.monotonic() - start + 0.25, every=0.25)
        finally:
            stop.set()
            for worker in workers:
                worker.join(60)
            for sampler in samplers.values():
                sampler.close()
        assert not errors, errors[:3]
        for label, (user, _mech, client_id, quota, level, bucket) in runs.items():
            rate = steady_rate([(t, n * 1024) for t, n in samplers[label].samples], *STEADY, cycle=CYCLE)
            assert abs(rate - quota) / quota < 0.15, f"{label}: {rate / KiB:.0f} KiB/s, quota {quota // KiB}"
            state = json.loads(proxy.admin_get(f"/quotas/entity?user={user}&client_id={client_id}")[1])
            assert state["producer_byte_rate"]["level"] == level
            assert state["producer_byte_rate"]["bucket"] == bucket


@pytest.mark.timeout(120)
def test_failed_login_is_never_charged(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    from confluent_kafka import KafkaException

    topic = f"sasl-refused-{uuid.uuid4().hex[:6]}"
    sasl_cluster.create_topic(topic)
    with ProxyProcess(_proxy_config(sasl_cluster), workdir=tmp_path) as proxy:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {
                "bootstrap.servers": proxy.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "bob",
                "sasl.password": "wrong",
            }
        )
        # The admin client's listing meanwhile, in a thread: both wait out their timeouts.
        with ThreadPoolExecutor(1) as pool:
            listing = pool.submit(admin.list_topics, timeout=5)
            # A wrong password: the broker refuses, and the name claimed is never charged.
            mallory = _producer(proxy.bootstrap, "bob", "not-bobs-password", "PLAIN", "intruder")
            reports: list[object] = []
            mallory.produce(topic, b"y" * 1024, on_delivery=lambda err, _msg: reports.append(err))  # type: ignore[attr-defined]
            mallory.flush(8)  # type: ignore[attr-defined]
            # Still queued, never delivered: no delivery report at all. (flush's return value also
            # counts librdkafka's protocol requests in flight, such as a reconnect's next SASL
            # handshake, so it read 2 now and then.)
            assert reports == []
            with pytest.raises(KafkaException):
                listing.result()
        bob = json.loads(proxy.admin_get("/quotas/entity?user=bob&client_id=intruder")[1])
        assert "rate" not in bob["producer_byte_rate"]  # no state, no charge
