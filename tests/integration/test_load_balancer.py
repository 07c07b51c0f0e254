"""Several kthrottle gateway replicas behind a real TCP load balancer (HAProxy), as pods behind
one Service: each replica binds its own loopback address with the same ports, all advertise the
load balancer's address, and HAProxy sends each new connection to the next replica.

librdkafka clients bootstrap at the load balancer and lose nothing; every replica carries some of
their connections; pinned, every new connection lands on one replica; a replica killed with
SIGKILL leaves the others serving, and comes back with the same ports."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster
from dev.load_balancer import GatewayReplicas, HAProxy, HAProxyError
from tests.integration.clients import (
    assert_same_messages,
    confluent_brokers_seen,
    confluent_roundtrip,
    messages,
)
from tests.tools import unavailable

pytestmark = pytest.mark.integration

REPLICAS = 3


def require_haproxy() -> str:
    """haproxy's path (dev/haproxy.sh installs Debian's package when missing); a skip that says
    why when there is none, and a failure under CI."""
    try:
        return HAProxy.find_binary()
    except HAProxyError as exc:
        unavailable(str(exc))


@pytest.fixture(scope="module")
def gateway(kafka_broker: KafkaCluster) -> Iterator[GatewayReplicas]:
    require_haproxy()
    with GatewayReplicas(kafka_broker, replicas=REPLICAS) as gw:
        yield gw


def _connections(gw: GatewayReplicas, listener: str | None = None) -> list[float]:
    labels = {"listener": listener} if listener else None
    return [gw.metric(i, "kthrottle_connections_total", labels) for i in range(REPLICAS)]


@pytest.mark.timeout(120)
def test_clients_through_the_load_balancer_spread_over_every_replica(gateway: GatewayReplicas) -> None:
    """An admin client, a producer and a consumer bootstrap at the load balancer: each one's
    bootstrap connection lands on the next replica, so all three replicas carry one; the
    brokers they learn are the load balancer's address; every message produced is consumed."""
    before = _connections(gateway, "bootstrap")
    topic = f"lb-{uuid.uuid4().hex[:8]}"
    sent = messages(300, "lb")
    got = confluent_roundtrip(gateway.bootstrap, topic, sent)
    assert_same_messages(sent, got)

    assert confluent_brokers_seen(gateway.bootstrap) == {
        ("127.0.0.1", port) for port in gateway.broker_ports.values()
    }
    bootstrap = [after - b for after, b in zip(_connections(gateway, "bootstrap"), before, strict=True)]
    assert all(n >= 1 for n in bootstrap), f"bootstrap connections per replica: {bootstrap}\n{gateway.logs()}"
    brokers = sum(_connections(gateway)) - sum(_connections(gateway, "bootstrap"))
    assert brokers >= 2, f"broker-port connections over all replicas: {brokers}"


@pytest.mark.timeout(120)
def test_pinned_every_new_connection_lands_on_one_replica(gateway: GatewayReplicas) -> None:
    """With the load balancer pinned to replica 2, a whole produce-and-consume round adds
    connections to replica 2 only; unpinned, connections spread again."""
    before = _connections(gateway)
    gateway.pin(2)
    try:
        topic = f"lb-pinned-{uuid.uuid4().hex[:8]}"
        sent = messages(100, "pinned")
        assert_same_messages(sent, confluent_roundtrip(gateway.bootstrap, topic, sent))
    finally:
        gateway.unpin()
    grew = [after - b for after, b in zip(_connections(gateway), before, strict=True)]
    assert grew[0] == grew[1] == 0 and grew[2] >= 3, f"new connections per replica: {grew}"


@pytest.mark.timeout(180)
def test_a_killed_replica_leaves_the_others_serving_and_comes_back(gateway: GatewayReplicas) -> None:
    """Replica 0 is killed with SIGKILL: clients through the load balancer still produce and
    consume everything (connections it refuses go to another replica). Started again, it
    listens on the same address and ports and takes connections."""
    gateway.kill(0)
    try:
        topic = f"lb-killed-{uuid.uuid4().hex[:8]}"
        sent = messages(100, "killed")
        assert_same_messages(sent, confluent_roundtrip(gateway.bootstrap, topic, sent))
    finally:
        gateway.restart(0)
    assert gateway.metric(0, "kthrottle_connections_total") == 0  # a new process
    gateway.pin(0)
    try:
        assert confluent_brokers_seen(gateway.bootstrap)
    finally:
        gateway.unpin()
    assert gateway.metric(0, "kthrottle_connections_total", {"listener": "bootstrap"}) >= 1
