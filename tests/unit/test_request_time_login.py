"""request_percentage and the ApiVersions a connection opens with: Kafka's SASL authenticator
answers it before the login, uncharged; any other listener charges it. A real Pipeline on
in-memory transports (the liveness property's), a broker that takes 50 ms on it (5% of a
second, over a quota of 1%)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fuzz.fakenet import FakeTransport
from protocol import messages
from protocol.frames import FrameDecoder, response_header_size
from proxy.pipeline.connection import Pipeline
from tests.unit.test_pipeline_liveness import CLIENT_ID, SIDECAR, _Broker, _frame, _Net

REQUEST_QUOTA = SIDECAR + (
    "quotas:\n  window: {num: 2, size_seconds: 1}\n  users:\n    <default>: {request_percentage: 1}\n"
)
VERSIONS = {"client_software_name": "kafka-python", "client_software_version": "3.0"}
HANDSHAKE: tuple[int, int, dict[str, Any]] = (17, 1, {"mechanism": "PLAIN"})
METADATA: tuple[int, int, dict[str, Any]] = (3, 12, {"topics": None, "allow_auto_topic_creation": False})


@pytest.fixture
def nets() -> Iterator[Callable[[str], _Net]]:
    """Makes proxies on in-memory loops, each closed after the test."""
    made: list[_Net] = []

    def make(config: str) -> _Net:
        made.append(_Net(config))
        return made[-1]

    yield make
    for net in made:
        net.loop.close()


def _anonymous_percentage(net: _Net) -> float:
    enforcer = net.server.enforcer
    state = enforcer.request_time.state("ANONYMOUS", CLIENT_ID, enforcer.now_ms())
    return float(state["percentage"])  # type: ignore[arg-type]


def _throttles(client: FakeTransport, second: tuple[int, int, object]) -> dict[int, int]:
    """Correlation id -> throttle_time_ms of each answer the client got: the ApiVersions (1),
    and ``second``'s (2)."""
    out = {}
    for frame in FrameDecoder(2**31 - 1).feed(client.written):
        correlation = struct.unpack_from(">i", frame, 0)[0]
        key, version = (18, 3) if correlation == 1 else second[:2]
        start = response_header_size(key, version, frame)
        body = messages.decode_response(key, version, memoryview(frame)[start:])
        out[correlation] = int(body.get("throttle_time_ms", 0))
    return out


def _opened(net: _Net) -> tuple[Pipeline, FakeTransport, _Broker]:
    """A connection whose ApiVersions the broker took 50 ms to answer."""
    pipeline, client = net.connect()
    client.send(_frame(18, 3, 1, VERSIONS))
    net.loop.settle()
    broker = _Broker(net.upstreams[-1], random.Random(0))
    net.loop.advance(0.05)
    broker.answer(1)
    net.loop.settle()
    return pipeline, client, broker


def _exchange(net: _Net, client: FakeTransport, broker: _Broker, frame: bytes, busy: float) -> None:
    client.send(frame)
    net.loop.settle()
    net.loop.advance(busy)
    broker.answer(1)
    net.loop.settle()


def test_the_api_versions_before_a_sasl_login_is_not_charged(nets: Callable[[str], _Net]) -> None:
    net = nets(REQUEST_QUOTA)
    _pipeline, client, broker = _opened(net)
    key, version, body = HANDSHAKE
    _exchange(net, client, broker, _frame(key, version, 2, body), 0.0)
    assert _anonymous_percentage(net) == 0.0, "the authenticator answered it: no request quota"
    assert _throttles(client, HANDSHAKE) == {1: 0, 2: 0}


def test_the_api_versions_before_any_other_request_is_charged_with_it(nets: Callable[[str], _Net]) -> None:
    net = nets(REQUEST_QUOTA)
    _pipeline, client, broker = _opened(net)
    assert _throttles(client, METADATA) == {1: 0}, "not known yet which listener it reached"
    key, version, body = METADATA
    client.send(_frame(key, version, 2, body))
    net.loop.settle()
    assert _anonymous_percentage(net) > 1.0, "no SASL login: KafkaApis charged it"
    broker.answer(1)
    net.loop.settle()
    assert _throttles(client, METADATA)[2] > 0, "its time throttles the requests after it"


def test_a_connection_closed_after_its_api_versions_is_charged(nets: Callable[[str], _Net]) -> None:
    net = nets(REQUEST_QUOTA)
    pipeline, client, _broker = _opened(net)
    client.hang_up()
    net.loop.settle()
    assert pipeline.closed
    assert _anonymous_percentage(net) > 1.0


def test_only_the_first_request_can_be_the_one_before_a_login(nets: Callable[[str], _Net]) -> None:
    """Kafka's authenticator takes one ApiVersions and fails a connection that sends another:
    a second one says no SASL login is coming, and both are charged."""
    net = nets(REQUEST_QUOTA)
    _pipeline, client, broker = _opened(net)
    _exchange(net, client, broker, _frame(18, 3, 2, VERSIONS), 0.05)
    assert _anonymous_percentage(net) > 4.0, "both ApiVersions' 50 ms"
    assert _throttles(client, (18, 3, None))[2] > 0


def test_an_api_versions_later_in_the_connection_is_charged_whoever_saw_its_start(
    nets: Callable[[str], _Net],
) -> None:
    """request_percentage turned on by a reload mid-connection: the stage never saw the
    connection's first request, and an ApiVersions now, even before a SaslHandshake (a KIP-368
    re-login), is charged as any request."""
    from proxy.config import parse_config
    from proxy.reload import apply

    net = nets(SIDECAR)
    _pipeline, client, broker = _opened(net)
    key, version, body = METADATA
    _exchange(net, client, broker, _frame(key, version, 2, body), 0.0)
    apply(net.server, parse_config(REQUEST_QUOTA))
    _exchange(net, client, broker, _frame(18, 3, 3, VERSIONS), 0.05)
    key, version, body = HANDSHAKE
    _exchange(net, client, broker, _frame(key, version, 4, body), 0.0)
    assert _anonymous_percentage(net) > 1.0


def test_an_api_versions_after_a_login_is_charged_even_with_the_opening_correlation_id(
    nets: Callable[[str], _Net],
) -> None:
    """Only the opening ApiVersions goes uncharged before a login: a later one that reuses its
    correlation id (clients choose them freely; the broker only echoes them) is any request."""
    net = nets(REQUEST_QUOTA)
    _pipeline, client, broker = _opened(net)
    key, version, body = HANDSHAKE
    _exchange(net, client, broker, _frame(key, version, 2, body), 0.0)
    assert _anonymous_percentage(net) == 0.0
    _exchange(net, client, broker, _frame(18, 3, 1, VERSIONS), 0.05)
    assert _anonymous_percentage(net) > 1.0, "the second ApiVersions' 50 ms"
