"""A Metadata answer goes out with its brokers rewritten and its topics as the broker's bytes:
not copied, not decoded, even when throttled, so its cost does not grow with the partitions."""

from __future__ import annotations

import struct
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from fuzz.pipeline_target import shared_fuzzer
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import (
    FrameDecoder,
    RequestHeader,
    encode_request_header,
    encode_response_header,
    response_header_size,
)
from protocol.metadata_brokers import MAX_VERSION
from proxy.metrics import ProxyMetrics
from proxy.pipeline.stages.addresses import AddressStage
from proxy.pipeline.stages.base import InFlight, Response
from proxy.shared.topic_names import TopicNames
from tests.unit.test_fuzz_regressions import _rec
from tests.unit.test_metadata_brokers import _answer as answer_of

VERSION = 12
VERSIONS = range(0, MAX_VERSION + 1)  # every version the broker-list splice reads
THROTTLED = (3, 9, MAX_VERSION)  # throttle_time_ms from v3; flexible from v9
GATEWAY = 2  # the pipeline fuzzer's gateway setup (with quotas)


def advertised(node_id: int, _host: str, _port: int) -> tuple[str, int]:
    return "proxy.example.com", 9000 + node_id


def _answer(topics: int, partitions: int, version: int = VERSION) -> dict[str, Any]:
    """Brokers 1-2-3 (and one with no address), the broker's throttle 5 ms."""
    return answer_of(version, [(uuid.UUID(int=t + 1).bytes, f"topic-{t}") for t in range(topics)], partitions)


def _broker_frame(answer: dict[str, Any], correlation_id: int = 42, version: int = VERSION) -> bytes:
    frame = encode_response_header(ApiKey.METADATA, version, correlation_id)
    frame += messages.encode_response(ApiKey.METADATA, version, answer)
    return bytes(frame)


def _stage() -> AddressStage:
    server = SimpleNamespace(
        brokers=SimpleNamespace(advertised=advertised), topic_names=TopicNames(), metrics=ProxyMetrics()
    )
    return AddressStage(SimpleNamespace(server=server))


def _passed_on(frame: bytes, throttle_ms: int = 0, version: int = VERSION) -> tuple[Response, bytes]:
    entry = InFlight(ApiKey.METADATA, version, 42, 0.0)
    entry.throttle_ms = throttle_ms
    resp = Response(entry, frame)
    assert _stage().on_response(resp) is False
    head = resp.finished()
    tail = resp.tail
    return resp, bytes(head) + (bytes(tail) if tail is not None else b"")


def _body(frame: bytes, version: int = VERSION) -> dict[str, Any]:
    hsize = response_header_size(ApiKey.METADATA, version, frame)
    return messages.decode_response(ApiKey.METADATA, version, memoryview(frame)[hsize:])


def _rewritten(answer: dict[str, Any], version: int = VERSION) -> dict[str, Any]:
    expected = _body(_broker_frame(answer, version=version), version)
    messages.rewrite_addresses(ApiKey.METADATA, version, expected, advertised)
    return expected


@pytest.mark.parametrize("version", VERSIONS)
def test_the_topics_go_out_as_the_brokers_bytes_behind_the_rewritten_brokers(version: int) -> None:
    answer = _answer(topics=20, partitions=50, version=version)
    frame = _broker_frame(answer, version=version)
    resp, out = _passed_on(frame, version=version)
    assert resp.tail is not None and resp.tail.obj is frame  # a view of the broker's frame
    assert len(resp.frame) < 200  # what was copied: the header and the broker list
    assert not resp.decoded
    assert _body(out, version) == _rewritten(answer, version)


@pytest.mark.parametrize("version", THROTTLED)
@pytest.mark.parametrize("throttle_ms", [1, 5, 2500])
def test_a_throttled_answer_is_patched_without_its_topics_being_decoded(
    throttle_ms: int, version: int
) -> None:
    answer = _answer(topics=20, partitions=50, version=version)
    resp, out = _passed_on(_broker_frame(answer, version=version), throttle_ms, version)
    assert not resp.decoded and resp.tail is not None
    expected = _rewritten(answer, version)
    expected["throttle_time_ms"] = max(throttle_ms, 5)  # the broker's own, if it is longer
    assert _body(out, version) == expected


def test_an_answer_older_than_throttle_time_goes_out_unpatched_when_throttled() -> None:
    answer = _answer(topics=3, partitions=4, version=2)
    _resp, out = _passed_on(_broker_frame(answer, version=2), 2500, version=2)
    assert "throttle_time_ms" not in _body(out, 2)  # v2 has none: the mute alone throttles
    assert _body(out, 2) == _rewritten(answer, 2)


def test_a_stage_that_reads_the_answer_after_the_rewrite_sees_all_of_it() -> None:
    answer = _answer(topics=5, partitions=7)
    entry = InFlight(ApiKey.METADATA, VERSION, 42, 0.0)
    resp = Response(entry, _broker_frame(answer))
    _stage().on_response(resp)
    size = resp.size
    body = resp.body  # joins the tail back to the frame
    assert resp.tail is None and len(resp.frame) == size
    assert body == _rewritten(answer)
    resp.reencode = True
    assert _body(bytes(resp.finished())) == _rewritten(answer)


def _metadata_request(correlation_id: int) -> bytes:
    header = encode_request_header(RequestHeader(ApiKey.METADATA, VERSION, correlation_id, "meta-client", 0))
    body = messages.encode(
        ApiKey.METADATA,
        VERSION,
        {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
        response=False,
    )
    frame = bytes(header) + bytes(body)
    return struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("reads", [0, 4], ids=["plain-reads", "buffered-reads"])
def test_a_large_answer_reaches_the_client_whole_through_the_pipeline(reads: int) -> None:
    """Through a real Pipeline (in-memory transports): the client gets one frame, its size
    prefix counting the tail, with the proxy's addresses and every partition the broker sent."""
    answer = _answer(topics=40, partitions=60)  # about 150 KB: larger than one write's batch
    frame = _broker_frame(answer, correlation_id=7)
    framed = struct.pack(">i", len(frame)) + frame
    data = bytes([GATEWAY + reads]) + _rec(0, _metadata_request(7))
    for pos in range(0, len(framed), 60_000):
        data += _rec(2, framed[pos : pos + 60_000])
    client = shared_fuzzer().run(data)
    assert client is not None
    frames = [bytes(f) for f in FrameDecoder(2**31 - 1).feed(client.written)]
    assert len(frames) == 1
    got = _body(frames[0])
    assert struct.unpack_from(">i", frames[0])[0] == 7
    brokers = [(b["host"], b["port"]) for b in got["brokers"]]
    assert brokers == [("proxy.example", 19100 + n) for n in (1, 2, 3)] + [("", -1)]
    assert got["topics"] == _body(frame)["topics"]
    assert got["throttle_time_ms"] >= 5
