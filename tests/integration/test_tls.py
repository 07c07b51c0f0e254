"""TLS on both sides of the proxy, against a real broker with an SSL listener that wants client
certificates: mTLS principals held to their user quotas, wrong certificates refused, the server
certificate rotated on disk without a restart, and SNI routing to each broker through one port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from dev.certs import CertFiles, CertificateAuthority, serial_of
from dev.harness import BrokerTls, KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import steady_producer
from tests.integration.test_quotas import OffsetSampler, steady_rate
from tests.tools import unavailable

pytestmark = pytest.mark.integration

KiB = 1024
ALICE_QUOTA = 256 * KiB
WINDOWS, WINDOW_SIZE_S = 5, 0.5  # a 2.5 s quota cycle (Kafka's is 11 x 1 s): several in a short test
CYCLE = WINDOWS * WINDOW_SIZE_S
STEADY_FROM, RUN_SECONDS = 5.0, 15.0  # after the TLS handshakes and the first burst
# alice offers four times her quota, so her queue is always full: its size is what she still has
# to deliver when the test stops her (librdkafka's 4 MiB took 16 s at 256 KiB/s, measuring nothing).
QUEUE = {"queue.buffering.max.kbytes": 512}
MAPPING = ["RULE:^CN=([^,]+),OU=clients,.*$/$1/L", "DEFAULT"]


class Pki:
    """One CA for the cluster, the proxy and the clients, and a rogue one nobody trusts."""

    def __init__(self, directory: Path) -> None:
        self.ca = CertificateAuthority(directory, "kthrottle test CA")
        self.rogue = CertificateAuthority(directory, "rogue CA")
        self.broker = self.ca.issue("broker", "broker", dns=("localhost",), ips=("127.0.0.1",))
        self.broker_keystore = directory / "broker-keystore.pem"  # Kafka's PEM store: key, then chain
        self.broker_keystore.write_bytes(self.broker.key.read_bytes() + self.broker.cert.read_bytes())
        self.proxy_upstream = self.ca.issue("proxy-upstream", "kthrottle-proxy", org_unit="proxies")
        self.proxy_server = self.ca.issue(
            "proxy-server", "proxy", dns=("localhost", "kafka.test", "*.kafka.test"), ips=("127.0.0.1",)
        )
        self.alice = self.ca.issue("alice", "Alice", org_unit="clients", server=False)
        self.bob = self.ca.issue("bob", "Bob", org_unit="clients", server=False)
        self.mallory = self.rogue.issue("mallory", "Alice", org_unit="clients", server=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki) -> Iterator[KafkaCluster]:
    """One broker whose SSL listener requires a client certificate from the test CA."""
    tls = BrokerTls(keystore=pki.broker_keystore, truststore=pki.ca.cert_path, client_auth="required")
    with KafkaCluster(brokers=1, tls=tls) as cluster:
        yield cluster


def _proxy_config(cluster: KafkaCluster, pki: Pki, server: CertFiles, **tls: Any) -> dict[str, Any]:
    cfg = gateway_config(cluster)
    cfg["gateway"]["upstream_bootstrap"] = cluster.ssl_bootstrap_servers.split(",")
    cfg["tls"] = {
        "enabled": True,
        "certfile": str(server.cert),
        "keyfile": str(server.key),
        "cafile": str(pki.ca.cert_path),
        "client_auth": "required",
        "principal_mapping_rules": MAPPING,
        **tls,
    }
    cfg["upstream_tls"] = {
        "enabled": True,
        "cafile": str(pki.ca.cert_path),
        "certfile": str(pki.proxy_upstream.cert),
        "keyfile": str(pki.proxy_upstream.key),
    }
    cfg["quotas"] = {"users": {"alice": {"producer_byte_rate": ALICE_QUOTA}}}
    return cfg


def _client_tls(pki: Pki, client: CertFiles | None) -> dict[str, Any]:
    """librdkafka settings for a TLS client of the proxy (checking the proxy's name)."""
    out = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca.cert_path)}
    if client is not None:
        out.update({"ssl.certificate.location": str(client.cert), "ssl.key.location": str(client.key)})
    return out


def _topics_seen(bootstrap: str, tls: dict[str, Any]) -> set[str] | str:
    """The topics a librdkafka admin client lists through the proxy, or its error."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2, **tls})  # refusals are expected
    try:
        return set(admin.list_topics(timeout=8).topics)
    except KafkaException as exc:
        return str(exc)


@pytest.mark.timeout(240)
def test_client_certificate_principal_held_to_its_user_quota(
    tls_cluster: KafkaCluster, pki: Pki, tmp_path: Path
) -> None:
    """alice and bob connect with certificates of the same CA; the subject maps to their names,
    alice's user quota holds her, bob (no quota) is not slowed; the broker link is TLS with the
    proxy's own client certificate, and what was produced is all there."""
    topics = {name: f"tls-{name}-{uuid.uuid4().hex[:6]}" for name in ("alice", "bob")}
    for topic in topics.values():
        tls_cluster.create_topic(topic)
    cfg = _proxy_config(tls_cluster, pki, pki.proxy_server)
    cfg["quotas"]["window"] = {"num": WINDOWS, "size_seconds": WINDOW_SIZE_S}
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        stop = threading.Event()
        acked: dict[str, list[tuple[float, int]]] = {"alice": [], "bob": []}
        workers = [
            threading.Thread(
                target=steady_producer,
                args=(proxy.bootstrap, topics[name], "app", 4 * ALICE_QUOTA, stop, acked[name]),
                kwargs={"extra": {**_client_tls(pki, cert), **QUEUE}, "value_size": 4 * KiB},
                daemon=True,
            )
            for name, cert in (("alice", pki.alice), ("bob", pki.bob))
        ]
        start = time.monotonic()
        for worker in workers:
            worker.start()
        time.sleep(RUN_SECONDS)
        stop.set()
        for worker in workers:
            worker.join(60)
        state = json.loads(proxy.admin_get("/quotas/entity?user=alice&client_id=app")[1])
    alice = steady_rate(_cumulative(acked["alice"], start), STEADY_FROM, RUN_SECONDS, cycle=CYCLE)
    bob = steady_rate(_cumulative(acked["bob"], start), STEADY_FROM, RUN_SECONDS, cycle=CYCLE)
    assert abs(alice - ALICE_QUOTA) / ALICE_QUOTA < 0.2, f"alice: {alice / KiB:.0f} KiB/s, quota 256"
    assert bob > 2.5 * ALICE_QUOTA, f"bob, who has no quota, got only {bob / KiB:.0f} KiB/s"
    assert state["producer_byte_rate"]["level"] == 3  # the user quota, matched by the mapped name
    # Every acknowledged message is on the broker (read directly, not through the proxy).
    for name, topic in topics.items():
        sampler = OffsetSampler(tls_cluster, topic)
        try:
            sampler.sample_until(time.monotonic(), 0.01)
        finally:
            sampler.close()
        assert sampler.samples[-1][1] == len(acked[name])


def _cumulative(acked: list[tuple[float, int]], start: float) -> list[tuple[float, float]]:
    """(seconds since start, bytes acknowledged so far), from t=0."""
    out, total = [(0.0, 0.0)], 0.0
    for at, size in sorted(acked):
        total += size
        out.append((at - start, total))
    return out


@pytest.mark.timeout(120)
def test_wrong_or_missing_certificate_refused(tls_cluster: KafkaCluster, pki: Pki, tmp_path: Path) -> None:
    """A certificate from another CA (claiming to be alice), or none, does not get through; a good
    one does, on the same proxy at the same time."""
    with ProxyProcess(_proxy_config(tls_cluster, pki, pki.proxy_server), workdir=tmp_path) as proxy:
        # The three clients side by side: a refused one waits out its whole timeout.
        with ThreadPoolExecutor(3) as pool:
            refused, missing, seen = pool.map(
                lambda cert: _topics_seen(proxy.bootstrap, _client_tls(pki, cert)),
                (pki.mallory, None, pki.alice),
            )
        assert isinstance(refused, str), f"a rogue CA's certificate was let in: {refused}"
        assert isinstance(missing, str), f"a client without a certificate was let in: {missing}"
        assert isinstance(seen, set), f"alice's good certificate was refused: {seen}"
        # Python's TLS client: the handshake itself fails with the rogue certificate.
        context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
        context.load_cert_chain(str(pki.mallory.cert), str(pki.mallory.key))
        host, port = proxy.bootstrap.split(":")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _handshake_and_read(context, host, int(port))
        # The operator sees the refusals: counted and logged (the good handshakes are not).
        assert proxy.metric("kthrottle_tls_handshake_failures_total") >= 3
        assert "client TLS handshake failed" in proxy.log_text()


def _handshake_and_read(context: ssl.SSLContext, host: str, port: int) -> None:
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        conn.settimeout(5)
        # TLS 1.3 reports a refused client certificate on the first read after the handshake.
        if not conn.recv(1):
            raise ConnectionError("closed by the server")


def _server_serial(pki: Pki, port: int) -> int:
    context = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    context.load_cert_chain(str(pki.alice.cert), str(pki.alice.key))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return serial_of(ssl.DER_cert_to_PEM_cert(der).encode())


@pytest.mark.timeout(120)
def test_rotated_server_certificate_serves_new_connections_without_restart(
    tls_cluster: KafkaCluster, pki: Pki, tmp_path: Path
) -> None:
    certs = tmp_path / "server-tls"
    certs.mkdir()
    live = CertFiles(certs / "tls.crt", certs / "tls.key")
    shutil.copy(pki.proxy_server.cert, live.cert)
    shutil.copy(pki.proxy_server.key, live.key)
    cfg = _proxy_config(tls_cluster, pki, live, reload_check_seconds=0.5)
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        port = int(proxy.bootstrap.split(":")[1])
        before = _server_serial(pki, port)
        assert before == serial_of(pki.proxy_server.cert.read_bytes())
        pid = proxy.proc.pid if proxy.proc else None

        rotated = pki.ca.issue("proxy-server-2", "proxy", dns=("localhost",), ips=("127.0.0.1",))
        for src, dst in ((rotated.cert, live.cert), (rotated.key, live.key)):  # each file atomically
            tmp = dst.with_suffix(".new")
            shutil.copy(src, tmp)
            os.replace(tmp, dst)
        want = serial_of(rotated.cert.read_bytes())
        deadline = time.monotonic() + 20
        serial = before
        while serial != want and time.monotonic() < deadline:
            time.sleep(0.25)
            serial = _server_serial(pki, port)
        assert serial == want, f"still serving the old certificate:\n{proxy.log_tail()}"
        assert proxy.proc is not None and proxy.proc.pid == pid and proxy.proc.poll() is None
        # Kafka clients connect and work with the new certificate.
        seen = _topics_seen(proxy.bootstrap, _client_tls(pki, pki.bob))
        assert isinstance(seen, set), seen
        assert "reloaded for new connections" in proxy.log_text()


# --- SNI routing ---------------------------------------------------------------------------------------


def _can_remap_hosts() -> bool:
    return sys.platform == "linux" and os.geteuid() == 0 and shutil.which("unshare") is not None


SNI_CLIENT = r"""
import json, sys
from confluent_kafka import Producer
cfg = json.loads(sys.argv[1])
topic, count = sys.argv[2], int(sys.argv[3])
acked = {}
def done(err, msg):
    if err is None:
        acked[msg.partition()] = acked.get(msg.partition(), 0) + 1
    else:
        print("error", err, file=sys.stderr)
p = Producer(cfg)
for i in range(count):
    p.produce(topic, b"m%d" % i, partition=i % 3, on_delivery=done)
    p.poll(0)
p.flush(60)
brokers = p.list_topics(timeout=10).brokers.values()
print(json.dumps({"acked": acked, "brokers": sorted(str(b) for b in brokers)}))
"""


@pytest.mark.timeout(180)
def test_sni_routes_each_broker_name_through_one_port(
    kafka_cluster3: KafkaCluster, pki: Pki, tmp_path: Path
) -> None:
    """One TLS port for the whole cluster: clients are told b1/b2/b3.kafka.test on that port, DNS
    (here the client's own /etc/hosts) sends every name to the proxy, and the server name in each
    handshake picks the broker. A produce to a partition only succeeds at its leader, so messages
    acknowledged on partitions led by three brokers show each name reached its own broker."""
    if not _can_remap_hosts():
        unavailable("needs root and unshare to give the client its own /etc/hosts")
    topic = f"sni-{uuid.uuid4().hex[:6]}"
    kafka_cluster3.create_topic(topic, partitions=3, replication=1)
    cfg = gateway_config(kafka_cluster3)
    cfg["gateway"]["broker_ports"] = {}
    cfg["gateway"]["sni"] = {
        "enabled": True,
        "bootstrap_host": "kafka.test",
        "broker_host_template": "b{node_id}.kafka.test",
    }
    cfg["tls"] = {
        "enabled": True,
        "certfile": str(pki.proxy_server.cert),
        "keyfile": str(pki.proxy_server.key),
    }
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost kafka.test b1.kafka.test b2.kafka.test b3.kafka.test\n")
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        assert set(proxy.ports) == {"bootstrap"}, f"SNI mode opened per-broker ports: {proxy.ports}"
        port = proxy.ports["bootstrap"]
        client_cfg = {
            "bootstrap.servers": f"kafka.test:{port}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca.cert_path),
            "ssl.endpoint.identification.algorithm": "https",
            "acks": "all",
        }
        script = f'mount --bind {hosts} /etc/hosts && exec "$0" -c "$1" "$2" "$3" "$4"'
        run = subprocess.run(
            [
                "unshare",
                "--mount",
                "sh",
                "-c",
                script,
                sys.executable,
                SNI_CLIENT,
                json.dumps(client_cfg),
                topic,
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, f"{run.stderr}\n{proxy.log_tail()}"
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert {int(k): v for k, v in result["acked"].items()} == {0: 20, 1: 20, 2: 20}, run.stderr
        assert result["brokers"] == sorted(f"b{n}.kafka.test:{port}/{n}" for n in (1, 2, 3))
        # The proxy itself could not be reached by a name it does not serve.
        text = proxy.log_text()
        assert "names neither" not in text


def _java_tls_props(tmp_path: Path, pki: Pki, name: str, cert: CertFiles) -> Path:
    """A Java client's TLS settings with ``cert`` as its certificate (Kafka's PEM key store)."""
    keystore = tmp_path / f"{name}-keystore.pem"
    keystore.write_bytes(cert.key.read_bytes() + cert.cert.read_bytes())
    props = tmp_path / f"{name}.properties"
    props.write_text(
        "security.protocol=SSL\nssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca.cert_path}\nssl.keystore.type=PEM\nssl.keystore.location={keystore}\n"
    )
    return props


@pytest.mark.timeout(180)
def test_certificate_principal_as_quota_admin(tls_cluster: KafkaCluster, pki: Pki, tmp_path: Path) -> None:
    """The quota Admin API's admins are matched by certificate principals too: the Java admin
    client with alice's certificate alters a quota through the proxy; with bob's it is refused."""
    from tests.integration.test_quota_api import _java_admin, _wait_store_ready

    topic = f"__kthrottle_quotas_tls_{uuid.uuid4().hex[:6]}"
    cfg = _proxy_config(tls_cluster, pki, pki.proxy_server)
    cfg["quota_api"] = {"mode": "proxy", "admins": ["User:alice"], "topic": topic}
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        alice = _java_tls_props(tmp_path, pki, "alice", pki.alice)
        bob = _java_tls_props(tmp_path, pki, "bob", pki.bob)
        _wait_store_ready(proxy, topic)
        assert _java_admin(proxy.bootstrap, alice, "alter", "user=carol", "producer_byte_rate=4096") == [
            "RESULT OK"
        ]
        refused = _java_admin(proxy.bootstrap, bob, "alter", "user=carol", "producer_byte_rate=1")
        assert refused == ["RESULT ClusterAuthorizationException Cluster authorization failed."]
        assert _java_admin(proxy.bootstrap, bob, "describe", "user=carol") == [
            "ENTITY user=carol VALUES producer_byte_rate=4096.0"
        ]
