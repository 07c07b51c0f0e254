"""Large frames go through as they arrive, byte for byte, and answers the proxy makes itself
still come in their turn: a real Pipeline on in-memory transports (fuzz/fakenet.py), driven by
the pipeline fuzzer's records, with frames split the way a socket may split them."""

from __future__ import annotations

import struct

from dev.loadgen import produce_request
from fuzz.pipeline_target import shared_fuzzer
from protocol.frames import FrameDecoder
from protocol.produce_scan import read_produce_acks

SIDECAR = b"\x00"  # the fuzzer's first setup: a sidecar without quotas


def _rec(op: int, data: bytes = b"") -> bytes:
    return struct.pack(">BH", op, len(data)) + data


def _split(data: bytes, *cuts: int) -> list[bytes]:
    out, pos = [], 0
    for cut in (*cuts, len(data)):
        out.append(data[pos:cut])
        pos = cut
    return out


def _frames(data: bytes | bytearray) -> list[bytes]:
    return [bytes(f) for f in FrameDecoder(2**31 - 1).feed(data)]


def test_a_large_produce_reaches_the_broker_whole_and_its_answer_comes_back() -> None:
    request = bytes(produce_request("t", 7, bytes(range(256)) * 40, "streamer"))  # ~10 KiB
    assert len(request) > 4096
    answer = struct.pack(">i", 7) + b"\x00" * 2000  # the broker's bytes, whatever they say
    framed = struct.pack(">i", len(answer)) + answer
    data = SIDECAR
    for part in _split(request, 700, 3000, 8000):
        data += _rec(0, part)
    for part in _split(framed, 900):
        data += _rec(2, part)
    fuzzer = shared_fuzzer()
    client = fuzzer.run(data)
    assert client is not None
    (broker,) = fuzzer.brokers
    assert _frames(broker.transport.written) == [request[4:]]
    assert _frames(client.written) == [answer]


def test_a_local_answer_waits_for_the_response_being_streamed() -> None:
    """ApiVersions v99 is answered by the proxy itself (UNSUPPORTED_VERSION); read while an
    earlier request's large response is half through, it goes out after that response."""
    fetch = struct.pack(">hhih", 1, 4, 41, 2) + b"fe"  # Fetch v4 (no stage reads it here)
    api_versions = struct.pack(">hhih", 18, 99, 42, 2) + b"av\x00"
    big = struct.pack(">i", 41) + bytes(range(256)) * 20  # ~5 KiB, arriving in two parts
    framed = struct.pack(">i", len(big)) + big
    data = SIDECAR + _rec(0, struct.pack(">i", len(fetch)) + fetch)
    first, rest = _split(framed, 1500)
    data += _rec(2, first)
    data += _rec(0, struct.pack(">i", len(api_versions)) + api_versions)
    data += _rec(2, rest)
    client = shared_fuzzer().run(data)
    assert client is not None
    frames = _frames(client.written)
    assert len(frames) == 2
    assert frames[0] == big
    assert struct.unpack_from(">ih", frames[1]) == (42, 35)  # UNSUPPORTED_VERSION, after it


def _fetch_v17_answer(correlation_id: int, endpoints: bool) -> bytes:
    from protocol import messages
    from protocol.frames import encode_response_header

    body: dict[str, object] = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic_id": bytes(range(16)),
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": 0,
                        "high_watermark": 10,
                        "last_stable_offset": 10,
                        "log_start_offset": 0,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": bytes(range(256)) * 24,
                    },
                    {
                        "partition_index": 1,
                        "error_code": 6,  # NOT_LEADER_OR_FOLLOWER: its new leader is named below
                        "high_watermark": -1,
                        "last_stable_offset": -1,
                        "log_start_offset": -1,
                        "current_leader": {"leader_id": 2, "leader_epoch": 4},
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": None,
                    },
                ],
            }
        ],
    }
    if endpoints:
        body["node_endpoints"] = [{"node_id": 2, "host": "broker-2.internal", "port": 9092, "rack": None}]
    return bytes(encode_response_header(1, 17, correlation_id) + messages.encode_response(1, 17, body))


def test_a_streamed_fetch_never_shows_the_client_a_broker_address() -> None:
    """Fetch v16+ may end with new leaders' addresses (KIP-951): a streamed response goes out as
    it arrives up to there; the addresses are withheld (same length, the client asks Metadata
    through the proxy instead); one without them goes out byte for byte."""
    from protocol import messages
    from protocol.frames import response_header_size

    fetch = struct.pack(">hhih", 1, 17, 51, 2) + b"fe\x00"  # Fetch v17, header v2
    for endpoints in (False, True):
        answer = _fetch_v17_answer(51, endpoints)
        framed = struct.pack(">i", len(answer)) + answer
        data = SIDECAR + _rec(0, struct.pack(">i", len(fetch)) + fetch)
        for part in _split(framed, 1000, 3000, len(framed) - 20):
            data += _rec(2, part)
        fuzzer = shared_fuzzer()
        withheld = fuzzer.servers[0].metrics.node_endpoints_withheld._value.get()
        client = fuzzer.run(data)
        assert client is not None
        (got,) = _frames(client.written)
        assert len(got) == len(answer)
        body = messages.decode_response(1, 17, memoryview(got)[response_header_size(1, 17, got) :])
        assert messages.response_addresses(1, 17, body) == []
        assert b"broker-2.internal" not in got
        assert (got == answer) == (not endpoints)
        assert fuzzer.servers[0].metrics.node_endpoints_withheld._value.get() == withheld + endpoints
        assert body["responses"][0]["partitions"][0]["records"] == bytes(range(256)) * 24


def test_every_forwarded_request_is_counted_acks_zero_and_streamed_included() -> None:
    """kthrottle_requests_total and request bytes count what went upstream, whether a response
    comes (acks=1), none does (acks=0), or the frame was streamed (split across reads)."""
    from protocol.api_keys import ApiKey
    from protocol.frames import parse_request_header

    small = bytes(produce_request("t", 8, b"v" * 100, "counted"))
    header = parse_request_header(memoryview(small)[4:])
    acks_at = 4 + header.size + 1  # Produce v9: compact nullable transactional id (null: one byte)
    assert read_produce_acks(9, memoryview(small)[4 + header.size :]) == 1
    acks_zero = bytearray(small)
    acks_zero[acks_at : acks_at + 2] = (0).to_bytes(2, "big")
    assert read_produce_acks(9, memoryview(acks_zero)[4 + header.size :]) == 0
    large = bytes(produce_request("t", 9, bytes(range(256)) * 40, "counted"))
    data = SIDECAR + _rec(0, small) + _rec(0, bytes(acks_zero))
    for part in _split(large, 700, 3000):
        data += _rec(0, part)
    fuzzer = shared_fuzzer()
    traffic = fuzzer.servers[0].metrics.traffic.api(ApiKey.PRODUCE)
    requests, nbytes = traffic.requests, traffic.request_bytes
    fuzzer.run(data)
    assert traffic.requests - requests == 3
    assert traffic.request_bytes - nbytes == len(small) + len(acks_zero) + len(large)
