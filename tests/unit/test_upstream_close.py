"""A broker closing a connection is counted by what the client loses: with requests in flight
it is an upstream failure; idle, it is the broker's connections.max.idle.ms at work (the client
sees the same close it would see without the proxy), counted apart so it raises no alarm."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator

import pytest

from proxy.server import ProxyServer
from tests.unit.conftest import proxy_in_front_of


def _api_versions_request() -> bytes:
    payload = struct.pack(">hhih", 18, 0, 7, 4) + b"test"
    return struct.pack(">i", len(payload)) + payload


def _heartbeat_request() -> bytes:
    """A request the proxy passes on unchanged (Heartbeat v0), answered by the stub as it likes."""
    payload = struct.pack(">hhih", 12, 0, 9, 4) + b"test"
    return struct.pack(">i", len(payload)) + payload


class _ClosingUpstream:
    """Closes every connection (the proxy opens one when its client first sends): after
    answering the first request, once idle; or as soon as the first bytes arrive."""

    def __init__(self) -> None:
        self.after_request = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.after_request:
            await reader.read(1)
        else:
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            request = await reader.readexactly(size)
            answer = request[4:8] + b"\x00\x00"  # its correlation id, error code 0
            writer.write(struct.pack(">i", len(answer)) + answer)
            await writer.drain()
            await asyncio.sleep(0.2)  # idle: nothing in flight
        writer.close()


@pytest.fixture
def proxy() -> Iterator[tuple[int, ProxyServer, _ClosingUpstream]]:
    stub = _ClosingUpstream()
    with proxy_in_front_of(stub.handle) as (_loop, port, server):
        yield port, server, stub


def _count(server: ProxyServer, kind: str) -> float:
    return server.metrics.upstream_errors.labels(kind)._value.get()  # type: ignore[no-any-return]


@pytest.mark.timeout(30)
def test_idle_close_is_not_a_failure(proxy: tuple[int, ProxyServer, _ClosingUpstream]) -> None:
    port, server, _stub = proxy
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_heartbeat_request())
        assert sock.recv(10) == struct.pack(">ii", 6, 9) + b"\x00\x00"  # answered, then idle
        assert sock.recv(10) == b""  # the client sees the broker's close
    assert _count(server, "idle_close") == 1
    assert _count(server, "disconnect") == 0


@pytest.mark.timeout(30)
def test_close_with_a_request_in_flight_is_a_failure(
    proxy: tuple[int, ProxyServer, _ClosingUpstream],
) -> None:
    port, server, stub = proxy
    stub.after_request = True
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(_api_versions_request())
        assert sock.recv(10) == b""
    assert _count(server, "disconnect") == 1
    assert _count(server, "idle_close") == 0
