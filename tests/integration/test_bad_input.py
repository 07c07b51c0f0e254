"""Hostile or broken input closes only the connection that sent it, with a log line; a real client
on another connection keeps producing and consuming through the same proxy throughout."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster) -> Iterator[ProxyProcess]:
    with ProxyProcess(gateway_config(kafka_broker)) as proc:
        yield proc


def _header(api_key: int, version: int, correlation_id: int = 7, client_id: bytes = b"bad") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id


def _closed_by_proxy(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True once the proxy closed the connection (EOF or reset) without sending a response."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return data == b""


def _wait_log(proxy: ProxyProcess, needle: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proxy.log_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line containing {needle!r}:\n{proxy.log_tail()}")


CASES = {
    # name: (bytes to send, whether the client then hangs up, expected log text)
    "size-2GiB": (struct.pack(">I", 0x7FFFFFFF) + b"\x00" * 64, False, "exceeds max_frame_bytes"),
    "size-negative": (struct.pack(">I", 0x80000000) + b"\x00" * 64, False, "negative frame size"),
    "too-short-for-header": (struct.pack(">i", 4) + b"\x00\x03\x00\x01", False, "too short for a header"),
    "unknown-api-key": (
        (lambda p: struct.pack(">i", len(p)) + p)(_header(999, 0) + b"\x00" * 8),
        False,
        "unknown api key 999",
    ),
    "garbage-after-produce-header": (
        (lambda p: struct.pack(">i", len(p)) + p)(_header(0, 9) + b"\x00" + b"\xff" * 40),
        False,
        "malformed Produce v9 request",
    ),
    "garbage-after-passthrough-header": (
        # ListOffsets is forwarded untouched; the broker refuses it and the proxy closes the client.
        (lambda p: struct.pack(">i", len(p)) + p)(_header(2, 7) + b"\x00" + b"\xff" * 40),
        False,
        "upstream",
    ),
    "disconnect-mid-frame": (struct.pack(">i", 1000) + _header(3, 12) + b"\x00" * 10, True, "mid-frame"),
}


@pytest.mark.timeout(240)
def test_bad_input_closes_only_that_connection(proxy: ProxyProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"bad-input-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all", enable_idempotence=True)
    for name, (payload, hang_up, log_text) in CASES.items():
        bad = socket.create_connection(("127.0.0.1", proxy.ports["bootstrap"]), timeout=10)
        bad.sendall(payload)
        if hang_up:
            bad.close()
        else:
            assert _closed_by_proxy(bad), f"{name}: proxy kept the connection open"
            bad.close()
        line = _wait_log(proxy, log_text)
        assert "closed" in line, line
        # The well-behaved client on its own connection is unaffected.
        producer.send(topic, key=name.encode(), value=b"after " + name.encode()).get(timeout=30)
    producer.close()

    consumer = KafkaConsumer(topic, bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest")
    keys: set[str] = set()
    deadline = time.monotonic() + 30  # until every case's record is in, not 5 s of silence after them
    while keys != set(CASES) and time.monotonic() < deadline:
        keys |= {r.key.decode() for records in consumer.poll(timeout_ms=500).values() for r in records}
    consumer.close()
    assert keys == set(CASES)
    assert proxy.metric("kthrottle_rejected_frames_total") >= len(CASES) - 2
    status, _ = proxy.admin_get("/healthz")
    assert status == 200
