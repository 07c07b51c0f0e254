"""A client that stops reading pauses its upstream: the proxy holds at most its write-buffer
limit plus a frame for it, and everything arrives intact once the client reads again. With
responses spliced (the default on Linux), the kernel's pipe waits for the client instead, and
the proxy holds none of it."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from proxy.net import splice
from proxy.net.splice import SPLICE_SUPPORTED
from proxy.pipeline.connection import WRITE_BUFFER_HIGH
from tests.tools import unavailable
from tests.unit.conftest import Harness, StubUpstream, proxy_in_front_of, recv_exactly

RESPONSE_BYTES = 1 << 20
REQUESTS = 48


def _list_offsets_request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 2, 5, correlation_id, 2) + b"bp" + b"\x00" * 16
    return struct.pack(">i", len(payload)) + payload


async def _pipeline_state(harness: Harness) -> tuple[int, set[str]]:
    (pipeline,) = [p for p in harness.server.pipelines if p.in_flight or p._upstream_pauses]
    return pipeline.client.get_write_buffer_size(), set(pipeline._upstream_pauses)


@pytest.fixture(params=["streamed", "spliced"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "spliced" and not SPLICE_SUPPORTED:
        unavailable("splice(2) is Linux's")
    stub = StubUpstream()
    splice = "true" if request.param == "spliced" else "false"
    with proxy_in_front_of(stub.handle, f"splice_responses: {splice}\n") as (loop, port, server):
        yield Harness(loop, stub, port, server)


def test_slow_client_pauses_upstream(harness: Harness) -> None:
    stub = harness.stub
    spliced = harness.server.cfg.splice_responses
    stub.replies[:] = [bytes([i % 251]) * RESPONSE_BYTES for i in range(REQUESTS)]
    with socket.create_connection(("127.0.0.1", harness.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(b"".join(_list_offsets_request(i) for i in range(REQUESTS)))
        time.sleep(1.5)  # the client reads nothing meanwhile
        held, pauses = asyncio.run_coroutine_threadsafe(_pipeline_state(harness), harness.loop).result(10)
        if spliced:  # the client's socket is full: the splice waits on it, the broker's reads too
            assert pauses == {"splice"}
            assert held == 0
        else:
            assert "client-backpressure" in pauses
            assert held <= WRITE_BUFFER_HIGH + RESPONSE_BYTES + 64
        got = recv_exactly(sock, REQUESTS * (8 + RESPONSE_BYTES))
    assert got == bytes(stub.sent)
    moved = harness.server.metrics.spliced_response_bytes._value.get()
    assert moved > (REQUESTS * RESPONSE_BYTES) * 0.9 if spliced else moved == 0


def test_past_the_pipe_budget_responses_are_copied_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe refused (the user's pipe budget spent: a page or two a pipe) leaves the response to
    stream through the proxy, every byte of it, and says so. The first response is never offered
    to splice: the broker's socket is read as bytes until a large frame comes, and some of that
    one's bytes are read already (the connection is read into buffers from then on)."""
    if not SPLICE_SUPPORTED:
        unavailable("splice(2) is Linux's")
    monkeypatch.setattr(splice, "MIN_PIPE_BYTES", splice.PIPE_BYTES * 2)
    stub = StubUpstream()
    stub.replies[:] = [bytes([i + 1]) * RESPONSE_BYTES for i in range(4)]
    with proxy_in_front_of(stub.handle) as (_loop, port, server):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"".join(_list_offsets_request(i) for i in range(4)))
            got = recv_exactly(sock, 4 * (8 + RESPONSE_BYTES))
        refused = server.metrics.upstream_errors.labels("splice-unavailable")._value.get()
        moved = server.metrics.spliced_response_bytes._value.get()
    assert got == bytes(stub.sent)
    assert refused == 3
    assert moved == 0
