"""A listener that requires the PROXY protocol (proxy/net/proxy_protocol.py), in-process in front of a
stub upstream: the header's client becomes the connection's peer (v1, v2 over IPv4 and IPv6, the
header split byte by byte, the request in the same packet); LOCAL keeps the socket's peer; no
header, a bad one, a late one or an untrusted source is refused, counted and logged; TLS starts
after the header, and a request sent right after the handshake is served."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dev.certs import CertificateAuthority
from protocol.proxy_header import V2_SIGNATURE
from proxy.net.tls import server_name
from proxy.server import ProxyServer
from tests.unit.conftest import StubUpstream, proxy_in_front_of, recv_exactly

T = TypeVar("T")
TRUSTED = "proxy_protocol: {listeners: [sidecar], trusted_sources: [127.0.0.0/8]}\n"


def _request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 2, 5, correlation_id, 2) + b"pp" + b"\x00" * 16  # ListOffsets v5
    return struct.pack(">i", len(payload)) + payload


def _v2(command: int, family: int, addresses: bytes) -> bytes:
    return (
        V2_SIGNATURE
        + bytes([0x20 | command, family << 4 | 0x1])
        + struct.pack(">H", len(addresses))
        + addresses
    )


def _v2_tcp4(src: str, sport: int) -> bytes:
    block = ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address("127.0.0.1").packed
    return _v2(0x1, 0x1, block + struct.pack(">HH", sport, 9092))


def _answered(sock: socket.socket, correlation_id: int) -> bool:
    sock.sendall(_request(correlation_id))
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return bool(struct.unpack(">i", recv_exactly(sock, size)[:4])[0] == correlation_id)


def _closed_by_proxy(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


class Proxy:
    def __init__(self, loop: asyncio.AbstractEventLoop, port: int, server: ProxyServer) -> None:
        self.loop, self.port, self.server = loop, port, server

    def on_loop(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def peers(self) -> list[str]:
        return self.on_loop(lambda: sorted(p.peer for p in self.server.pipelines))

    def refused(self, reason: str) -> float:
        counter: Any = self.server.metrics.proxy_protocol_refused.labels(reason)
        return float(counter._value.get())

    def headers(self, version: str, kind: str) -> float:
        counter: Any = self.server.metrics.proxy_protocol_headers.labels(version, kind)
        return float(counter._value.get())

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def proxy(request: pytest.FixtureRequest) -> Iterator[Proxy]:
    extra = getattr(request, "param", TRUSTED)
    with proxy_in_front_of(StubUpstream().handle, extra) as (loop, port, server):
        yield Proxy(loop, port, server)


@pytest.mark.timeout(30)
def test_v1_header_names_the_client(proxy: Proxy) -> None:
    with proxy.connect() as sock:
        sock.sendall(b"PROXY TCP4 10.9.8.7 127.0.0.1 4321 9092\r\n" + _request(1))  # one packet
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        assert struct.unpack(">i", recv_exactly(sock, size)[:4])[0] == 1
        assert proxy.peers() == ["10.9.8.7:4321"]
    assert proxy.headers("1", "client") == 1


@pytest.mark.timeout(30)
def test_v2_header_byte_by_byte_then_requests(proxy: Proxy) -> None:
    with proxy.connect() as sock:
        for byte in _v2_tcp4("192.0.2.44", 50000):
            sock.sendall(bytes([byte]))
            time.sleep(0.005)
        assert _answered(sock, 7) and _answered(sock, 8)
        assert proxy.peers() == ["192.0.2.44:50000"]


@pytest.mark.timeout(30)
def test_v2_ipv6_client(proxy: Proxy) -> None:
    block = ipaddress.IPv6Address("2001:db8::5").packed + ipaddress.IPv6Address("2001:db8::1").packed
    with proxy.connect() as sock:
        sock.sendall(_v2(0x1, 0x2, block + struct.pack(">HH", 40000, 9092)))
        assert _answered(sock, 1)
        assert proxy.peers() == ["2001:db8::5:40000"]


@pytest.mark.timeout(30)
def test_local_and_unknown_keep_the_socket_peer(proxy: Proxy) -> None:
    with proxy.connect() as local, proxy.connect() as unknown:
        local.sendall(_v2(0x0, 0x0, b""))
        unknown.sendall(b"PROXY UNKNOWN\r\n")
        assert _answered(local, 1) and _answered(unknown, 2)
        own = {f"127.0.0.1:{s.getsockname()[1]}" for s in (local, unknown)}
        assert set(proxy.peers()) == own
    assert proxy.headers("2", "local") == 1 and proxy.headers("1", "unknown") == 1


@pytest.mark.timeout(30)
def test_a_client_without_a_header_is_refused_and_logged(
    proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "proxy.net.proxy_protocol")
    with proxy.connect() as sock:
        port = sock.getsockname()[1]
        sock.sendall(_request(1))
        assert _closed_by_proxy(sock)
    assert proxy.refused("malformed") == 1 and proxy.peers() == []
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy.net.proxy_protocol"]
    assert any(
        f"connection from 127.0.0.1:{port} on sidecar refused: not a PROXY protocol header" in line
        and "a Kafka request" in line
        for line in lines
    ), lines


@pytest.mark.timeout(30)
@pytest.mark.parametrize("proxy", [TRUSTED + "connect_timeout_seconds: 0.5\n"], indirect=True)
def test_a_header_that_does_not_come_in_time_is_refused(proxy: Proxy) -> None:
    with proxy.connect() as sock:
        sock.sendall(b"PROXY TCP4 10.")
        assert _closed_by_proxy(sock)
    assert proxy.refused("timeout") == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "proxy", ["proxy_protocol: {listeners: [sidecar], trusted_sources: [10.0.0.0/8, '::1']}\n"], indirect=True
)
def test_a_source_outside_trusted_sources_is_refused(proxy: Proxy, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "proxy.net.proxy_protocol")
    with proxy.connect() as sock:
        sock.sendall(b"PROXY TCP4 10.9.8.7 127.0.0.1 4321 9092\r\n" + _request(1))
        assert _closed_by_proxy(sock)
    assert proxy.refused("untrusted-source") == 1 and proxy.headers("1", "client") == 0
    assert any("127.0.0.1 is not in proxy_protocol.trusted_sources" in r.getMessage() for r in caplog.records)


# --- TLS after the header ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    server = ca.issue("server", "proxy", dns=("localhost",), ips=("127.0.0.1",))
    return ca.cert_path, server.cert, server.key


@pytest.mark.timeout(30)
def test_tls_starts_after_the_header(pki: tuple[Path, Path, Path]) -> None:
    ca, cert, key = pki
    extra = TRUSTED + f"tls: {{enabled: true, certfile: '{cert}', keyfile: '{key}'}}\n"
    with proxy_in_front_of(StubUpstream().handle, extra) as (loop, port, server):
        proxy = Proxy(loop, port, server)
        context = ssl.create_default_context(cafile=str(ca))
        raw = proxy.connect()
        raw.sendall(_v2_tcp4("198.51.100.9", 61000))
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            # sent at once after the handshake: it may be decrypted before the pipeline exists
            tls.sendall(_request(1) + _request(2))
            for correlation_id in (1, 2):
                (size,) = struct.unpack(">i", recv_exactly(tls, 4))
                assert struct.unpack(">i", recv_exactly(tls, size)[:4])[0] == correlation_id
            assert proxy.peers() == ["198.51.100.9:61000"]
            # the TLS identity is read as on any TLS listener: the server name the client asked for
            names = proxy.on_loop(
                lambda: [server_name(p.client.get_extra_info("ssl_object")) for p in server.pipelines]
            )
            assert names == ["localhost"]
        # a client that goes straight to TLS, without the load balancer's header
        with proxy.connect() as direct, pytest.raises((ssl.SSLError, ConnectionError)):
            context.wrap_socket(direct, server_hostname="localhost").sendall(_request(3))
        assert proxy.refused("malformed") == 1
