"""NodeEndpoints (KIP-951) found at the end of Produce v10+ and Fetch v16+ responses without
decoding them, however the frame is split, and withheld in place when a streamed response
carries them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import encode_response_header, response_header_size
from protocol.node_endpoints import (
    TailFinder,
    has_node_endpoints,
    node_endpoints_at,
    tail_of,
    withhold_node_endpoints,
)
from protocol.schema import SchemaError

ENDPOINTS = [
    {"node_id": 1, "host": "broker-1.kafka.internal", "port": 9092, "rack": None},
    {"node_id": 2, "host": "broker-2.kafka.internal", "port": 9092, "rack": "r2"},
]


def _fetch(version: int, endpoints: bool, record_sizes: list[int]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "throttle_time_ms": 5,
        "error_code": 0,
        "session_id": 7,
        "responses": [
            {
                "topic_id": bytes(range(16)),
                "topic": "orders",
                "partitions": [
                    {
                        "partition_index": i,
                        "error_code": 6 if size < 0 else 0,
                        "high_watermark": 10,
                        "last_stable_offset": 10,
                        "log_start_offset": 0,
                        "current_leader": {"leader_id": 2, "leader_epoch": 3},
                        "aborted_transactions": [{"producer_id": 1, "first_offset": 2}] if i % 2 else None,
                        "preferred_read_replica": -1,
                        "records": bytes(i % 251 for i in range(size)) if size >= 0 else None,
                    }
                    for i, size in enumerate(record_sizes)
                ],
            }
        ],
    }
    if endpoints:
        body["node_endpoints"] = ENDPOINTS
    return body


def _produce(version: int, endpoints: bool, partitions: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "responses": [
            {
                "name": "orders",
                "topic_id": bytes(range(16)),
                "partition_responses": [
                    {
                        "index": i,
                        "error_code": 6 if i == 0 else 0,
                        "base_offset": 100,
                        "log_append_time_ms": -1,
                        "log_start_offset": 0,
                        "record_errors": [{"batch_index": 0, "batch_index_error_message": "bad"}]
                        if i == 1
                        else [],
                        "error_message": "not the leader" if i == 0 else None,
                        "current_leader": {"leader_id": 2, "leader_epoch": 3},
                    }
                    for i in range(partitions)
                ],
            }
        ],
        "throttle_time_ms": 0,
    }
    if endpoints:
        body["node_endpoints"] = ENDPOINTS
    return body


def _frame(key: int, version: int, body: dict[str, Any]) -> bytes:
    return bytes(encode_response_header(key, version, 42) + messages.encode_response(key, version, body))


def _decoded(key: int, version: int, frame: bytes | bytearray) -> dict[str, Any]:
    hsize = response_header_size(key, version, frame)
    return messages.decode_response(key, version, memoryview(frame)[hsize:])


CASES = [(ApiKey.FETCH, v) for v in (16, 17, 18)] + [(ApiKey.PRODUCE, v) for v in (10, 11, 12, 13)]
# A response of a case: with or without NodeEndpoints, its partitions' records (-1: an error).
RESPONSES = {
    "case": st.sampled_from(CASES),
    "endpoints": st.booleans(),
    "record_sizes": st.lists(st.integers(-1, 3000), min_size=0, max_size=4),
}


def _case_frame(case: tuple[int, int], endpoints: bool, record_sizes: list[int]) -> bytes:
    key, version = case
    if key == ApiKey.FETCH:
        return _frame(key, version, _fetch(version, endpoints, record_sizes))
    return _frame(key, version, _produce(version, endpoints, len(record_sizes)))


@settings(max_examples=150, deadline=None)
@given(**RESPONSES, cuts=st.lists(st.integers(1, 2000), min_size=1, max_size=20))
def test_the_tail_is_found_however_the_frame_is_split(
    case: tuple[int, int], endpoints: bool, record_sizes: list[int], cuts: list[int]
) -> None:
    key, version = case
    frame = _case_frame(case, endpoints, record_sizes)
    whole = TailFinder(key, version)
    assert whole.feed(frame) == whole.tail_at
    assert whole.tail_at is not None
    split = TailFinder(key, version)
    pos = forwarded = i = 0
    while pos < len(frame):
        n = min(cuts[i % len(cuts)], len(frame) - pos)
        i += 1
        forwarded += split.feed(memoryview(frame)[pos : pos + n])
        pos += n
    assert split.tail_at == whole.tail_at == forwarded == len(frame) - len(tail_of(key, version, frame))
    assert len(tail_of(key, version, frame, copy_limit=0)) == len(frame) - whole.tail_at  # walked in place
    assert (node_endpoints_at(frame[whole.tail_at :]) is not None) == endpoints
    assert has_node_endpoints(key, version, frame) == endpoints


@pytest.mark.parametrize(("key", "version"), CASES)
def test_withheld_endpoints_leave_a_response_clients_read_without_them(key: int, version: int) -> None:
    body = _fetch(version, True, [100, -1]) if key == ApiKey.FETCH else _produce(version, True, 2)
    frame = bytearray(_frame(key, version, body))
    before = _decoded(key, version, frame)
    brokers = [("broker-1.kafka.internal", 9092), ("broker-2.kafka.internal", 9092)]
    assert messages.response_addresses(key, version, before) == brokers
    tail = tail_of(key, version, frame)
    assert withhold_node_endpoints(tail)
    after = _decoded(key, version, frame)
    assert len(frame) == len(_frame(key, version, body))  # same length: the size prefix holds
    assert messages.response_addresses(key, version, after) == []
    assert b"broker-1" not in frame and b"broker-2" not in frame
    assert after["responses"] == before["responses"]
    assert not withhold_node_endpoints(tail_of(key, version, frame))
    assert not withhold_node_endpoints(tail_of(key, version, frame, copy_limit=0))


def test_a_truncated_response_is_refused() -> None:
    frame = _frame(ApiKey.FETCH, 17, _fetch(17, False, [500]))
    with pytest.raises(SchemaError):
        tail_of(ApiKey.FETCH, 17, frame[:-40])
    with pytest.raises(SchemaError):
        tail_of(ApiKey.FETCH, 17, frame[:-40], copy_limit=0)


@settings(max_examples=100, deadline=None)
@given(**RESPONSES, bites=st.lists(st.integers(1, 700), min_size=1, max_size=10))
def test_skipped_spans_find_the_same_tail(
    case: tuple[int, int], endpoints: bool, record_sizes: list[int], bites: list[int]
) -> None:
    """What the walk skips may go by unseen (spliced, in part or whole): the tail is found at
    the same place as when every byte is fed."""
    key, version = case
    frame = _case_frame(case, endpoints, record_sizes)
    fed = TailFinder(key, version)
    fed.feed(frame)
    walked = TailFinder(key, version)
    pos = i = skipped = 0
    while walked.tail_at is None:
        bite = bites[i % len(bites)]
        i += 1
        span = walked.skippable()
        if span:
            n = min(span, bite)
            walked.skip(n)
            skipped += n
        else:
            n = min(bite, len(frame) - pos)
            walked.feed(frame[pos : pos + n])
        pos += n
    assert walked.tail_at == fed.tail_at
    assert walked.consumed == fed.tail_at
    assert skipped >= min(4, bites[0])  # the correlation id, at least


def test_only_what_the_walk_skips_may_be_skipped() -> None:
    finder = TailFinder(ApiKey.FETCH, 17)
    assert finder.skippable() == 4  # the correlation id
    with pytest.raises(ValueError, match="cannot skip 5"):
        finder.skip(5)
    finder.skip(4)
    assert finder.skippable() == 0  # the response header's tagged fields are read
    with pytest.raises(ValueError, match="cannot skip 1"):
        finder.skip(1)
