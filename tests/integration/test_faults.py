"""Faults against the real broker and cluster (issue 8): a broker killed and restarted, a leader
moved, the proxy itself killed and restarted, a broker paused (SIGSTOP, as a network cut would
look to its peers), each under produce and consume load through the proxy; and an upstream that
accepts and never answers (the one fake here: a listener in the test).

What each test asserts is what a user would see: every message the producer was told was acked
is in the log exactly once and was consumed, clients got their own timeout errors, and the
proxy holds no connection once the client has gone. No timing is a pass/fail criterion.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dev.harness import free_port
from dev.proxy_process import ProxyProcess
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import SIZE, RequestHeader, encode_request_header, encode_response_header

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def _wait_for(condition: Callable[[], bool], timeout: float, what: Callable[[], str] | str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` (a message or a function giving one)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(0.2)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# --- an upstream that accepts and never answers --------------------------------------------------


@dataclass
class _HoleConn:
    sock: socket.socket
    client_id: str | None = None  # from the first request's header
    eof: threading.Event = field(default_factory=threading.Event)


class BlackHole:
    """Accepts connections and answers nothing, except the proxy's own broker discovery (a
    Metadata request from client id ``kthrottle``), which it answers naming itself node 1, so
    the proxy is ready and does not keep probing. Reads each client connection to its end
    (``reads=True``, recording the EOF), or stops reading after its first request."""

    def __init__(self, reads: bool = True) -> None:
        self.reads = reads
        self.listener = socket.create_server(("127.0.0.1", 0))
        if not reads:  # small buffers: a few MiB the proxy sends stay in the proxy
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.port: int = self.listener.getsockname()[1]
        self.conns: list[_HoleConn] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = _HoleConn(sock)
            with self._lock:
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _serve(self, conn: _HoleConn) -> None:
        sock = conn.sock
        try:
            head = self._read_exactly(sock, 4)
            frame = self._read_exactly(sock, SIZE.unpack(head)[0]) if head else None
            if frame is None:
                conn.eof.set()
                return
            api_key, version, correlation_id, id_len = struct.unpack_from(">hhih", frame)
            conn.client_id = frame[10 : 10 + id_len].decode() if id_len >= 0 else ""
            if conn.client_id == "kthrottle" and api_key == ApiKey.METADATA:
                body = {
                    "throttle_time_ms": 0,
                    "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port, "rack": None}],
                    "cluster_id": "black-hole",
                    "controller_id": 1,
                    "topics": [],
                }
                payload = encode_response_header(api_key, version, correlation_id)
                payload += messages.encode_response(api_key, version, body)
                sock.sendall(SIZE.pack(len(payload)) + payload)
            if not self.reads:
                return  # never read again (the socket stays open: closed at stop())
            while sock.recv(65536):
                pass
            conn.eof.set()
        except OSError:
            conn.eof.set()  # a reset is the end of the connection too

    def of(self, client_id: str) -> list[_HoleConn]:
        with self._lock:
            return [c for c in self.conns if c.client_id == client_id]

    def drain(self, conn: _HoleConn, timeout: float) -> bool:
        """Read a connection that was never read to its end; True if it ended (EOF or reset)."""
        conn.sock.settimeout(timeout)
        try:
            while conn.sock.recv(1 << 20):
                pass
        except TimeoutError:
            return False
        except OSError:
            pass
        return True

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        with self._lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.sock.close()


@pytest.fixture
def black_hole_proxy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[BlackHole, ProxyProcess]]:
    hole = BlackHole(reads=getattr(request, "param", True))
    cfg = {
        "mode": "sidecar",
        "bind_host": "127.0.0.1",
        "sidecar": {"listen_port": free_port(), "upstream": f"127.0.0.1:{hole.port}"},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "connect_timeout_seconds": 5,
        "metadata_refresh_seconds": 3600,
        "drain_seconds": 1,
    }
    try:
        with ProxyProcess(cfg, workdir=tmp_path) as proxy:
            status, body = proxy.admin_get("/readyz")
            assert status == 200, f"the black hole's discovery answer did not make the proxy ready: {body}"
            yield hole, proxy
    finally:
        hole.close()


def _assert_nothing_held(proxy: ProxyProcess, baseline_fds: int, what: str) -> None:
    assert proxy.proc is not None
    pid = proxy.proc.pid
    _wait_for(
        lambda: proxy.metric("kthrottle_connections_active") == 0,
        30,
        lambda: f"{what}: connection gauge stays at {proxy.metric('kthrottle_connections_active')}",
    )
    _wait_for(
        lambda: _fd_count(pid) <= baseline_fds,
        30,
        lambda: f"{what}: proxy holds {_fd_count(pid)} fds, {baseline_fds} before the client came",
    )
    assert proxy.proc.poll() is None, f"the proxy died:\n{proxy.log_tail()}"


@pytest.mark.timeout(150)
def test_upstream_that_never_answers_times_out_on_the_clients_own_timeout(
    black_hole_proxy: tuple[BlackHole, ProxyProcess],
) -> None:
    """librdkafka and kafka-python each get their own timeout error through the proxy; once they
    have gone, every upstream connection the proxy opened for them is closed (the black hole sees
    EOF), the connection gauge is back to 0 and the proxy's fd count back to where it was."""
    from confluent_kafka import KafkaError, Producer
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    hole, proxy = black_hole_proxy
    assert proxy.proc is not None
    baseline_fds = _fd_count(proxy.proc.pid)

    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "client.id": "hole-librdkafka",
            "message.timeout.ms": 6000,
            "socket.timeout.ms": 3000,
            "api.version.request.timeout.ms": 3000,
        }
    )
    producer.produce("t", b"into the void", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(60) == 0, "librdkafka never reported the message's fate"
    assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT], f"librdkafka got {errors}"
    assert hole.of("hole-librdkafka"), "librdkafka's requests never reached the upstream"
    producer.close()
    del producer

    kp = KafkaProducer(
        bootstrap_servers=proxy.bootstrap,
        client_id="hole-kafka-python",
        api_version=(3, 0, 0),  # no probe: the first request is the Metadata the send waits for
        max_block_ms=4000,
        request_timeout_ms=3000,
    )
    try:
        with pytest.raises(KafkaTimeoutError):
            kp.send("t", b"into the void").get(timeout=30)
    finally:
        kp.close(timeout=5)
    assert hole.of("hole-kafka-python"), "kafka-python's requests never reached the upstream"

    for client_id in ("hole-librdkafka", "hole-kafka-python"):
        _wait_for(
            lambda cid=client_id: all(c.eof.is_set() for c in hole.of(cid)),  # type: ignore[misc]
            30,
            lambda cid=client_id: (  # type: ignore[misc]
                f"{sum(not c.eof.is_set() for c in hole.of(cid))} of {len(hole.of(cid))} upstream "
                f"connections for {cid} still open after the client left"
            ),
        )
    _assert_nothing_held(proxy, baseline_fds, "after the clients left")


def _request_frame(api_key: int, version: int, correlation_id: int, client_id: str, body: bytes) -> bytes:
    payload = encode_request_header(RequestHeader(api_key, version, correlation_id, client_id, 0)) + body
    return SIZE.pack(len(payload)) + bytes(payload)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("black_hole_proxy", [False], indirect=True)
def test_upstream_that_stops_reading_is_released_when_the_client_leaves(
    black_hole_proxy: tuple[BlackHole, ProxyProcess],
) -> None:
    """The upstream stops reading (a hung broker), a client sends MiBs of requests until the
    proxy stops reading it (backpressure), then gives up and resets its connection: the proxy
    notices although it is not reading that client, and drops the upstream connection with its
    unsendable bytes instead of waiting forever for them to drain.

    (A client that closes gently with bytes still unsent is seen the same way once its kernel
    gives up on the orphaned socket and resets it; the reset here makes that immediate.)"""
    hole, proxy = black_hole_proxy
    assert proxy.proc is not None
    baseline_fds = _fd_count(proxy.proc.pid)
    client = socket.create_connection(("127.0.0.1", proxy.ports["sidecar"]), timeout=10)
    client.sendall(_request_frame(ApiKey.API_VERSIONS, 0, 0, "hole-raw", b""))
    _wait_for(lambda: bool(hole.of("hole-raw")), 30, "the client's first request never reached the upstream")
    # Metadata requests the proxy forwards byte for byte, 1 MiB each: the upstream reads none.
    frame = _request_frame(ApiKey.METADATA, 12, 1, "hole-raw", b"\x00" * MiB)
    client.settimeout(3)
    sent = 0
    with contextlib.suppress(TimeoutError):
        for _ in range(24):
            client.sendall(frame)
            sent += len(frame)
    assert sent >= 4 * MiB, f"only {sent} bytes went into the proxy"
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset
    _assert_nothing_held(proxy, baseline_fds, "after the client left a hung upstream")
    (conn,) = hole.of("hole-raw")
    assert hole.drain(conn, 30), "the proxy's upstream connection never ended"
