"""Metadata's broker list rewritten without decoding the topics: the same answer, byte for byte, as
decoding the whole response, rewriting and encoding it again, at every version; and topic ids
learned from the kept bytes only when an unknown one is met."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.metadata_brokers import MAX_VERSION, rewrite_metadata_brokers
from protocol.schema import UNKNOWN_TAGS, SchemaError
from proxy.shared.topic_names import TopicNames

_KNOWN = messages.response_codec_versions(ApiKey.METADATA)
assert _KNOWN is not None
VERSIONS = range(_KNOWN[0], _KNOWN[1] + 1)


def amap(node_id: int, _host: str, _port: int) -> tuple[str, int]:
    return "proxy.example.com", 9000 + node_id


def _answer(version: int, topics: list[tuple[bytes, str]], partitions: int = 3) -> dict[str, Any]:
    flexible = version >= 9
    brokers: list[dict[str, Any]] = [
        {"node_id": n, "host": f"broker-{n}.internal", "port": 9092, "rack": "rack-a" if n % 2 else None}
        for n in (1, 2, 3)
    ]
    brokers.append({"node_id": -1, "host": "", "port": -1, "rack": None})  # no address to rewrite
    if flexible:
        brokers[0][UNKNOWN_TAGS] = {7: b"keep-me"}
    return {
        "throttle_time_ms": 5,
        "brokers": brokers,
        "cluster_id": "cluster-x",
        "controller_id": 2,
        "topics": [
            {
                "error_code": 0,
                "name": name,
                "topic_id": tid,
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": 0,
                        "partition_index": p,
                        "leader_id": 1 + p % 3,
                        "leader_epoch": 4,
                        "replica_nodes": [1, 2, 3],
                        "isr_nodes": [1, 2],
                        "offline_replicas": [3],
                    }
                    for p in range(partitions)
                ],
            }
            for tid, name in topics
        ],
        **({UNKNOWN_TAGS: {40: b"top-level"}} if flexible else {}),
    }


def _spliced(version: int, wire: bytes) -> tuple[bytes, int]:
    body = memoryview(wire)
    prefix, rest, changed = rewrite_metadata_brokers(version, body, amap)
    return bytes(prefix) + bytes(body[rest:]), changed


def test_the_layout_is_known_for_every_version_the_codec_reads() -> None:
    assert VERSIONS[-1] <= MAX_VERSION and VERSIONS[0] == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_the_splice_equals_a_full_rewrite(version: int) -> None:
    answer = _answer(version, [(uuid.uuid4().bytes, "orders"), (uuid.uuid4().bytes, "payments")])
    wire = bytes(messages.encode(ApiKey.METADATA, version, answer, response=True))
    decoded = messages.decode_response(ApiKey.METADATA, version, wire)
    full_count = messages.rewrite_addresses(ApiKey.METADATA, version, decoded, amap)
    expected = bytes(messages.encode_response(ApiKey.METADATA, version, decoded))
    got, count = _spliced(version, wire)
    assert (got, count) == (expected, full_count) and count == 3
    seen = messages.decode_response(ApiKey.METADATA, version, got)
    assert [(b["host"], b["port"]) for b in seen["brokers"][:3]] == [
        ("proxy.example.com", 9001 + i) for i in range(3)
    ]


@pytest.mark.parametrize("version", [0, 9, MAX_VERSION])
def test_a_truncated_broker_list_is_refused(version: int) -> None:
    wire = bytes(messages.encode(ApiKey.METADATA, version, _answer(version, []), response=True))
    for cut in (3, 10, 20):
        with pytest.raises(SchemaError):
            rewrite_metadata_brokers(version, memoryview(wire[:cut]), amap)


def test_a_version_newer_than_the_layout_is_refused() -> None:
    with pytest.raises(SchemaError):
        rewrite_metadata_brokers(MAX_VERSION + 1, memoryview(b""), amap)


def test_ids_are_read_from_kept_answers_only_when_one_is_unknown() -> None:
    unreadable: list[int] = []
    names = TopicNames(on_unreadable=lambda: unreadable.append(1))
    orders, payments = uuid.uuid4().bytes, uuid.uuid4().bytes
    first = messages.encode(ApiKey.METADATA, 12, _answer(12, [(orders, "orders")]), response=True)
    names.learn_later(12, memoryview(first))
    names.learn_later(9, memoryview(b"no ids before v10: not kept"))
    assert len(names) == 0  # nothing read yet
    assert names.name(orders) == "orders"
    renamed = messages.encode(ApiKey.METADATA, 12, _answer(12, [(payments, "orders")]), response=True)
    names.learn_later(12, memoryview(renamed))  # deleted and re-created: a new id
    names.learn_later(12, memoryview(b"\x00\x00\x00\x00\x05broken"))
    assert names.name(payments) == "orders" and names.name(orders) is None
    assert unreadable == [1]


def test_kept_answers_stay_bounded() -> None:
    names = TopicNames(max_pending_bytes=1000)
    ids = [uuid.uuid4().bytes for _ in range(20)]
    for i, tid in enumerate(ids):
        names.learn_later(
            12, memoryview(messages.encode(ApiKey.METADATA, 12, _answer(12, [(tid, f"t{i}")]), response=True))
        )
    assert names.name(ids[-1]) == "t19"
    assert names.name(ids[0]) is None  # dropped unread: the proxy's own lookup finds it
