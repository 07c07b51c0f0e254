"""Address rewriting, ApiVersions intersection, in-place throttle patching, batch headers."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.frames import FrameDecoder, FrameError, FrameTooLarge, LastClientId, parse_request_header
from protocol.produce_scan import read_produce_acks
from protocol.records import iter_batches, producer_ids
from protocol.schema import UNKNOWN_TAGS, SchemaError
from protocol.versions import codec_versions

PROXY = ("proxy.example", 7000)


def amap(node_id: int, _host: str, _port: int) -> tuple[str, int]:
    return PROXY[0], PROXY[1] + node_id


def _roundtrip(api_key: int, version: int, obj: dict[str, Any]) -> dict[str, Any]:
    """Encode as the broker would, decode and rewrite as the proxy does, decode what the client gets."""
    wire = messages.encode(api_key, version, obj, response=True)
    decoded = messages.decode_response(api_key, version, wire)
    messages.rewrite_addresses(api_key, version, decoded, amap)
    return messages.decode_response(api_key, version, messages.encode_response(api_key, version, decoded))


def test_metadata_rewrite_keeps_unknown_tags() -> None:
    resp = {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": 1, "host": "10.0.0.1", "port": 9092, "rack": "a", UNKNOWN_TAGS: {9: b"keep-me"}},
            {"node_id": 2, "host": "10.0.0.2", "port": 9092, "rack": None},
        ],
        "cluster_id": "abc",
        "controller_id": 1,
        "topics": [],
        UNKNOWN_TAGS: {42: b"\x00\x01top"},
    }
    out = _roundtrip(ApiKey.METADATA, 12, resp)
    assert [(b["host"], b["port"]) for b in out["brokers"]] == [
        ("proxy.example", 7001),
        ("proxy.example", 7002),
    ]
    assert out["brokers"][0][UNKNOWN_TAGS] == {9: b"keep-me"}
    assert out[UNKNOWN_TAGS] == {42: b"\x00\x01top"}
    assert out["brokers"][0]["rack"] == "a"


@pytest.mark.parametrize("version", [0, 3])
def test_find_coordinator_single(version: int) -> None:
    resp = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "node_id": 3,
        "host": "b3",
        "port": 1,
    }
    out = _roundtrip(ApiKey.FIND_COORDINATOR, version, resp)
    assert (out["host"], out["port"]) == ("proxy.example", 7003)


def test_find_coordinator_error_left_alone() -> None:
    resp = {
        "throttle_time_ms": 0,
        "error_code": 15,
        "error_message": "x",
        "node_id": -1,
        "host": "",
        "port": -1,
    }
    out = _roundtrip(ApiKey.FIND_COORDINATOR, 3, resp)
    assert (out["host"], out["port"]) == ("", -1)


def test_find_coordinator_batched() -> None:
    resp = {
        "throttle_time_ms": 0,
        "coordinators": [
            {"key": "g1", "node_id": 2, "host": "b2", "port": 1, "error_code": 0, "error_message": None},
            {"key": "g2", "node_id": -1, "host": "", "port": -1, "error_code": 15, "error_message": None},
        ],
    }
    out = _roundtrip(ApiKey.FIND_COORDINATOR, 4, resp)
    assert [(c["host"], c["port"]) for c in out["coordinators"]] == [("proxy.example", 7002), ("", -1)]


def test_describe_cluster() -> None:
    resp = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "cluster_id": "c",
        "controller_id": 1,
        "brokers": [{"broker_id": 5, "host": "b5", "port": 9092, "rack": None}],
        "cluster_authorized_operations": 0,
    }
    out = _roundtrip(ApiKey.DESCRIBE_CLUSTER, 0, resp)
    assert (out["brokers"][0]["host"], out["brokers"][0]["port"]) == ("proxy.example", 7005)


@pytest.mark.parametrize(
    ("api_key", "version"), [(ApiKey.PRODUCE, 10), (ApiKey.PRODUCE, 12), (ApiKey.FETCH, 16)]
)
def test_node_endpoints_in_produce_and_fetch(api_key: int, version: int) -> None:
    endpoints = [{"node_id": 2, "host": "10.1.1.2", "port": 9092, "rack": None}]
    if api_key == ApiKey.PRODUCE:
        resp: dict[str, Any] = {"responses": [], "throttle_time_ms": 0, "node_endpoints": endpoints}
    else:
        resp = {
            "throttle_time_ms": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [],
            "node_endpoints": endpoints,
        }
    out = _roundtrip(api_key, version, resp)
    assert [(e["host"], e["port"]) for e in out["node_endpoints"]] == [("proxy.example", 7002)]
    assert messages.response_addresses(api_key, version, out) == [("proxy.example", 7002)]


def test_api_versions_intersection() -> None:
    resp = {
        "error_code": 0,
        "api_keys": [
            {
                "api_key": 0,
                "min_version": 0,
                "max_version": 99,
            },  # produce: max capped, min as the broker says
            {"api_key": 1, "min_version": 0, "max_version": 99},  # fetch: both capped at the codec
            {"api_key": 2, "min_version": 1, "max_version": 10},  # passthrough: kept as is
            {"api_key": 78, "min_version": 0, "max_version": 1},  # ShareFetch: leaks addresses, hidden
            {"api_key": 55, "min_version": 0, "max_version": 2},  # DescribeQuorum: capped below listeners
            {"api_key": 999, "min_version": 0, "max_version": 0},  # unknown: hidden
        ],
        "throttle_time_ms": 0,
    }
    out = messages.intersect_api_versions(resp)
    by_key = {e["api_key"]: (e["min_version"], e["max_version"]) for e in out["api_keys"]}
    produce = codec_versions(ApiKey.PRODUCE)
    assert produce is not None
    fetch = codec_versions(ApiKey.FETCH)
    assert produce is not None and fetch is not None
    assert by_key == {0: (0, produce[1]), 1: fetch, 2: (1, 10), 55: (0, 1)}


def test_api_versions_unsupported_answer_is_v0() -> None:
    body = messages.encode_response(ApiKey.API_VERSIONS, 4, messages.unsupported_api_versions_response())
    decoded = messages.decode_response(ApiKey.API_VERSIONS, 4, body)
    assert decoded["error_code"] == ErrorCode.UNSUPPORTED_VERSION
    assert decoded["api_keys"][0]["api_key"] == ApiKey.API_VERSIONS


@pytest.mark.parametrize(
    ("api_key", "version"), [(ApiKey.PRODUCE, 9), (ApiKey.PRODUCE, 5), (ApiKey.FETCH, 12)]
)
def test_throttle_patched_in_place(api_key: int, version: int) -> None:
    if api_key == ApiKey.PRODUCE:
        resp: dict[str, Any] = {
            "responses": [
                {"name": "t", "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 5}]}
            ],
            "throttle_time_ms": 3,
        }
    else:
        resp = {"throttle_time_ms": 3, "error_code": 0, "session_id": 1, "responses": []}
    body = messages.encode(api_key, version, resp, response=True)
    before = bytes(body)
    assert messages.patch_throttle_time(api_key, version, body, 250) == 250
    assert len(body) == len(before)
    assert messages.decode_response(api_key, version, body)["throttle_time_ms"] == 250
    assert messages.patch_throttle_time(api_key, version, body, 10) == 250  # never lowered


def _batch(producer_id: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for i in range(3):
        builder.append(i, timestamp=1000 + i, key=b"k", value=b"v" * 10, headers=[])
    return bytes(builder.build())


def test_batch_headers_give_sizes_counts_and_producer_ids() -> None:
    records = _batch(4242) + _batch(-1) + _batch(77)
    batches = list(iter_batches(records))
    assert [b.record_count for b in batches] == [3, 3, 3]
    assert sum(b.size for b in batches) == len(records)
    assert producer_ids(records) == {4242, 77}
    # A trailing partial batch (as in fetch responses) is not reported.
    assert len(list(iter_batches(records[:-5]))) == 2


def test_produce_request_summary() -> None:
    records = _batch(9)
    req = {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}],
    }
    wire = messages.encode(ApiKey.PRODUCE, 9, req, response=False)
    decoded = messages.decode_request(ApiKey.PRODUCE, 9, wire)
    (part,) = messages.produce_request_partitions(decoded)
    assert (part.topic, part.partition, part.size, part.record_count) == ("t", 0, len(records), 3)
    assert part.producer_ids == {9}
    assert messages.produce_acks(decoded) == -1


def test_frame_decoder_limits_and_splits() -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    frames = dec.feed(b"\x00\x00\x00\x03ab")
    assert frames == [] and dec.mid_frame and dec.buffered == 6
    assert dec.feed(b"c\x00\x00\x00\x01z") == [bytearray(b"abc"), bytearray(b"z")]
    with pytest.raises(FrameTooLarge):
        FrameDecoder(max_frame_bytes=1024).feed(b"\x00\x00\x04\x01")


def test_request_header_v2_keeps_tagged_fields() -> None:
    raw = b"\x00\x12\x00\x03\x00\x00\x00\x07\x00\x02id" + b"\x01\x05\x02hi" + b"body"
    header = parse_request_header(raw)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (18, 3, 7, "id")
    assert header.tagged == b"\x01\x05\x02hi"
    assert raw[header.size :] == b"body"


@pytest.mark.parametrize("transactional_id", [None, "", "tx-é-1"])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_acks_read_without_decoding(acks: int, transactional_id: str | None) -> None:
    """Every Produce version the proxy knows: the acks read straight from the bytes are the decoded ones."""
    known = codec_versions(ApiKey.PRODUCE)
    assert known is not None
    for version in range(known[0], known[1] + 1):
        req = {
            "transactional_id": transactional_id,
            "acks": acks,
            "timeout_ms": 1000,
            "topic_data": [{"name": "t", "topic_id": b"\x01" * 16, "partition_data": []}],
        }
        wire = messages.encode(ApiKey.PRODUCE, version, req, response=False)
        expected = messages.produce_acks(messages.decode_request(ApiKey.PRODUCE, version, wire))
        assert read_produce_acks(version, wire) == expected == acks, f"v{version}"
        assert read_produce_acks(version, b"header" + wire, len(b"header")) == acks  # a whole frame


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_produce_acks_of_a_truncated_body_are_a_schema_error(version: int) -> None:
    """A body that ends before its acks is malformed input (the connection is closed as such),
    never an IndexError out of the byte reads."""
    bodies = [b"", b"\x00", b"\x00\x00"]
    if version < 9:
        bodies.append(b"\x00\x05tx")  # a transactional_id of 5 bytes, 2 there
    for body in bodies:
        with pytest.raises(SchemaError):
            read_produce_acks(version, body)
        with pytest.raises(SchemaError):
            read_produce_acks(version, bytearray(b"head" + body), 4)


def test_a_repeated_client_id_is_read_again_without_a_decode_and_a_changed_one_is_decoded() -> None:
    """The connection's last client id stands in while the bytes are the same; an id of the
    same length but other bytes, or one that is not UTF-8, is read as if nothing was kept."""

    def request(client_id: bytes, correlation_id: int = 7) -> bytearray:
        head = struct.pack(">hhih", 0, 9, correlation_id, len(client_id))
        return bytearray(head + client_id + b"\x00" + b"body")

    last = LastClientId()
    first = parse_request_header(request(b"app-1"), last)
    assert first.client_id == "app-1" and (last.raw, last.text) == (b"app-1", "app-1")
    again = parse_request_header(request(b"app-1", 8), last)
    assert again.client_id is first.client_id and again.correlation_id == 8
    assert again.size == first.size and request(b"app-1")[again.size :] == b"body"
    other = parse_request_header(request(b"app-2"), last)
    assert other.client_id == "app-2" and last.raw == b"app-2"
    with pytest.raises(FrameError, match="UTF-8"):
        parse_request_header(request(b"app-\xff"), last)
    assert parse_request_header(bytes(request(b"app-2")), last).client_id == "app-2"  # not a bytearray
    assert parse_request_header(memoryview(request(b"app-2")), last).client_id == "app-2"


def test_a_header_is_read_the_same_from_bytes_a_bytearray_or_a_view_and_a_huge_one_is_refused() -> None:
    """Frames are ``bytes``, read natively; a large frame's buffer or a streamed head is read
    from a copy of its first 64 KiB, so a header longer than that (a client id is at most
    32,767 bytes) is refused with the reason, not misread."""
    tags = b"\x01\x05\x03xyz"  # one unknown tagged field in a v2 header
    wire = struct.pack(">hhih", 0, 9, 5, 3) + b"app" + tags + b"body"
    headers = [parse_request_header(kind(wire)) for kind in (bytes, bytearray, memoryview)]
    assert {(h.api_key, h.api_version, h.correlation_id, h.client_id, h.size, h.tagged) for h in headers} == {
        (0, 9, 5, "app", 13 + len(tags), tags)
    }
    huge_tags = b"\x01\x05" + bytes([0xF0, 0xA2, 0x04]) + bytes(70_000)  # a 70,000-byte field
    huge = struct.pack(">hhih", 0, 9, 5, 3) + b"app" + huge_tags
    assert parse_request_header(huge).size == len(huge)
    with pytest.raises(FrameError, match="bad request header tagged fields"):
        parse_request_header(bytearray(huge))


def test_the_kept_client_id_gives_way_to_a_null_an_empty_a_longer_or_a_truncated_one() -> None:
    """The kept id's bytes are read with the header's fixed fields: a request shorter than the
    kept id, a null (-1) or empty id, or a length that matches the kept one only by chance of
    the bytes after it, are each read as if nothing was kept."""

    def request(length: int, rest: bytes) -> bytearray:
        return bytearray(struct.pack(">hhih", 0, 3, 11, length) + rest)

    last = LastClientId()
    assert parse_request_header(request(0, b""), last).client_id == ""  # nothing kept yet: ""
    assert parse_request_header(request(-1, b"xyz"), last).client_id is None
    assert parse_request_header(request(12, b"a-long-id-12"), last).client_id == "a-long-id-12"
    assert parse_request_header(request(-1, b""), last).client_id is None  # shorter than it
    assert last.raw == b"a-long-id-12"
    assert parse_request_header(request(2, b"ab" + b"-long-id-12"), last).client_id == "ab"
    assert parse_request_header(request(0, b"a-long-id-12"), last).client_id == ""
    with pytest.raises(FrameError, match="truncated client id"):
        parse_request_header(request(12, b"a-long"), last)
    with pytest.raises(FrameError, match="invalid client id length"):
        parse_request_header(request(-2, b"a-long-id-12"), last)
