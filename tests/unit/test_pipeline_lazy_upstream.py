"""The upstream connection is opened when a client first sends: a silent connection (a load
balancer's health check, an idle pool) costs the broker nothing, and is closed after
``silent_connection_close_seconds`` as the broker's connections.max.idle.ms would close it."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from dataclasses import dataclass, field

from protocol.frames import FrameDecoder
from tests.unit.conftest import proxy_in_front_of, recv_exactly


@dataclass
class CountingUpstream:
    """Counts the connections it gets and answers each request with its correlation id."""

    connections: int = 0
    received: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        self.connections += 1  # counted when accepted, whether or not anything comes
        while data := await reader.read(65536):
            for frame in decoder.feed(data):
                if struct.unpack_from(">h", frame, 0)[0] == 3:  # the proxy's own broker discovery
                    self.connections -= 1
                    writer.close()
                    return
                self.received.append(bytes(frame))
                answer = frame[4:8] + b"answer"
                writer.write(struct.pack(">i", len(answer)) + answer)
        writer.close()


def _request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 12, 0, correlation_id, 4) + b"lazy"  # Heartbeat v0: passed through
    return struct.pack(">i", len(payload)) + payload


def test_silent_connections_open_nothing_upstream_and_are_closed_in_time() -> None:
    upstream = CountingUpstream()
    config = "silent_connection_close_seconds: 1.0\n"
    with proxy_in_front_of(upstream.handle, config) as (_loop, port, _server):
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as talker:
            time.sleep(0.3)
            assert upstream.connections == 0  # twenty-one accepted, none spoke yet
            # Sent in two pieces, the second while the upstream connection is being opened.
            wire = _request(7) + _request(8)
            talker.sendall(wire[:5])
            time.sleep(0.05)
            talker.sendall(wire[5:])
            answers = recv_exactly(talker, 2 * 14)
            assert answers == b"".join(struct.pack(">ii", 10, c) + b"answer" for c in (7, 8))
            assert upstream.connections == 1
            assert upstream.received == [w[4:] for w in (_request(7), _request(8))]
            time.sleep(1.5)  # past silent_connection_close_seconds: the talker is not silent
            talker.sendall(_request(9))
            assert recv_exactly(talker, 14) == struct.pack(">ii", 10, 9) + b"answer"
        for sock in silent:  # closed by the proxy: end of stream
            sock.settimeout(5)
            assert sock.recv(10) == b""
            sock.close()
        assert upstream.connections == 1
