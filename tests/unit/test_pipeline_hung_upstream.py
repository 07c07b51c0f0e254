"""An upstream that stops reading (a hung broker): a client that filled the proxy's buffers and
then left is noticed although its reads are paused, and the upstream connection with the bytes
it will never take is reset rather than kept open forever."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import pytest

import proxy.net.transports
from protocol.frames import FrameDecoder
from proxy.server import ProxyServer
from tests.unit.conftest import proxy_in_front_of

MiB = 1024 * 1024


@dataclass
class HungUpstream:
    """Reads a connection's first request, then nothing more."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while not (frames := decoder.feed(await reader.read(4096))):
            pass
        if struct.unpack_from(">h", frames[0], 0)[0] == 3:  # the proxy's own broker discovery
            writer.close()
            return
        transport = cast(asyncio.Transport, writer.transport)
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.writers.append(writer)

    @staticmethod
    async def ended(writer: asyncio.StreamWriter) -> bool:
        """Read the connection to its end now: True when the proxy closed or reset it."""
        cast(asyncio.Transport, writer.transport).resume_reading()
        reader: asyncio.StreamReader = writer._protocol._stream_reader  # type: ignore[attr-defined]
        try:
            while await asyncio.wait_for(reader.read(1 << 20), 5):
                pass
        except TimeoutError:
            return False
        except OSError:
            pass
        return True


@dataclass
class Setup:
    loop: asyncio.AbstractEventLoop
    upstream: HungUpstream
    port: int
    server: ProxyServer


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    monkeypatch.setattr(proxy.net.transports, "CLOSE_FLUSH_SECONDS", 0.5)
    monkeypatch.setattr(proxy.net.transports, "PAUSED_PEER_CHECK_SECONDS", 0.1)
    upstream = HungUpstream()
    with proxy_in_front_of(upstream.handle) as (loop, port, server):
        yield Setup(loop, upstream, port, server)


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, 1, 4) + b"hung" + body
    return struct.pack(">i", len(payload)) + payload


def test_client_leaving_a_hung_upstream_releases_both_sockets(hung: Setup) -> None:
    async def state() -> tuple[int, set[str]]:
        pipelines = list(hung.server.pipelines)
        return len(pipelines), set().union(*(p._client_pauses for p in pipelines))

    client = socket.create_connection(("127.0.0.1", hung.port), timeout=10)
    client.sendall(_frame(18, 0, b""))  # ApiVersions v0: the upstream reads this one
    deadline = time.monotonic() + 10
    while not hung.upstream.writers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hung.upstream.writers, "the first request never reached the upstream"
    client.settimeout(2)
    with contextlib.suppress(TimeoutError):
        for _ in range(32):  # ListOffsets v5 frames, forwarded unread by the proxy
            client.sendall(_frame(2, 5, b"\x00" * MiB))
    count, pauses = asyncio.run_coroutine_threadsafe(state(), hung.loop).result(10)
    assert count == 1 and "upstream-backpressure" in pauses
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    deadline = time.monotonic() + 10
    while asyncio.run_coroutine_threadsafe(state(), hung.loop).result(10)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not hung.server.pipelines, "the pipeline outlived its client"
    (writer,) = hung.upstream.writers
    assert asyncio.run_coroutine_threadsafe(HungUpstream.ended(writer), hung.loop).result(15)


@pytest.mark.parametrize("reset", [False, True])
def test_peer_has_closed_sees_a_fin_or_reset_while_reads_are_paused(reset: bool) -> None:
    async def run() -> tuple[bool, bool]:
        accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

        async def on_client(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            cast(asyncio.Transport, writer.transport).pause_reading()
            await accepted.put(writer)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"unread bytes")
        writer = await asyncio.wait_for(accepted.get(), 10)
        before = proxy.net.transports.peer_has_closed(writer.transport)
        if reset:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        deadline = time.monotonic() + 10
        while (
            not (after := proxy.net.transports.peer_has_closed(writer.transport))
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)
        writer.close()
        server.close()
        return before, after

    assert asyncio.run(run()) == (False, True)
