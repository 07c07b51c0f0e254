"""The PROXY protocol behind a real HAProxy (dev/load_balancer.py), in front of the real broker.

Gateway replicas require the header on every client listener and trust only 127.0.0.7, the
address HAProxy connects to them from (``source 127.0.0.7``); clients connect to HAProxy from
127.0.0.1 (and a connection storm from 127.0.0.2). So what the proxy names is visibly the
client's address and not the load balancer's: in capture records, in the per-IP connection
rate (KIP-612), and in the log line of a refused connection. With TLS, HAProxy sends the v2
header and the TLS handshake follows it, client certificates included."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dev.certs import CertificateAuthority
from dev.harness import KafkaCluster
from dev.load_balancer import GatewayReplicas
from dev.waiting import wait_until
from tests.integration.clients import assert_same_messages, confluent_roundtrip, messages
from tests.integration.test_capture import captured
from tests.integration.test_load_balancer import require_haproxy

pytestmark = pytest.mark.integration

REPLICAS = 2
LB_SOURCE = "127.0.0.7"  # HAProxy's address towards the replicas
STORM_SOURCE = "127.0.0.2"
STORM = 200  # connections opened at once from 127.0.0.2 (100 a replica, at 5/s over 10 s: 50 admitted)
PROXY_PROTOCOL = {"listeners": ["all"], "trusted_sources": [f"{LB_SOURCE}/32"]}
_API_VERSIONS_V3 = struct.pack(">hhih", 18, 3, 1, 4) + b"test" + b"\x00" + b"\x02x\x021\x00"
API_VERSIONS = struct.pack(">i", len(_API_VERSIONS_V3)) + _API_VERSIONS_V3  # what a Kafka client sends first


def _capture_in(directory: Path) -> Any:
    """Per replica: its own capture directory, files closed every second (readable at once)."""

    def adjust(index: int, cfg: dict[str, Any]) -> dict[str, Any]:
        cfg["capture"] = {
            "enabled": True,
            "directory": str(directory / f"capture-{index}"),
            "instance": f"replica-{index}",
            "max_file_seconds": 1,
            "flush_seconds": 0.2,
        }
        return cfg

    return adjust


def _records(gw: GatewayReplicas, directory: Path) -> list[dict[str, Any]]:
    return [row for i in range(len(gw.replicas)) for row in captured(directory / f"capture-{i}")]


def _ip_state(gw: GatewayReplicas, index: int, ip: str) -> dict[str, Any]:
    status, body = gw.replicas[index].admin_get(f"/quotas/ip?ip={ip}")
    assert status == 200, body
    state: dict[str, Any] = json.loads(body)
    return state


@dataclass
class Proxied:
    gw: GatewayReplicas
    directory: Path  # the replicas' capture directories are in it


@pytest.fixture(scope="module")
def proxied(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """Two replicas behind HAProxy sending the v1 header from 127.0.0.7, a connection rate of
    5/s per client IP, and capture on."""
    require_haproxy()
    directory = tmp_path_factory.mktemp("proxied")
    with GatewayReplicas(
        kafka_broker,
        replicas=REPLICAS,
        send_proxy="v1",
        lb_source=LB_SOURCE,
        per_replica=_capture_in(directory),
        workdir=directory / "run",
        proxy_protocol=PROXY_PROTOCOL,
        quotas={"ips": {"<default>": {"connection_creation_rate": 5}}},
    ) as gw:
        yield Proxied(gw, directory)


@pytest.mark.timeout(120)
def test_the_proxy_names_the_client_not_the_load_balancer(proxied: Proxied) -> None:
    """A librdkafka admin, producer and consumer through HAProxy: nothing is lost, every replica
    took v1 headers naming a client, and the capture records name 127.0.0.1, never HAProxy's
    127.0.0.7."""
    gw, directory = proxied.gw, proxied.directory
    topic = f"pp-{uuid.uuid4().hex[:8]}"
    sent = messages(200, "pp")
    assert_same_messages(sent, confluent_roundtrip(gw.bootstrap, topic, sent))
    for i in range(REPLICAS):
        headers = gw.metric(i, "kthrottle_proxy_protocol_headers_total", {"version": "1", "kind": "client"})
        assert headers >= 1, f"replica {i} took no PROXY header\n{gw.logs()}"

    def produced() -> list[dict[str, Any]]:
        return [r for r in _records(gw, directory) if r["api_key"] == 0]

    wait_until(lambda: len(produced()) > 0, 30, "no Produce record in any replica's closed capture files")
    hosts = {r["client_addr"].rsplit(":", 1)[0] for r in _records(gw, directory)}
    assert hosts == {"127.0.0.1"}, hosts


@pytest.mark.timeout(120)
def test_connection_rate_is_charged_to_the_real_client_ip(proxied: Proxied) -> None:
    """200 connections at once from 127.0.0.2 through HAProxy: each replica holds and closes the
    ones over 127.0.0.2's rate. The real client on 127.0.0.1 goes through the same load balancer
    meanwhile and is never throttled; HAProxy's own address is charged nothing. (Without the
    header every connection would be HAProxy's, and the client held with the storm.)"""
    gw = proxied.gw
    host, port = gw.bootstrap.split(":")
    storm: list[socket.socket] = []
    try:
        for _ in range(STORM):
            sock = socket.socket()
            sock.bind((STORM_SOURCE, 0))
            sock.connect((host, int(port)))
            storm.append(sock)
        topic = f"pp-storm-{uuid.uuid4().hex[:8]}"
        sent = messages(50, "storm")
        assert_same_messages(sent, confluent_roundtrip(gw.bootstrap, topic, sent))
        wait_until(
            lambda: all(_ip_state(gw, i, STORM_SOURCE)["throttle_ms_total"] > 0 for i in range(REPLICAS)),
            30,
            lambda: f"storm not throttled: {[_ip_state(gw, i, STORM_SOURCE) for i in range(REPLICAS)]}",
        )
    finally:
        for sock in storm:
            sock.close()
    for i in range(REPLICAS):
        assert _ip_state(gw, i, "127.0.0.1")["throttle_ms_total"] == 0
        lb = _ip_state(gw, i, LB_SOURCE)
        assert lb["rate"] == 0 and lb["throttle_ms_total"] == 0, lb
    assert (
        sum(
            gw.metric(i, "kthrottle_throttled_connections_total", {"mode": "applied"})
            for i in range(REPLICAS)
        )
        > 0
    )


@pytest.mark.timeout(120)
def test_connections_without_the_load_balancers_header_are_refused(proxied: Proxied) -> None:
    """A librdkafka client that goes to a replica directly (from 127.0.0.1, not a trusted
    source) gets no metadata, and the replica logs who it refused and why; a connection from the
    trusted address that sends a Kafka request instead of a header is refused the same way."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    replica = proxied.gw.replicas[0]
    direct = AdminClient({"bootstrap.servers": replica.bootstrap, "log_level": 2})  # refusals expected
    with pytest.raises(KafkaException):
        direct.list_topics(timeout=5)
    wait_until(
        lambda: "127.0.0.1 is not in proxy_protocol.trusted_sources" in replica.log_text(),
        30,
        lambda: f"no refusal logged:\n{replica.log_tail()}",
    )
    assert replica.metric("kthrottle_proxy_protocol_refused_total", {"reason": "untrusted-source"}) >= 1

    host, port = replica.bootstrap.split(":")
    with socket.socket() as sock:
        sock.bind((LB_SOURCE, 0))
        sock.connect((host, int(port)))
        local_port = sock.getsockname()[1]
        sock.sendall(API_VERSIONS)
        sock.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b"", "answered without a PROXY header"
    line = f"connection from {LB_SOURCE}:{local_port} on bootstrap refused: not a PROXY protocol header"
    wait_until(lambda: line in replica.log_text(), 30, lambda: f"no line {line!r}:\n{replica.log_tail()}")
    assert "(a Kafka request, it seems" in next(ln for ln in replica.log_text().splitlines() if line in ln)
    assert replica.metric("kthrottle_proxy_protocol_refused_total", {"reason": "malformed"}) >= 1


# --- TLS behind HAProxy with the v2 header --------------------------------------------------------------


@pytest.mark.timeout(180)
def test_tls_and_client_certificates_behind_haproxy_with_send_proxy_v2(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    """HAProxy passes TLS through untouched, after a v2 header: the replicas read the header,
    then do the TLS handshake themselves, with client certificates. A producer and consumer
    with alice's certificate lose nothing, and the capture names alice (her certificate's
    principal) at 127.0.0.1. A client that skips the load balancer is refused."""
    require_haproxy()
    ca = CertificateAuthority(tmp_path / "pki")
    server = ca.issue("proxy-server", "proxy", dns=("localhost",), ips=("127.0.0.1",))
    alice = ca.issue("alice", "alice", org_unit="clients", server=False)
    tls = {
        "enabled": True,
        "certfile": str(server.cert),
        "keyfile": str(server.key),
        "cafile": str(ca.cert_path),
        "client_auth": "required",
        "principal_mapping_rules": ["RULE:^CN=([^,]+),OU=clients,.*$/$1/", "DEFAULT"],
    }
    client_tls = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(ca.cert_path),
        "ssl.certificate.location": str(alice.cert),
        "ssl.key.location": str(alice.key),
    }
    with GatewayReplicas(
        kafka_broker,
        replicas=REPLICAS,
        send_proxy="v2",
        lb_source=LB_SOURCE,
        per_replica=_capture_in(tmp_path),
        workdir=tmp_path / "run",
        proxy_protocol=PROXY_PROTOCOL,
        tls=tls,
    ) as gw:
        topic = f"pp-tls-{uuid.uuid4().hex[:8]}"
        sent = messages(200, "tls")
        got = _confluent_tls_roundtrip(gw.bootstrap, topic, sent, client_tls)
        assert_same_messages(sent, got)
        for i in range(REPLICAS):
            assert (
                gw.metric(i, "kthrottle_proxy_protocol_headers_total", {"version": "2", "kind": "client"})
                >= 1
            )
            assert gw.metric(i, "kthrottle_tls_handshake_failures_total") == 0

        def produced() -> list[dict[str, Any]]:
            return [r for r in _records(gw, tmp_path) if r["api_key"] == 0]

        wait_until(lambda: len(produced()) > 0, 30, "no Produce record in any replica's closed capture files")
        assert {(r["principal"], r["client_addr"].rsplit(":", 1)[0]) for r in produced()} == {
            ("alice", "127.0.0.1")
        }

        # A TLS client straight to a replica, from the trusted address but without the header.
        replica = gw.replicas[1]
        host, port = replica.bootstrap.split(":")
        context = ssl.create_default_context(cafile=str(ca.cert_path))
        context.load_cert_chain(str(alice.cert), str(alice.key))
        with socket.socket() as raw:
            raw.bind((LB_SOURCE, 0))
            raw.connect((host, int(port)))
            raw.settimeout(10)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                context.wrap_socket(raw, server_hostname="127.0.0.1").sendall(API_VERSIONS)
        wait_until(
            lambda: (
                "(a TLS handshake: the client reached this listener without the load balancer)"
                in replica.log_text()
            ),
            30,
            lambda: f"no refusal logged:\n{replica.log_tail()}",
        )


def _confluent_tls_roundtrip(
    bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes]], tls: dict[str, str], timeout: float = 60
) -> list[tuple[bytes, bytes]]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, **tls})
    for fut in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        fut.result(timeout)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **tls})
    errors: list[str] = []
    for key, value in msgs:
        producer.produce(
            topic, key=key, value=value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None
        )
    assert producer.flush(timeout) == 0 and not errors, errors[:3]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            **tls,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < len(msgs) and time.monotonic() < deadline:
            for record in consumer.consume(num_messages=500, timeout=1.0):
                if record.error() is None:
                    got.append((record.key() or b"", record.value() or b""))
    finally:
        consumer.close()
    return got
