"""User quotas with SASL principals: the proxy reads who authenticated (PLAIN, SCRAM, an
OAUTHBEARER token's subject) from the exchange it forwards, and the broker's verdict decides
whether that name is ever charged. The proxy's own login to the brokers is SCRAM here."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from tests.integration.clients import delivery_errors_into, stop_greedy_producer
from tests.integration.conftest import SASL_USERS
from tests.integration.test_quotas import CYCLE, STEADY, WINDOW, OffsetSampler, steady_rate
from tests.integration.test_volume_quotas import end_offset

if TYPE_CHECKING:
    from confluent_kafka import Producer

pytestmark = pytest.mark.integration

USERS = SASL_USERS
KiB = 1024
ALICE, BOB, SPECIAL, CAROL, DEFAULT_CLIENT = 128 * KiB, 384 * KiB, 768 * KiB, 256 * KiB, 32 * KiB


@pytest.fixture(scope="module")
def sasl_cluster(kafka_sasl_broker: KafkaCluster) -> KafkaCluster:
    return kafka_sasl_broker


def _proxy_config(cluster: KafkaCluster) -> dict[str, object]:
    cfg = gateway_config(cluster)
    cfg["gateway"]["upstream_bootstrap"] = cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "alice", "password": USERS["alice"], "mechanism": "SCRAM-SHA-256"}
    # An OAUTHBEARER token names carol@EXAMPLE.COM; the mapping rules make it carol.
    cfg["client_sasl"] = {"principal_mapping_rules": ["RULE:(.*)@EXAMPLE.COM/$1/", "DEFAULT"]}
    cfg["quotas"] = {
        "window": WINDOW,
        "users": {
            "alice": {"producer_byte_rate": ALICE, "clients": {"special": {"producer_byte_rate": SPECIAL}}},
            "bob": {"producer_byte_rate": BOB},
            "carol": {"producer_byte_rate": CAROL},
        },
        # A shared default client quota: the user quotas above are more specific and win.
        "clients": {"<default>": {"producer_byte_rate": DEFAULT_CLIENT}},
    }
    return cfg


def _producer(bootstrap: str, user: str, password: str, mechanism: str, client_id: str) -> Producer:
    from confluent_kafka import Producer

    if mechanism == "OAUTHBEARER":  # an unsigned token of librdkafka's own, naming the user
        login = {"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": f"principal={user}"}
    else:
        login = {"sasl.username": user, "sasl.password": password}
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            **login,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 16384,
            "acks": 1,
        }
    )


@pytest.mark.timeout(240)
def test_each_user_held_to_its_own_quota(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    """alice (PLAIN), bob (SCRAM) and carol (OAUTHBEARER) as client "app" get their user quotas,
    not the <default> client quota; alice as client "special" at the same time gets her (user,
    client-id) override, a bucket of its own beside her user bucket."""
    runs = {  # label: (user, mechanism, client id, quota, level, bucket)
        "alice": ("alice", "PLAIN", "app", ALICE, 3, {"user": "alice", "client_id": ""}),
        "bob": ("bob", "SCRAM-SHA-256", "app", BOB, 3, {"user": "bob", "client_id": ""}),
        "carol": ("carol@EXAMPLE.COM", "OAUTHBEARER", "app", CAROL, 3, {"user": "carol", "client_id": ""}),
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
            producer = _producer(proxy.bootstrap, user, USERS.get(user, ""), mechanism, client_id)
            payload = b"s" * 1024
            while not stop.is_set():
                try:
                    producer.produce(
                        topics[label],
                        payload,
                        on_delivery=delivery_errors_into(errors),
                    )
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
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
        for label, (_user, _mech, client_id, quota, level, bucket) in runs.items():
            rate = steady_rate([(t, n * 1024) for t, n in samplers[label].samples], *STEADY, cycle=CYCLE)
            assert abs(rate - quota) / quota < 0.15, f"{label}: {rate / KiB:.0f} KiB/s, quota {quota // KiB}"
            principal = bucket["user"]  # as the proxy names it (carol's token, mapped)
            state = json.loads(proxy.admin_get(f"/quotas/entity?user={principal}&client_id={client_id}")[1])
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
            mallory.produce(topic, b"y" * 1024, on_delivery=lambda err, _msg: reports.append(err))
            mallory.flush(8)
            # Still queued, never delivered: no delivery report at all. (flush's return value also
            # counts librdkafka's protocol requests in flight, such as a reconnect's next SASL
            # handshake, so it read 2 now and then.)
            assert reports == []
            with pytest.raises(KafkaException):
                listing.result()
        # A hostile client that does not wait for the verdict: its Produce, sent right behind the
        # wrong password, is neither charged to the name it claimed nor written.
        auth_error, produce_answered = _produce_behind_a_wrong_password(proxy.bootstrap, topic)
        assert auth_error == SASL_AUTHENTICATION_FAILED
        assert not produce_answered, "the Produce behind a refused login was answered"
        bob = json.loads(proxy.admin_get("/quotas/entity?user=bob&client_id=intruder")[1])
        assert "rate" not in bob["producer_byte_rate"]  # no state, no charge
    assert end_offset(sasl_cluster, topic) == 0, "a record from a refused login was written"


@pytest.mark.timeout(120)
def test_logging_in_is_charged_to_no_one(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    """Under a <default> user request_percentage, librdkafka producers log in as bob: the
    ApiVersions each connection opens with (Kafka's authenticator answers it before the login)
    and the login itself count against no one, so ANONYMOUS, which every connection still logging
    in would share, has used nothing; what they send after it is bob's."""
    topic = f"sasl-logins-{uuid.uuid4().hex[:6]}"
    sasl_cluster.create_topic(topic)
    cfg = _proxy_config(sasl_cluster)
    cfg["quotas"] = {"window": WINDOW, "users": {"<default>": {"request_percentage": 50}}}
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        for _ in range(5):
            producer = _producer(proxy.bootstrap, "bob", USERS["bob"], "SCRAM-SHA-256", "logins")
            producer.produce(topic, b"z" * 1024)
            assert producer.flush(30) == 0

        def used(user: str) -> dict[str, Any]:
            answer = proxy.admin_get(f"/quotas/entity?user={user}&client_id=logins")[1]
            return dict(json.loads(answer)["request_percentage"])

        anonymous, bob = used("ANONYMOUS"), used("bob")
        assert bob["percentage"] > 0, bob  # its Metadata and Produce requests
        assert anonymous["quota"] == 50 and anonymous["percentage"] == 0.0, anonymous
    assert end_offset(sasl_cluster, topic) == 5


SASL_AUTHENTICATION_FAILED = 58


def _produce_behind_a_wrong_password(bootstrap: str, topic: str) -> tuple[int, bool]:
    """Log in over raw frames as bob with a wrong password (PLAIN) and, without waiting for the
    broker's verdict, send a 1 KiB Produce as client "intruder"; read until the proxy closes.
    Returns SaslAuthenticate's error code and whether any answer to the Produce came back."""
    from dev.loadgen import produce_request
    from protocol import messages
    from protocol.api_keys import ApiKey
    from protocol.frames import RequestHeader, encode_request_header, frame

    def request(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
        header = encode_request_header(RequestHeader(api_key, version, correlation_id, "intruder", 0))
        return frame(header + messages.encode(api_key, version, body, response=False))

    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(request(ApiKey.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"}))
        answers = _read_answers(sock, until_closed=False, want=1)
        assert 1 in answers, "no SaslHandshake answer"
        sock.sendall(
            request(ApiKey.SASL_AUTHENTICATE, 2, 2, {"auth_bytes": b"\0bob\0not-bobs-password"})
            + produce_request(topic, 3, b"x" * 1024, "intruder")
        )
        answers = _read_answers(sock, until_closed=True)
    assert 2 in answers, "no SaslAuthenticate answer"
    body = messages.decode_response(ApiKey.SASL_AUTHENTICATE, 2, answers[2])
    return int(body["error_code"]), 3 in answers


def _read_answers(sock: socket.socket, until_closed: bool, want: int = 0) -> dict[int, bytes]:
    """Response frames read from ``sock`` by correlation id (the body after a v1 header's id and
    tagged fields are left to the caller), until ``want`` arrived or the peer closed."""
    got: dict[int, bytes] = {}
    buf = b""
    while until_closed or len(got) < want:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
            size = int.from_bytes(buf[:4], "big")
            payload, buf = buf[4 : 4 + size], buf[4 + size :]
            correlation_id = int.from_bytes(payload[:4], "big")
            # SaslHandshake answers with header v0; SaslAuthenticate v2 and Produce v9 with v1
            # (one empty tagged-field byte).
            got[correlation_id] = payload[4:] if correlation_id == 1 else payload[5:]
    return got
