"""splice(2) moves the rest of a response from one real TCP socket to another in order, stops at
its last byte (what follows stays for the transport), shows the filter every byte it does not
skip, waits for a slow reader, and says so when the broker leaves mid-response. On both event
loops the proxy runs on."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import encode_response_header
from protocol.node_endpoints import TailFinder, tail_of, withhold_node_endpoints
from proxy.net import splice
from proxy.net.splice import SPLICE_SUPPORTED, PipeTooSmall, SpliceFailed, SpliceLink, SpliceTransfer
from tests.tools import unavailable

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
NEXT = b"\x00\x00\x00\x08the next"  # the next frame, left in the broker's socket


class Sockets:
    """broker -> (upstream: the proxy's) and (client: the proxy's) -> reader, over loopback TCP."""

    def __init__(self) -> None:
        self.broker, self.upstream = _tcp_pair()
        self.client, self.reader = _tcp_pair()
        for sock in (self.upstream, self.client):
            sock.setblocking(False)  # as a transport's are

    def close(self) -> None:
        for sock in (self.broker, self.upstream, self.client, self.reader):
            sock.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname(), timeout=20)
        far, _ = server.accept()
    far.settimeout(20)
    return near, far


@pytest.fixture(params=sorted(LOOPS))
def loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    if not SPLICE_SUPPORTED:
        unavailable("splice(2) is Linux's")
    made = LOOPS[request.param]()
    yield made
    made.close()


@pytest.fixture
def sockets() -> Iterator[Sockets]:
    made = Sockets()
    yield made
    made.close()


class TailFilter:
    """The NodeEndpoints filter's part, without a connection around it."""

    def __init__(self, key: int, version: int, head: bytes) -> None:
        self.finder = TailFinder(key, version)
        self.passed_head = self.finder.feed(head)
        self.fed = 0

    def feed(self, data: memoryview | bytes) -> int:
        self.fed += len(data)
        return self.finder.feed(data)

    def skippable(self) -> int:
        return self.finder.skippable()

    def skip(self, n: int) -> None:
        self.finder.skip(n)

    def finish(self, tail: bytearray) -> None:
        withhold_node_endpoints(tail)


def _transfer(
    loop: asyncio.AbstractEventLoop,
    sockets: Sockets,
    left: int,
    span_filter: Any = None,
    held: bytes = b"",
) -> SpliceTransfer:
    """Runs one transfer to its end; raises ConnectionError with the reason if it failed."""

    async def run() -> SpliceTransfer:
        link = SpliceLink(loop, sockets.upstream.fileno(), sockets.client.fileno())
        ended: asyncio.Future[None] = loop.create_future()

        def failed(error: SpliceFailed) -> None:
            side = "client" if error.sink_side else "broker"
            ended.set_exception(ConnectionError(f"{side}: {error}"))

        transfer = SpliceTransfer(link, left, span_filter, lambda: ended.set_result(None), failed, held)
        transfer.start()
        try:
            await asyncio.wait_for(ended, 20)
        except TimeoutError:
            transfer.cancel()
            raise
        finally:
            assert link.closed  # the transfer's own: closed at its end, done or failed
        return transfer

    return loop.run_until_complete(run())


def _send(sock: socket.socket, data: bytes) -> threading.Thread:
    thread = threading.Thread(target=sock.sendall, args=(data,), daemon=True)
    thread.start()
    return thread


class Reader:
    """Reads ``n`` bytes on a thread, slowly if asked (a client that falls behind)."""

    def __init__(self, sock: socket.socket, n: int, pause: float = 0.0) -> None:
        self.sock, self.n, self.pause = sock, n, pause
        self.got = bytearray()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while len(self.got) < self.n:
            chunk = self.sock.recv(min(self.n - len(self.got), 256 * 1024 if not self.pause else 32 * 1024))
            if not chunk:
                return
            self.got += chunk
            if self.pause:
                time.sleep(self.pause)

    def result(self) -> bytes:
        self.thread.join(20)
        return bytes(self.got)


def _left_in(sock: socket.socket, n: int) -> bytes:
    sock.setblocking(True)
    sock.settimeout(5)
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got


def test_the_bytes_go_across_in_order_and_the_next_frame_stays(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    body = bytes(i % 253 for i in range(5 * 1024 * 1024 + 17))
    sender = _send(sockets.broker, body + NEXT)
    reader = Reader(sockets.reader, len(body))
    transfer = _transfer(loop, sockets, len(body))
    assert reader.result() == body
    assert transfer.spliced == len(body)  # none of it was copied through the proxy
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def test_a_slow_client_is_waited_for(loop: asyncio.AbstractEventLoop, sockets: Sockets) -> None:
    sockets.reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    body = bytes(i % 241 for i in range(3 * 1024 * 1024))
    sender = _send(sockets.broker, body + NEXT)
    reader = Reader(sockets.reader, len(body), pause=0.002)
    _transfer(loop, sockets, len(body))
    assert reader.result() == body
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def _fetch_response(partitions: int, records_bytes: int) -> bytes:
    records = bytes(i % 251 for i in range(records_bytes))
    body = {
        "responses": [
            {
                "topic_id": bytes(range(16)),
                "partitions": [
                    {"partition_index": i, "high_watermark": 9, "last_stable_offset": 9, "records": records}
                    for i in range(partitions)
                ],
            }
        ],
        "node_endpoints": [{"node_id": 1, "host": "broker-1.internal", "port": 9092, "rack": None}],
    }
    return bytes(
        encode_response_header(ApiKey.FETCH, 17, 5) + messages.encode_response(ApiKey.FETCH, 17, body)
    )


@pytest.mark.parametrize("head_bytes", [60, 512])
def test_the_filter_sees_all_it_does_not_skip_and_finishes_the_tail(
    loop: asyncio.AbstractEventLoop, sockets: Sockets, head_bytes: int
) -> None:
    """A Fetch v17 response whose first bytes already went out (as a streamed one's head does):
    its records are spliced, its partition headers read, its NodeEndpoints withheld in place."""
    frame = _fetch_response(3, 400 * 1024)
    expected = bytearray(frame)
    assert withhold_node_endpoints(tail_of(ApiKey.FETCH, 17, expected))
    head, rest = frame[:head_bytes], frame[head_bytes:]
    span_filter = TailFilter(ApiKey.FETCH, 17, head)
    assert span_filter.passed_head == len(head)
    sender = _send(sockets.broker, rest + NEXT)
    reader = Reader(sockets.reader, len(rest))
    transfer = _transfer(loop, sockets, len(rest), span_filter)
    assert head + reader.result() == bytes(expected)
    assert b"broker-1.internal" not in reader.result()
    assert transfer.spliced >= 3 * (400 * 1024 - 4096)  # the records, less what came with a header
    assert span_filter.fed + transfer.spliced == len(rest)
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def _send_in_two(sockets: Sockets, data: bytes, split: int) -> threading.Thread:
    """Sends ``data[:split]``, waits until the proxy's side has taken all of it (nothing in the
    broker's send queue nor in the proxy's receive queue), then sends the rest."""

    def send() -> None:
        sockets.broker.sendall(data[:split])
        deadline = time.monotonic() + 5
        # Nothing unacknowledged first: then all of it is in the proxy's receive queue or taken,
        # and a receive queue found empty after that means taken.
        while _unsent(sockets.broker) or splice._unread(sockets.upstream.fileno()):
            assert time.monotonic() < deadline, "the transfer did not take the first part"
            time.sleep(0.001)
        sockets.broker.sendall(data[split:])

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _unsent(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]


def test_the_rest_of_a_span_begun_is_spliced_however_short(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    """The broker's bytes stop 10 KiB before a partition's records end, and the rest comes
    later: the rest is spliced too (under SPLICE_FROM_BYTES, but a span already begun), not
    read through the proxy 4 KiB at a time."""
    records_bytes = 400 * 1024
    frame = _fetch_response(1, records_bytes)
    expected = bytearray(frame)
    assert withhold_node_endpoints(tail_of(ApiKey.FETCH, 17, expected))
    head, rest = frame[:512], frame[512:]
    records_start = frame.find(bytes(i % 251 for i in range(records_bytes)))
    assert 0 < records_start < len(head)  # the records begin in the head: the splice begins the span
    records_end = records_start + records_bytes - len(head)
    span_filter = TailFilter(ApiKey.FETCH, 17, head)
    sender = _send_in_two(sockets, rest + NEXT, records_end - 10 * 1024)
    reader = Reader(sockets.reader, len(rest))
    transfer = _transfer(loop, sockets, len(rest), span_filter)
    assert head + reader.result() == bytes(expected)
    # The filter read the partition's header with the records' first bytes, and the tail.
    assert span_filter.fed < 2 * splice.READ_BYTES
    assert span_filter.fed + transfer.spliced == len(rest)
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def test_bytes_the_filter_already_held_go_out_finished(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    """The head reached into the tagged fields: the filter held their start before the splice."""
    frame = _fetch_response(1, 100)
    expected = bytearray(frame)
    withhold_node_endpoints(tail_of(ApiKey.FETCH, 17, expected))
    head, rest = frame[:-10], frame[-10:]
    span_filter = TailFilter(ApiKey.FETCH, 17, head)
    passed = span_filter.passed_head
    assert passed < len(head)
    sender = _send(sockets.broker, rest + NEXT)
    reader = Reader(sockets.reader, len(frame) - passed)
    _transfer(loop, sockets, len(rest), span_filter, held=head[passed:])
    assert head[:passed] + reader.result() == bytes(expected)
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def test_a_broker_that_leaves_mid_response_fails_the_transfer(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    """The client got part of a response: the pipeline closes its connection on this."""
    sockets.broker.sendall(b"x" * 100_000)
    sockets.broker.shutdown(socket.SHUT_WR)
    with pytest.raises(ConnectionError, match="broker: the broker closed the connection 900000 bytes before"):
        _transfer(loop, sockets, 1_000_000)


def test_a_cancelled_transfer_calls_nothing_back(loop: asyncio.AbstractEventLoop, sockets: Sockets) -> None:
    calls: list[str] = []

    async def run() -> None:
        link = SpliceLink(loop, sockets.upstream.fileno(), sockets.client.fileno())
        transfer = SpliceTransfer(
            link, 1000, None, lambda: calls.append("done"), lambda exc: calls.append(f"failed: {exc}")
        )
        transfer.start()  # nothing has come: it waits on the broker's socket
        transfer.cancel()
        assert link.closed
        sockets.broker.sendall(b"y" * 1000)
        await asyncio.sleep(0.05)

    loop.run_until_complete(run())
    assert calls == []
    assert _left_in(sockets.upstream, 1000) == b"y" * 1000


def test_a_pipe_out_of_slots_before_bytes_is_drained(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    """A pipe counts page slots, not bytes: small segments fill it long before its byte size.
    The broker's socket then stays readable while nothing more fits, and the pipe is drained
    (not waited on for good). Here the pipe shrinks to one page behind the link's back."""
    body = bytes(i % 199 for i in range(300_000))
    sender = _send(sockets.broker, body + NEXT)
    reader = Reader(sockets.reader, len(body))

    async def run() -> None:
        link = SpliceLink(loop, sockets.upstream.fileno(), sockets.client.fileno())
        fcntl.fcntl(link.pipe_in, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
        assert link.pipe_bytes > 4096
        ended: asyncio.Future[None] = loop.create_future()
        transfer = SpliceTransfer(link, len(body), None, lambda: ended.set_result(None), ended.set_exception)
        try:
            transfer.start()
            await asyncio.wait_for(ended, 20)
        finally:
            link.close()

    loop.run_until_complete(run())
    assert reader.result() == body
    assert _left_in(sockets.upstream, len(NEXT)) == NEXT
    sender.join(5)


def test_a_client_that_leaves_mid_response_is_told_apart(
    loop: asyncio.AbstractEventLoop, sockets: Sockets
) -> None:
    """The pipeline closes quietly for a client that left, as for a streamed response's."""
    sender = _send(sockets.broker, b"z" * 3_000_000)
    sockets.reader.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sockets.reader.close()  # a reset: the client's socket errors on the next write
    with pytest.raises(ConnectionError, match="client: the client's socket"):
        _transfer(loop, sockets, 3_000_000)
    sender.join(5)


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_pipe_below_its_floor_is_refused_and_leaks_nothing(
    loop: asyncio.AbstractEventLoop, sockets: Sockets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the user's pipe budget a new pipe gets a page or two: the link is refused (the
    response is copied instead), and its descriptors are closed."""
    monkeypatch.setattr(splice, "MIN_PIPE_BYTES", splice.PIPE_BYTES * 2)
    before = _open_descriptors()
    with pytest.raises(PipeTooSmall):
        SpliceLink(loop, sockets.upstream.fileno(), sockets.client.fileno())
    assert _open_descriptors() == before


def test_a_transfer_closes_its_link(loop: asyncio.AbstractEventLoop, sockets: Sockets) -> None:
    before = _open_descriptors()
    sender = _send(sockets.broker, b"w" * 200_000)
    reader = Reader(sockets.reader, 200_000)
    _transfer(loop, sockets, 200_000)
    assert reader.result() == b"w" * 200_000
    assert _open_descriptors() == before
    sender.join(5)
