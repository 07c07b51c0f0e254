"""Topic ids and names walked out of a Metadata answer's bytes agree with the schema decoder's
reading of it, for every version that has ids, with unknown tagged fields anywhere; a truncated
answer is refused, never half read."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.api_keys import ApiKey
from protocol.messages import decode_response, encode_response, metadata_topic_ids
from protocol.metadata_topics import FIRST_VERSION, LAST_VERSION, metadata_topic_ids_from_bytes
from protocol.schema import SchemaError, message_schema
from tests.unit.schema_strategies import struct_strategy

VERSIONS = range(FIRST_VERSION, LAST_VERSION + 1)


def _answers(version: int) -> st.SearchStrategy[dict[str, Any]]:
    return struct_strategy(message_schema("MetadataResponse").fields, version, True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_walk_reads_what_the_decoder_reads(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(VERSIONS))
    answer = data.draw(_answers(version))
    for topic in answer["topics"]:  # ids that are not all zero, names of both kinds
        if data.draw(st.booleans()):
            topic["topic_id"] = data.draw(st.binary(min_size=16, max_size=16))
            topic["error_code"] = data.draw(st.sampled_from([0, 0, 3]))
    body = bytes(encode_response(ApiKey.METADATA, version, answer))
    expected = metadata_topic_ids(decode_response(ApiKey.METADATA, version, body))
    assert metadata_topic_ids_from_bytes(version, body) == expected
    assert metadata_topic_ids_from_bytes(version, memoryview(bytearray(body))) == expected


def _large(version: int, topics: int, partitions: int, brokers: int) -> bytes:
    answer = {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": b, "host": f"broker-{b}.kafka", "port": 9092, "rack": None} for b in range(brokers)
        ],
        "cluster_id": "c",
        "controller_id": 0,
        "topics": [
            {
                "error_code": 0,
                "name": f"topic-{t}",
                "topic_id": struct.pack(">QQ", t + 1, t),
                "is_internal": False,
                "partitions": [
                    {
                        "error_code": 0,
                        "partition_index": p,
                        "leader_id": p % brokers,
                        "leader_epoch": 3,
                        "replica_nodes": [p % brokers, (p + 1) % brokers, (p + 2) % brokers],
                        "isr_nodes": [p % brokers, (p + 1) % brokers],
                        "offline_replicas": [],
                    }
                    for p in range(partitions)
                ],
                "topic_authorized_operations": -2147483648,
            }
            for t in range(topics)
        ],
        "cluster_authorized_operations": -2147483648,
        "error_code": 0,
    }
    return bytes(encode_response(ApiKey.METADATA, version, answer))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_large_answer_gives_every_topic(version: int) -> None:
    body = _large(version, topics=200, partitions=50, brokers=12)
    pairs = metadata_topic_ids_from_bytes(version, body)
    assert pairs == [(struct.pack(">QQ", t + 1, t), f"topic-{t}") for t in range(200)]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_answer_is_refused(version: int) -> None:
    body = _large(version, topics=3, partitions=4, brokers=2)
    assert metadata_topic_ids_from_bytes(version, body)
    for cut in range(len(body)):  # to the last byte of the last field
        with pytest.raises(SchemaError):
            metadata_topic_ids_from_bytes(version, body[:cut])


def test_versions_without_topic_ids_are_refused_by_name() -> None:
    with pytest.raises(SchemaError, match="v9"):
        metadata_topic_ids_from_bytes(9, b"")
