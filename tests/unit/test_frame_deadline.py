"""A slowloris (a request frame trickling in a byte at a time) is closed once its frame has been
arriving for client_frame_timeout_seconds, counted as a rejected frame; a connection idle between
frames, and a frame the proxy itself stopped reading (a throttle mute), are left alone."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest

from proxy.pipeline.flow import ConnectionFlow
from proxy.server import ProxyServer
from tests.unit.conftest import StubUpstream, proxy_in_front_of, recv_exactly

TIMEOUT = 0.4


def _list_offsets_request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 2, 5, correlation_id, 2) + b"fd" + b"\x00" * 16
    return struct.pack(">i", len(payload)) + payload


@pytest.fixture
def proxy() -> Iterator[tuple[int, ProxyServer]]:
    stub = StubUpstream()
    with proxy_in_front_of(stub.handle, f"client_frame_timeout_seconds: {TIMEOUT}\n") as (
        _loop,
        port,
        server,
    ):
        yield port, server


def _timeouts(server: ProxyServer) -> float:
    return server.metrics.rejected_frames.labels("frame-timeout")._value.get()  # type: ignore[no-any-return]


@pytest.mark.timeout(30)
def test_a_trickling_frame_is_closed_and_counted(proxy: tuple[int, ProxyServer]) -> None:
    port, server = proxy
    frame = _list_offsets_request(1)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        closed = False
        for byte in frame:  # a byte every 50 ms: the frame would take 0.7 s in all
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
        if not closed:
            sock.settimeout(10)
            assert sock.recv(100) == b"", "the slowloris got an answer"
    assert _timeouts(server) == 1


@pytest.mark.timeout(30)
def test_idle_between_frames_and_whole_frames_are_left_alone(proxy: tuple[int, ProxyServer]) -> None:
    port, server = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for correlation_id in range(3):
            sock.sendall(_list_offsets_request(correlation_id))
            (size,) = struct.unpack(">i", recv_exactly(sock, 4))
            assert struct.unpack(">i", recv_exactly(sock, size)[:4])[0] == correlation_id
            time.sleep(3 * TIMEOUT)  # idle between frames: no deadline runs
    assert _timeouts(server) == 0


def _flow(frame_started: float | None, *pauses: str) -> ConnectionFlow:
    """A connection's flow state alone (the pipeline's base), with no socket or loop."""
    flow = ConnectionFlow()
    flow.frame_started = frame_started
    flow._client_pauses = set(pauses)
    flow.closed = False
    return flow


def test_a_frame_the_proxy_stopped_reading_is_never_overdue() -> None:
    muted, reading, between = _flow(0.0, "throttle"), _flow(0.0), _flow(None)
    assert not muted.frame_overdue(100.0, TIMEOUT)
    assert reading.frame_overdue(100.0, TIMEOUT)
    assert not reading.frame_overdue(TIMEOUT / 2, TIMEOUT)
    assert not between.frame_overdue(100.0, TIMEOUT)
