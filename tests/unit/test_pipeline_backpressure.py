"""A client that stops reading pauses its upstream: the proxy holds at most its write-buffer
limit plus a frame for it, and everything arrives intact once the client reads again."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

from proxy.pipeline.connection import WRITE_BUFFER_HIGH
from tests.unit.conftest import Harness, recv_exactly

RESPONSE_BYTES = 1 << 20
REQUESTS = 48


def _list_offsets_request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 2, 5, correlation_id, 2) + b"bp" + b"\x00" * 16
    return struct.pack(">i", len(payload)) + payload


async def _pipeline_state(harness: Harness) -> tuple[int, set[str]]:
    (pipeline,) = [p for p in harness.server.pipelines if p.in_flight or p._upstream_pauses]
    return pipeline.client.get_write_buffer_size(), set(pipeline._upstream_pauses)


def test_slow_client_pauses_upstream(harness: Harness) -> None:
    stub = harness.stub
    stub.received.clear()
    stub.sent.clear()
    stub.replies[:] = [bytes([i % 251]) * RESPONSE_BYTES for i in range(REQUESTS)]
    with socket.create_connection(("127.0.0.1", harness.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"".join(_list_offsets_request(i) for i in range(REQUESTS)))
        time.sleep(1.5)  # the client reads nothing meanwhile
        held, pauses = asyncio.run_coroutine_threadsafe(_pipeline_state(harness), harness.loop).result(10)
        assert "client-backpressure" in pauses
        assert held <= WRITE_BUFFER_HIGH + RESPONSE_BYTES + 64
        got = recv_exactly(sock, REQUESTS * (8 + RESPONSE_BYTES))
    assert got == bytes(stub.sent)
