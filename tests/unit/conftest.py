"""A stub upstream and an in-process proxy in front of it, for pipeline unit tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest

from dev.harness import free_port
from protocol.frames import FrameDecoder
from proxy.config import parse_config
from proxy.server import ProxyServer


@dataclass
class StubUpstream:
    received: bytearray = field(default_factory=bytearray)
    sent: bytearray = field(default_factory=bytearray)
    replies: list[bytes] = field(default_factory=list)  # bodies to send, consumed in order

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                api_key = struct.unpack_from(">h", frame, 0)[0]
                if api_key == 3:  # the proxy's own broker discovery (retried every second): not recorded
                    writer.close()
                    return
                self.received += struct.pack(">i", len(frame)) + frame
                body = self.replies.pop(0) if self.replies else b""
                reply = frame[4:8] + body
                out = struct.pack(">i", len(reply)) + reply
                self.sent += out
                writer.write(out)
        writer.close()


@dataclass
class Harness:
    loop: asyncio.AbstractEventLoop
    stub: StubUpstream
    port: int
    server: ProxyServer


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.contextmanager
def proxy_in_front_of(
    handle: Handler,
    extra_config: str = "",
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
) -> Iterator[tuple[asyncio.AbstractEventLoop, int, ProxyServer]]:
    """A sidecar proxy on its own event loop thread (``new_loop``'s), in front of an upstream
    served by ``handle``; yields the loop, the proxy's port and the server."""
    loop = new_loop()
    upstream_port, proxy_port = free_port(), free_port()
    cfg = parse_config(
        f"mode: sidecar\nsidecar: {{listen_port: {proxy_port}, upstream: '127.0.0.1:{upstream_port}'}}\n"
        "admin: {enabled: false}\nmetadata_refresh_seconds: 3600\n"
        # The stub is no Kafka broker: the quota API's store (a Kafka client) must not talk to it.
        "quota_api: {mode: forward}\n" + extra_config
    )
    server = ProxyServer(cfg)

    async def start() -> None:
        await asyncio.start_server(handle, "127.0.0.1", upstream_port)
        await server.start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield loop, proxy_port, server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    stub = StubUpstream()
    with proxy_in_front_of(stub.handle) as (loop, port, server):
        yield Harness(loop, stub, port, server)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)
