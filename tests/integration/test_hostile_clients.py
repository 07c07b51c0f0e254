"""Clients that misbehave on purpose, against the real broker: a reader that never reads, and a
user rotating client ids to dodge its quota. (Issue 8; the bytes of the reader that never reads
are built by hand because no well-behaved client library sends them that way.)"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proc import rss_bytes
from dev.proxy_process import ProxyProcess, gateway_config
from protocol import messages
from protocol.frames import SIZE, RequestHeader, encode_request_header
from tests.integration.clients import kafka_python_roundtrip
from tests.integration.clients import messages as make_messages
from tests.integration.conftest import SASL_USERS
from tests.integration.test_quotas import OffsetSampler, steady_rate

pytestmark = pytest.mark.integration

KiB, MiB = 1024, 1024 * 1024


def _fetch_frame(topic: str, correlation_id: int, max_bytes: int) -> bytes:
    body = {
        "replica_id": -1,
        "max_wait_ms": 100,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": max_bytes,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    payload = encode_request_header(RequestHeader(1, 12, correlation_id, "never-reads", 0))
    payload += messages.encode(1, 12, body, response=False)
    return SIZE.pack(len(payload)) + bytes(payload)


@pytest.mark.timeout(240)
def test_reader_that_never_reads_holds_bounded_memory_and_others_go_on(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    """100 fetches of 8 MiB each (800 MiB asked for) from a client that never reads its socket:
    the proxy stops reading the broker for it once its write buffer is full, so the proxy's
    memory grows by about one response and the buffer, not by what was asked; another client
    produces and consumes through the same proxy meanwhile."""
    topic = f"slow-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    kafka_broker.fill_topic(topic, 48 * 1024, 1024)  # 48 MiB to fetch, many times over
    with ProxyProcess(gateway_config(kafka_broker), workdir=tmp_path) as proxy:
        assert proxy.proc is not None
        host, port = proxy.bootstrap.split(":")
        before = rss_bytes(proxy.proc.pid)
        with socket.create_connection((host, int(port)), timeout=30) as hostile:
            hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KiB)
            hostile.sendall(b"".join(_fetch_frame(topic, i, 8 * MiB) for i in range(100)))
            peak = before
            for _ in range(20):  # 10 s of not reading
                time.sleep(0.5)
                peak = max(peak, rss_bytes(proxy.proc.pid))
            other = f"bystander-{uuid.uuid4().hex[:6]}"
            sent = make_messages(200, "bystander")
            got = kafka_python_roundtrip(proxy.bootstrap, other, sent)
            assert sorted(got) == sorted(sent)
            peak = max(peak, rss_bytes(proxy.proc.pid))
        growth = peak - before
        print(f"slow reader: proxy RSS grew {growth / MiB:.1f} MiB")
        assert growth < 64 * MiB, f"proxy grew by {growth / MiB:.0f} MiB for a client that reads nothing"
        assert proxy.proc.poll() is None


USERS = SASL_USERS
QUOTA = 256 * KiB
WINDOWS, WINDOW_SIZE_S = 5, 0.5  # a 2.5 s quota cycle: each rotation (2 s) lands inside the last one's
CYCLE = WINDOWS * WINDOW_SIZE_S
STEADY_FROM, RUN_SECONDS = 4.0, 14.0


@pytest.fixture(scope="module")
def sasl_cluster(kafka_sasl_broker: KafkaCluster) -> KafkaCluster:
    return kafka_sasl_broker


@pytest.mark.timeout(240)
def test_rotating_client_ids_do_not_dodge_a_user_quota(sasl_cluster: KafkaCluster, tmp_path: Path) -> None:
    """alice opens a new producer with a new client id every two seconds, each offering four
    times her quota: her user quota is one bucket across her client ids (KIP-55 level 3), so
    the rate the broker receives stays at the quota."""
    topic = f"rotate-{uuid.uuid4().hex[:6]}"
    sasl_cluster.create_topic(topic)
    cfg = gateway_config(sasl_cluster)
    cfg["gateway"]["upstream_bootstrap"] = sasl_cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "alice", "password": USERS["alice"]}
    cfg["quotas"] = {
        "window": {"num": WINDOWS, "size_seconds": WINDOW_SIZE_S},
        "users": {"alice": {"producer_byte_rate": QUOTA}},
    }
    from confluent_kafka import Producer

    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        stop = threading.Event()

        def rotate() -> None:
            payload = b"r" * 4096
            n = 0
            while not stop.is_set():
                producer = Producer(
                    {
                        "bootstrap.servers": proxy.bootstrap,
                        "security.protocol": "SASL_PLAINTEXT",
                        "sasl.mechanism": "PLAIN",
                        "sasl.username": "alice",
                        "sasl.password": USERS["alice"],
                        "client.id": f"rotating-{n}",
                        "linger.ms": 5,
                        "batch.size": 16384,
                    }
                )
                began, queued = time.monotonic(), 0
                while not stop.is_set() and time.monotonic() - began < 2.0:
                    if queued > 4 * QUOTA * (time.monotonic() - began):
                        producer.poll(0.01)
                        continue
                    try:
                        producer.produce(topic, payload)
                        queued += len(payload)
                    except BufferError:
                        producer.poll(0.05)
                    producer.poll(0)
                producer.flush(10)
                n += 1

        sampler = OffsetSampler(sasl_cluster, topic)
        worker = threading.Thread(target=rotate, daemon=True)
        start = time.monotonic()
        worker.start()
        try:
            sampler.sample_until(start, RUN_SECONDS, every=0.25)
        finally:
            stop.set()
            worker.join(60)
            sampler.close()
    rate = steady_rate([(t, n * 4096) for t, n in sampler.samples], STEADY_FROM, RUN_SECONDS, cycle=CYCLE)
    print(f"rotating client ids: {rate / KiB:.0f} KiB/s")
    assert abs(rate - QUOTA) / QUOTA < 0.25, f"{rate / KiB:.0f} KiB/s with rotating client ids, quota 256"
