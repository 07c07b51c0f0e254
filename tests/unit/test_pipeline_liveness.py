"""A request the proxy has read is forwarded, answered or its connection closed: never left
waiting with the connection open. A real Pipeline on in-memory transports (fuzz/fakenet.py)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

import pytest

from fuzz.fakenet import FakeTransport, FuzzLoop
from fuzz.pipeline_target import _listener
from protocol import messages
from protocol.frames import FrameDecoder, RequestHeader, encode_request_header
from proxy.config import parse_config
from proxy.net.transports import ClientProtocol
from proxy.pipeline.connection import Pipeline
from proxy.pipeline.stages.group_requests import GroupRequestStage
from proxy.server import ProxyServer

SIDECAR = (
    "mode: sidecar\nsidecar: {listen_port: 19092, upstream: '127.0.0.1:9092'}\n"
    "admin: {enabled: false}\nmetadata_refresh_seconds: 3600\nsilent_connection_close_seconds: null\n"
)
# A burst of one join (two 1 s windows at 0.5/s): the second new member waits.
JOIN_RATE = (
    "quotas:\n  window: {num: 2, size_seconds: 1}\n  clients:\n    <default>: {join_group_rate: 0.5}\n"
)
CLIENT_ID = "kafka-python-3.0.12"  # consumers left at their default id share one bucket


class _Net:
    """A proxy on a loop whose clock moves when told, and the broker connections it opens."""

    def __init__(self, config: str) -> None:
        self.loop = FuzzLoop()
        self.errors: list[dict[str, object]] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.errors.append(ctx))
        self.server = ProxyServer(parse_config(config))
        self.server.brokers.on_new_node = None
        self.server.enforcer.clock = self.loop.time
        self.upstreams: list[FakeTransport] = []
        self.loop.on_connection = self.upstreams.append

    def connect(self) -> tuple[Pipeline, FakeTransport]:
        listener = next(iter(self.server.listeners.values()), None) or _listener(self.server)
        protocol = ClientProtocol(lambda transport: Pipeline(self.server, listener, transport))
        client = FakeTransport(self.loop, protocol, ("127.0.0.1", 40000 + len(self.upstreams)))

        async def accept() -> None:
            protocol.connection_made(client)

        self.loop.run_until_complete(accept())
        assert protocol.pipeline is not None
        return protocol.pipeline, client


def _frame(api_key: int, version: int, correlation_id: int, body: dict[str, object]) -> bytes:
    payload = encode_request_header(RequestHeader(api_key, version, correlation_id, CLIENT_ID, 0))
    payload += messages.encode(api_key, version, body, response=False)
    return struct.pack(">i", len(payload)) + bytes(payload)


def _join(correlation_id: int) -> bytes:
    body = {
        "group_id": "g",
        "session_timeout_ms": 10000,
        "rebalance_timeout_ms": 300000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    return _frame(11, 5, correlation_id, body)


def _correlation_ids(written: bytes | bytearray) -> list[int]:
    return [struct.unpack_from(">i", f, 4)[0] for f in FrameDecoder(2**31 - 1).feed(written)]


@pytest.fixture
def proxy_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="proxy")
    yield caplog


def test_a_held_request_whose_replay_fails_closes_its_connection(
    monkeypatch: pytest.MonkeyPatch, proxy_log: pytest.LogCaptureFixture
) -> None:
    """The second consumer's JoinGroup waits in the proxy for the shared join bucket; when the
    wait ends it is replayed from a timer, where a failure would otherwise close nothing and
    leave the client waiting, its reads paused, for good."""
    net = _Net(SIDECAR + JOIN_RATE)
    first, first_client = net.connect()
    first_client.send(_join(1) + _join(2))  # the bucket's burst, and some owed
    net.loop.settle()
    second, second_client = net.connect()
    second_client.send(_join(7))
    net.loop.settle()
    assert second.held and second.pause_reasons == ["throttle"], "the JoinGroup waits in the proxy"

    def failing(self: GroupRequestStage, req: object) -> bool:
        raise KeyError("a bug in a stage")

    monkeypatch.setattr(GroupRequestStage, "on_request", failing)
    net.loop.advance(30)
    net.loop.settle()

    assert second.closed and second_client.closed and second_client.lost
    assert second not in net.server.pipelines
    assert not first.closed, "only the connection whose request failed"
    failures = [r for r in proxy_log.records if "replaying a held request failed" in r.getMessage()]
    assert failures and failures[0].levelno == logging.ERROR and failures[0].exc_info is not None


def test_bytes_handed_over_while_the_upstream_connects_all_reach_it_in_order() -> None:
    """What TLS decrypted before the pipeline existed is handed over in one piece; past the
    decoder's first read it waits until the upstream is up, then every request goes, in order
    (it used to be written over the first bytes in the decoder's buffer and never sent)."""
    net = _Net(SIDECAR)
    pipeline, _client = net.connect()
    heartbeat = {"group_id": "g", "generation_id": 1, "member_id": "m-1"}
    data = b"".join(_frame(12, 3, i, heartbeat) for i in range(1, 2001))
    assert len(data) > 2 * 32 * 1024  # more than the decoder's 32 KiB scratch buffer takes at once

    async def hand_over() -> None:
        pipeline.feed(data)

    net.loop.run_until_complete(hand_over())
    net.loop.settle()
    (upstream,) = net.upstreams
    assert _correlation_ids(upstream.written) == list(range(1, 2001))
    assert not pipeline.closed and not net.errors


def test_a_failure_decoding_the_first_requests_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch, proxy_log: pytest.LogCaptureFixture
) -> None:
    """The first requests are decoded in the upstream connect's task once it is up: a failure
    there closes the connection instead of leaving its reads paused as "connecting"."""
    net = _Net(SIDECAR)
    pipeline, client = net.connect()

    def failing(self: Pipeline, frame: object) -> None:
        raise RuntimeError("a bug in the request path")

    monkeypatch.setattr(Pipeline, "_take_request", failing)
    client.send(_frame(12, 3, 1, {"group_id": "g", "generation_id": 1, "member_id": "m-1"}))
    net.loop.settle()
    assert pipeline.closed and client.closed
    assert any("the first requests failed" in r.getMessage() for r in proxy_log.records)
    assert not any(isinstance(ctx.get("exception"), RuntimeError) for ctx in net.errors)
