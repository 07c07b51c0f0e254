"""Start, stop and failure behaviour of the proxy process: sidecar mode, drain on SIGTERM,
upstream down or dropping, readiness, and config errors refused at load."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from dev.harness import KafkaCluster, free_port
from dev.proxy_process import REPO, DrainSummary, ProxyProcess, gateway_config, sidecar_config
from dev.waiting import wait_until
from tests.integration.clients import (
    assert_same_messages,
    close_kafka_python_producer,
    kafka_python_roundtrip,
    messages,
)

pytestmark = pytest.mark.integration


def _api_versions_request() -> bytes:
    payload = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    return struct.pack(">i", len(payload)) + payload


@pytest.mark.timeout(120)
def test_sidecar_mode(kafka_broker: KafkaCluster) -> None:
    with ProxyProcess(sidecar_config(kafka_broker)) as proxy:
        msgs = messages(200, "sidecar")
        assert_same_messages(
            msgs, kafka_python_roundtrip(proxy.bootstrap, f"sc-{uuid.uuid4().hex[:6]}", msgs)
        )
        from tests.integration.clients import kafka_python_brokers_seen

        assert {port for _h, port in kafka_python_brokers_seen(proxy.bootstrap)} == {proxy.ports["sidecar"]}


def _dead_upstream_config(dead: str) -> dict[str, object]:
    """A gateway whose one upstream address (``dead``) has nothing listening."""
    return {
        "mode": "gateway",
        "gateway": {
            "bootstrap_port": free_port(),
            "broker_port_base": None,
            "broker_ports": {1: free_port()},
            "upstream_bootstrap": [dead],
        },
        "admin": {"port": free_port()},
        "connect_timeout_seconds": 2,
    }


@pytest.mark.timeout(120)
def test_upstream_down_closes_client_never_hangs(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    cfg = _dead_upstream_config(dead)
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        status, body = proxy.admin_get("/readyz")
        assert status == 503 and '"upstream_reachable": false' in body
        sock = socket.create_connection(("127.0.0.1", proxy.ports["bootstrap"]), timeout=10)
        sock.sendall(_api_versions_request())
        started = time.monotonic()
        assert sock.recv(100) == b""  # closed, well before the socket timeout
        assert time.monotonic() - started < 8
        sock.close()

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # A real client gets its own timeout error (the proxy closes each attempt at once).
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=5)
        assert "no upstream broker reachable" in proxy.log_text()
        assert proxy.metric("kthrottle_upstream_errors_total", {"kind": "connect"}) >= 1


@pytest.mark.timeout(120)
def test_clients_reconnecting_to_a_dead_broker_are_held_with_backoff(tmp_path: Path) -> None:
    """Clients that reconnect at once whenever the proxy closes them (as one that resets its
    backoff on a successful connect does): each is still closed, never left hanging, but the
    proxy connects to the dead broker about once per backoff step, not once per client
    connection, and says so in one log line, not one per connect."""
    dead = f"127.0.0.1:{free_port()}"
    cfg = _dead_upstream_config(dead)
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        closed: list[float] = []
        hung: list[str] = []
        end = time.monotonic() + 4

        def reconnect_loop() -> None:
            while time.monotonic() < end:
                with socket.create_connection(("127.0.0.1", proxy.ports["bootstrap"]), timeout=10) as sock:
                    sock.sendall(_api_versions_request())
                    started = time.monotonic()
                    try:
                        if sock.recv(100) == b"":
                            closed.append(time.monotonic() - started)
                    except OSError as exc:
                        hung.append(repr(exc))
                        return

        threads = [threading.Thread(target=reconnect_loop) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        connects = proxy.metric("kthrottle_upstream_errors_total", {"kind": "connect"})
        log = proxy.log_text()
    assert not hung
    assert len(closed) >= 12 and max(closed) < 2.5  # each closed after at most the ceiling
    # 4 s of four clients: a few rounds of the doubling wait (50 ms .. 1 s), four connects each.
    # Without the backoff each refused connect is immediate: thousands in 4 s.
    assert 4 <= connects <= 60, connects
    assert log.count(f"upstream {dead} unreachable") == 1, log[-3000:]
    # The clients' closes: a few lines and a count of the rest, not one line each.
    assert log.count("no upstream broker reachable") <= 6 < len(closed), log[-3000:]


@pytest.mark.timeout(180)
def test_upstream_drop_closes_client(tmp_path: Path) -> None:
    with (
        KafkaCluster(brokers=1, workdir=tmp_path / "kafka") as cluster,
        ProxyProcess(gateway_config(cluster), workdir=tmp_path / "proxy") as proxy,
    ):
        sock = socket.create_connection(("127.0.0.1", proxy.ports["bootstrap"]), timeout=30)
        sock.sendall(_api_versions_request())
        (size,) = struct.unpack(">i", sock.recv(4))
        assert size > 0
        remaining = size
        while remaining:
            remaining -= len(sock.recv(remaining))
        cluster.stop_node(1, kill=True)
        assert sock.recv(100) == b""
        sock.close()
        deadline = time.monotonic() + 10
        while "closed the connection" not in proxy.log_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "upstream" in proxy.log_text() and "closed the connection" in proxy.log_text()


@pytest.mark.timeout(180)
def test_sigterm_drains_and_exits(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    proxy = ProxyProcess(gateway_config(kafka_broker, drain_seconds=5), workdir=tmp_path).start()
    topic = f"drain-{uuid.uuid4().hex[:6]}"
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", retries=0)
    acked: list[int] = []
    failed: list[int] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            fut = producer.send(topic, value=str(i).encode())
            fut.add_callback(lambda _md, i=i: acked.append(i))
            fut.add_errback(lambda _exc, i=i: failed.append(i))
            i += 1
            time.sleep(0.002)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    # Requests in flight when SIGTERM lands: wait until the producer is well under way.
    wait_until(lambda: len(acked) >= 200, 60, lambda: f"only {len(acked)} acked, {failed[:3]} failed")
    assert proxy.proc is not None
    began = time.monotonic()
    proxy.proc.send_signal(signal.SIGTERM)
    code = proxy.proc.wait(30)
    took = time.monotonic() - began
    stop.set()
    worker.join(5)
    close_kafka_python_producer(producer)  # records sent after the proxy left cannot be delivered
    assert code == 0
    assert took < 5 + 5
    assert acked, "nothing was produced before shutdown"
    log = proxy.log_text()
    assert "shutting down" in log and "stopped" in log
    drain = DrainSummary.from_log(log)
    # The producer's connections were open, and each closed after its last answer: none cut.
    assert drain.connections >= 1 and drain.answered == drain.connections, drain
    assert drain.cut == 0 and drain.unanswered == 0, drain
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.ports["bootstrap"]), timeout=2)


def test_bad_config_is_refused_with_line_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "mode: gateway\ngateway:\n  bootstrap_port: 99999\n  upstream_bootstrap: [localhost:9092]\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"{bad}:3: gateway.bootstrap_port" in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text("mode: sidecar\nsidecar: {upstream: '127.0.0.1:9093'}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(good)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_check_config_prints_the_effective_quotas(tmp_path: Path) -> None:
    cfg = tmp_path / "kthrottle.yaml"
    cfg.write_text(
        "gateway: {upstream_bootstrap: ['127.0.0.1:9092']}\nquotas_file: quotas.yaml\n"
        "tls: {enabled: true, certfile: s.crt, keyfile: s.key, cafile: ca.crt, client_auth: required}\n"
    )
    (tmp_path / "quotas.yaml").write_text("quotas:\n  users:\n    alice: {producer_byte_rate: 1048576}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    first, _, rest = proc.stdout.partition("\n")
    assert "clients over TLS (client certificates required)" in first
    printed = yaml.safe_load(rest)
    assert printed["quotas"]["users"] == {"alice": {"producer_byte_rate": 1048576}}


def test_certificate_files_that_do_not_load_refuse_the_start(tmp_path: Path) -> None:
    cfg = tmp_path / "kthrottle.yaml"
    missing = tmp_path / "missing.crt"
    cfg.write_text(
        "mode: sidecar\nsidecar: {upstream: '127.0.0.1:9093', listen_port: 0}\nadmin: {enabled: false}\n"
        f"tls: {{enabled: true, certfile: {missing}, keyfile: {tmp_path / 'missing.key'}}}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "run", "--config", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert str(missing) in proc.stderr and "do not load" in proc.stderr
