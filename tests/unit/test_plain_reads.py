"""Plaintext sockets are read as bytes (``asyncio.Protocol``): a request or response that was all
of a read goes on as the very bytes read, several frames of a read are sliced out of it, and a
frame split over reads is gathered. A connection that meets a large frame (or sends a Fetch, for
its broker side) is read into the decoder's buffers from then on, as TLS connections are. On real
sockets on both event loops the proxy runs on, and against the buffered reads on the fuzz target's
in-memory transports: the same bytes either way."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from fuzz.pipeline_target import SETUPS, PipelineFuzzer
from protocol import messages
from proxy.net.transports import ClientProtocol, PlainClientProtocol, PlainUpstreamProtocol, UpstreamProtocol
from proxy.pipeline.connection import Pipeline
from proxy.server import ProxyServer
from tests.unit.conftest import StubUpstream, proxy_in_front_of, recv_exactly

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
CORPUS = Path(__file__).resolve().parents[2] / "fuzz" / "corpus" / "pipeline"


def _request(api_key: int, correlation_id: int, body: bytes, version: int = 0) -> bytes:
    """A request with a v1 header (key, version, correlation id, client id), then ``body``."""
    payload = struct.pack(">hhih", api_key, version, correlation_id, 5) + b"plain" + body
    return struct.pack(">i", len(payload)) + payload


def _heartbeat(correlation_id: int, body: bytes = b"beat") -> bytes:
    return _request(12, correlation_id, body)  # passed through undecoded


def _answer(request: bytes, body: bytes) -> bytes:
    """What the stub answers ``request`` with: its correlation id, then ``body``."""
    reply = request[8:12] + body
    return struct.pack(">i", len(reply)) + reply


class Proxied:
    """A client through a proxy in front of the stub, and a look at its one pipeline's protocols."""

    def __init__(self, loop: asyncio.AbstractEventLoop, server: ProxyServer, sock: socket.socket) -> None:
        self.loop, self.server, self.sock = loop, server, sock

    def protocols(self) -> tuple[type, type]:
        async def look() -> tuple[type, type]:
            (pipeline,) = self.server.pipelines
            assert isinstance(pipeline, Pipeline) and pipeline.upstream is not None
            return type(pipeline.client.get_protocol()), type(pipeline.upstream.get_protocol())

        return asyncio.run_coroutine_threadsafe(look(), self.loop).result(5)

    def exchange(self, requests: bytes, answers: bytes) -> None:
        self.sock.sendall(requests)
        assert recv_exactly(self.sock, len(answers)) == answers


@pytest.fixture(params=sorted(LOOPS))
def proxied(request: pytest.FixtureRequest) -> Iterator[tuple[Proxied, StubUpstream]]:
    stub = StubUpstream()
    with (
        proxy_in_front_of(stub.handle, new_loop=LOOPS[request.param]) as (loop, port, server),
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        yield Proxied(loop, server, sock), stub


def test_small_frames_split_or_pipelined_arrive_whole_and_the_sockets_stay_plain(
    proxied: tuple[Proxied, StubUpstream],
) -> None:
    client, stub = proxied
    first = _heartbeat(0)
    client.exchange(first, _answer(first, b""))
    assert client.protocols() == (PlainClientProtocol, PlainUpstreamProtocol)
    # five in one write, answered in one read each way
    five = [_heartbeat(i, bytes([i]) * (100 * i)) for i in range(1, 6)]
    client.exchange(b"".join(five), b"".join(_answer(r, b"") for r in five))
    # one request in three writes, the last with the next request whole behind it
    split, after = _heartbeat(6, b"s" * 3000), _heartbeat(7)
    for part in (split[:3], split[3:1500]):
        client.sock.sendall(part)
        time.sleep(0.05)  # each its own read
    client.exchange(split[1500:] + after, _answer(split, b"") + _answer(after, b""))
    assert bytes(stub.received) == first + b"".join(five) + split + after
    assert client.protocols() == (PlainClientProtocol, PlainUpstreamProtocol)


def test_a_large_request_switches_the_client_side_to_buffered_reads(
    proxied: tuple[Proxied, StubUpstream],
) -> None:
    client, stub = proxied
    small, large, after = _heartbeat(0), _heartbeat(1, bytes(range(256)) * 1024), _heartbeat(2)
    client.exchange(small, _answer(small, b""))
    client.exchange(large + after, _answer(large, b"") + _answer(after, b""))
    assert bytes(stub.received) == small + large + after
    assert client.protocols() == (ClientProtocol, PlainUpstreamProtocol)
    client.exchange(after, _answer(after, b""))  # and reads go on into the buffers


def test_a_large_response_switches_the_broker_side_to_buffered_reads(
    proxied: tuple[Proxied, StubUpstream],
) -> None:
    client, stub = proxied
    big = bytes(range(251)) * 2000  # 502 KB: more than one read as bytes takes
    stub.replies[:] = [b"", big, b"small"]
    requests = [_heartbeat(i) for i in range(3)]
    client.exchange(requests[0], _answer(requests[0], b""))
    client.exchange(requests[1] + requests[2], _answer(requests[1], big) + _answer(requests[2], b"small"))
    assert client.protocols() == (PlainClientProtocol, UpstreamProtocol)


def test_a_fetch_switches_the_broker_side_before_its_answer_comes(
    proxied: tuple[Proxied, StubUpstream],
) -> None:
    """So that a Fetch's answer may be spliced from its first byte (a response read as bytes
    is not: part of it is read already)."""
    client, stub = proxied
    first = _heartbeat(0)
    client.exchange(first, _answer(first, b""))
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1024, "isolation_level": 0}
    fetch = _request(1, 1, bytes(messages.encode(1, 4, {**body, "topics": []}, response=False)), version=4)
    client.sock.sendall(fetch)
    deadline = time.monotonic() + 10
    while fetch not in stub.received:  # forwarded: the broker side switched as it went up
        assert time.monotonic() < deadline, "the Fetch never reached the broker"
        time.sleep(0.01)
    assert client.protocols() == (PlainClientProtocol, UpstreamProtocol)


@pytest.fixture(scope="module")
def fuzzers() -> tuple[PipelineFuzzer, PipelineFuzzer]:
    return PipelineFuzzer(), PipelineFuzzer()


@pytest.mark.parametrize("seed", sorted(p.name for p in CORPUS.iterdir()))
def test_plain_and_buffered_reads_pass_on_the_same_bytes(
    seed: str, fuzzers: tuple[PipelineFuzzer, PipelineFuzzer]
) -> None:
    """Each fuzz seed (any stream of requests, answers, partial frames, garbage, mutes), played
    once with both sockets read as bytes and once into the buffers, on two proxies that saw the
    same inputs before: the client and the broker get the same bytes."""
    data = (CORPUS / seed).read_bytes()
    seen = []
    for fuzzer, buffered in zip(fuzzers, (False, True), strict=True):
        setup = data[0] % len(SETUPS) + len(SETUPS) * buffered
        client = fuzzer.run(bytes([setup]) + data[1:])
        assert client is not None
        seen.append((bytes(client.written), [bytes(b.transport.written) for b in fuzzer.brokers]))
    assert seen[0] == seen[1]
