"""The mutation requests and responses as the KIP-599 admission reads and rewrites them."""

from __future__ import annotations

from typing import Any

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.mutations import (
    THROTTLING_QUOTA_EXCEEDED_MESSAGE,
    TopicRef,
    admitted_request,
    merged_response,
    result_errors,
    topics_of,
    validate_only,
)


def _create_body() -> dict[str, object]:
    return {
        "topics": [
            {"name": "a", "num_partitions": 3, "replication_factor": 1, "assignments": [], "configs": []},
            {"name": "b", "num_partitions": -1, "replication_factor": -1, "assignments": [], "configs": []},
            {
                "name": "c",
                "num_partitions": -1,
                "replication_factor": -1,
                "assignments": [{"partition_index": i, "broker_ids": [1]} for i in range(4)],
                "configs": [],
            },
        ],
        "timeout_ms": 1000,
        "validate_only": True,
    }


def test_create_topics_costs_come_from_counts_assignments_or_the_default() -> None:
    refs = topics_of(ApiKey.CREATE_TOPICS, 7, _create_body())
    assert [(r.name, r.partitions) for r in refs] == [("a", 3), ("b", -1), ("c", 4)]
    assert validate_only(ApiKey.CREATE_TOPICS, _create_body())
    assert not validate_only(ApiKey.DELETE_TOPICS, {"validate_only": True})


def test_delete_topics_by_name_and_by_id() -> None:
    assert topics_of(ApiKey.DELETE_TOPICS, 5, {"topic_names": ["x", "y"]}) == [
        TopicRef("x", None, -1),
        TopicRef("y", None, -1),
    ]
    tid = bytes(range(16))
    body = {"topics": [{"name": None, "topic_id": tid}, {"name": "z", "topic_id": bytes(16)}]}
    assert topics_of(ApiKey.DELETE_TOPICS, 6, body) == [TopicRef(None, tid, -1), TopicRef("z", None, -1)]


def test_admitted_request_keeps_order_and_round_trips() -> None:
    body: dict[str, Any] = _create_body()
    kept = admitted_request(ApiKey.CREATE_TOPICS, 7, body, [True, False, True])
    assert [t["name"] for t in kept["topics"]] == ["a", "c"]
    assert [t["name"] for t in body["topics"]] == ["a", "b", "c"]
    wire = messages.encode(ApiKey.CREATE_TOPICS, 7, kept, response=False)
    assert messages.decode_request(ApiKey.CREATE_TOPICS, 7, wire)["topics"][1]["name"] == "c"
    old = admitted_request(
        ApiKey.DELETE_TOPICS, 4, {"topic_names": ["x", "y"], "timeout_ms": 1}, [False, True]
    )
    assert old["topic_names"] == ["y"]


def test_merged_response_puts_the_proxys_errors_in_request_order() -> None:
    refs = [TopicRef("a", None, 3), TopicRef("b", None, 3), TopicRef("c", None, 3)]
    broker = {
        "throttle_time_ms": 5,
        "topics": [{"name": "c", "error_code": 0}, {"name": "a", "error_code": 36}],
    }
    merged = merged_response(ApiKey.CREATE_TOPICS, refs, [True, False, True], broker, 4000)
    assert [(t["name"], t["error_code"]) for t in merged["topics"]] == [
        ("a", ErrorCode.TOPIC_ALREADY_EXISTS),
        ("b", ErrorCode.THROTTLING_QUOTA_EXCEEDED),
        ("c", ErrorCode.NONE),
    ]
    assert merged["topics"][1]["error_message"] == THROTTLING_QUOTA_EXCEEDED_MESSAGE
    assert merged["throttle_time_ms"] == 4000
    wire = messages.encode(ApiKey.CREATE_TOPICS, 7, merged, response=True)
    assert messages.decode_response(ApiKey.CREATE_TOPICS, 7, wire)["topics"][1]["error_code"] == 89


def test_proxy_answers_alone_when_nothing_is_admitted() -> None:
    tid = bytes(range(16))
    refs = [TopicRef(None, tid, -1)]
    alone = merged_response(ApiKey.DELETE_TOPICS, refs, [False], None, 1234)
    assert alone["throttle_time_ms"] == 1234
    assert alone["responses"][0]["topic_id"] == tid
    wire = messages.encode(ApiKey.DELETE_TOPICS, 6, alone, response=True)
    assert messages.decode_response(ApiKey.DELETE_TOPICS, 6, wire)["responses"][0]["error_code"] == 89
    partitions = merged_response(ApiKey.CREATE_PARTITIONS, [TopicRef("p", None, 5)], [False], None, 1)
    wire = messages.encode(ApiKey.CREATE_PARTITIONS, 3, partitions, response=True)
    assert result_errors(
        ApiKey.CREATE_PARTITIONS, messages.decode_response(ApiKey.CREATE_PARTITIONS, 3, wire)
    ) == [("p", None, ErrorCode.THROTTLING_QUOTA_EXCEEDED)]
