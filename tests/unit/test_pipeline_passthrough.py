"""Frames the proxy does not change go through byte for byte, both ways (property-based).

A unit test of the pipeline: the upstream here is a stub that records what it receives and
answers each request with random bytes under the right correlation id.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dev.harness import free_port
from protocol.frames import FrameDecoder
from protocol.versions import is_flexible
from proxy.config import parse_config
from proxy.server import ProxyServer

PASSTHROUGH_KEYS = [2, 8, 9, 11, 12, 13, 14, 15, 16, 32, 68, 71]


@dataclass
class StubUpstream:
    received: bytearray = field(default_factory=bytearray)
    sent: bytearray = field(default_factory=bytearray)
    replies: list[bytes] = field(default_factory=list)  # bodies to send, consumed in order

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            self.received += data
            for frame in decoder.feed(data):
                api_key = struct.unpack_from(">h", frame, 0)[0]
                if api_key == 3:  # the proxy's own broker discovery: not part of this test
                    writer.close()
                    return
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


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    stub = StubUpstream()
    upstream_port, proxy_port = free_port(), free_port()
    cfg = parse_config(
        f"mode: sidecar\nsidecar: {{listen_port: {proxy_port}, upstream: '127.0.0.1:{upstream_port}'}}\n"
        "admin: {enabled: false}\nmetadata_refresh_seconds: 3600\n"
    )
    server = ProxyServer(cfg)

    async def start() -> None:
        await asyncio.start_server(stub.handle, "127.0.0.1", upstream_port)
        await server.start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield Harness(loop, stub, proxy_port)
    asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@st.composite
def request_frames(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(PASSTHROUGH_KEYS))
    version = draw(st.integers(0, 12))
    correlation_id = draw(st.integers(-(2**31), 2**31 - 1))
    client_id = draw(st.one_of(st.none(), st.text(max_size=20)))
    header = struct.pack(">hhi", key, version, correlation_id)
    if client_id is None:
        header += struct.pack(">h", -1)
    else:
        cid = client_id.encode()
        header += struct.pack(">h", len(cid)) + cid
    if is_flexible(key, version):
        header += b"\x00"
    body = draw(st.binary(max_size=300))
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frames=st.lists(request_frames(), min_size=1, max_size=8),
    replies=st.lists(st.binary(max_size=200), min_size=8, max_size=8),
    split=st.integers(1, 64),
)
def test_unchanged_frames_pass_byte_for_byte(
    harness: Harness, frames: list[bytes], replies: list[bytes], split: int
) -> None:
    stub = harness.stub
    stub.received.clear()
    stub.sent.clear()
    stub.replies[:] = replies
    wire = b"".join(frames)
    with socket.create_connection(("127.0.0.1", harness.port), timeout=10) as sock:
        # Dribble the bytes in odd-sized pieces: framing must not depend on how reads split.
        for i in range(0, len(wire), split):
            sock.sendall(wire[i : i + split])
        expected_back = sum(4 + 4 + len(r) for r in replies[: len(frames)])
        got = _recv_exactly(sock, expected_back)
    assert bytes(stub.received) == wire
    assert got == bytes(stub.sent)
