"""Frames that arrive in one read go out in one write: a client pipelining small requests (5
in flight, a consumer's fetches to one broker) costs the proxy one send per read each way, not
one per frame (the per-request cost that kept small requests dearer than a bare relay)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from protocol.frames import FrameDecoder
from tests.unit.conftest import proxy_in_front_of, recv_exactly


class CountingTransport:
    """Delegates to a transport, counting the calls that write."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes = 0

    def write(self, data: Any) -> None:
        self.writes += 1
        self.inner.write(data)

    def writelines(self, data: Any) -> None:
        self.writes += 1
        self.inner.writelines(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def answer_each_read_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every frame of a read in one write (correlation id, then its own request)."""
    decoder = FrameDecoder()
    while data := await reader.read(65536):
        answers = b""
        for frame in decoder.feed(data):
            if struct.unpack_from(">h", frame, 0)[0] == 3:  # the proxy's own broker discovery
                writer.close()
                return
            answer = bytes(frame[4:8]) + bytes(frame)
            answers += struct.pack(">i", len(answer)) + answer
        writer.write(answers)
    writer.close()


def _heartbeat(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 12, 0, correlation_id, 4) + b"beat"  # passed through undecoded
    return struct.pack(">i", len(payload)) + payload


@contextmanager
def _connected_and_counting() -> Iterator[tuple[socket.socket, CountingTransport, CountingTransport]]:
    """A client through the proxy, its upstream connection up (a first heartbeat answered), and
    the one pipeline's upstream and client transports wrapped on the proxy's loop to count
    their writes from then on."""
    with (
        proxy_in_front_of(answer_each_read_at_once) as (loop, port, server),
        socket.create_connection(("127.0.0.1", port), timeout=10) as client,
    ):
        client.sendall(_heartbeat(0))
        recv_exactly(client, 4 + 4 + 14)
        (pipeline,) = server.pipelines

        async def wrap() -> tuple[CountingTransport, CountingTransport]:
            up, down = CountingTransport(pipeline.upstream), CountingTransport(pipeline.client)
            pipeline.upstream, pipeline.client = cast(asyncio.Transport, up), cast(asyncio.Transport, down)
            return up, down

        upstream, to_client = asyncio.run_coroutine_threadsafe(wrap(), loop).result(5)
        yield client, upstream, to_client


def test_pipelined_requests_and_their_answers_go_out_in_one_write_each_way() -> None:
    with _connected_and_counting() as (client, upstream, to_client):
        wire = b"".join(_heartbeat(c) for c in range(1, 11))
        client.sendall(wire)  # one segment: the proxy reads all ten at once
        got = recv_exactly(client, 10 * (4 + 4 + 14))
        expected = b"".join(struct.pack(">ii", 18, c) + _heartbeat(c)[4:] for c in range(1, 11))
        assert got == expected  # every answer, in order
        assert (upstream.writes, to_client.writes) == (1, 1)


def _unsupported_api_versions(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 18, 99, correlation_id, 2) + b"av\x00"  # v99: the proxy answers
    return struct.pack(">i", len(payload)) + payload


def test_answers_the_proxy_makes_itself_to_pipelined_requests_go_out_in_one_write() -> None:
    with _connected_and_counting() as (client, upstream, to_client):
        client.sendall(b"".join(_unsupported_api_versions(c) for c in range(1, 11)))
        decoder = FrameDecoder()
        answers: list[Any] = []
        while len(answers) < 10:
            answers += decoder.feed(client.recv(65536))
        # Each in order, UNSUPPORTED_VERSION (35), none sent upstream.
        assert [struct.unpack_from(">ih", a, 0) for a in answers] == [(c, 35) for c in range(1, 11)]
        assert (upstream.writes, to_client.writes) == (0, 1)


def test_a_large_frame_among_pipelined_ones_keeps_its_place_and_its_bytes() -> None:
    """Frames over ONE_WRITE_BYTES are not copied into a read's batch: the batch so far goes out
    before one, and the frames after it follow it, each way."""
    from proxy.pipeline.connection import ONE_WRITE_BYTES

    def heartbeat(correlation_id: int, filler: int) -> bytes:
        tail = bytes(range(256)) * (filler // 256 + 1)
        payload = struct.pack(">hhih", 12, 0, correlation_id, 4) + b"beat" + tail[:filler]
        return struct.pack(">i", len(payload)) + payload

    sizes = {c: (ONE_WRITE_BYTES + 4096 if c in (4, 8) else 0) for c in range(1, 11)}
    with _connected_and_counting() as (client, upstream, to_client):
        client.sendall(b"".join(heartbeat(c, n) for c, n in sizes.items()))
        want = b"".join(
            struct.pack(">ii", 4 + len(h) - 4, c) + h[4:]
            for c, h in ((c, heartbeat(c, n)) for c, n in sizes.items())
        )
        assert recv_exactly(client, len(want)) == want  # every answer whole, in order
        assert upstream.writes >= 3 and to_client.writes >= 3  # the two large ones alone
