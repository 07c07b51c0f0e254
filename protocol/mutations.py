"""CreateTopics, CreatePartitions and DeleteTopics as the KIP-599 mutation quota sees them.

Pure functions over decoded bodies: which topics a request touches (in request order), the
request with only the admitted topics, the proxy's own per-topic results, and the broker's answer
merged back with them in the original order. The proxy decides costs and admission; this module
only knows the messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import wire_throttle_ms

MUTATION_APIS: frozenset[int] = frozenset(
    {ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS}
)

# Errors.THROTTLING_QUOTA_EXCEEDED.message() in Kafka, which its controller puts in the result.
THROTTLING_QUOTA_EXCEEDED_MESSAGE = "The throttling quota has been exceeded."

_ZERO_UUID = bytes(16)


@dataclass(frozen=True, slots=True)
class TopicRef:
    """One topic of a mutation request.

    ``partitions`` is what the request itself says: for CreateTopics the new topic's partition
    count (-1: the cluster default), for CreatePartitions the new total count, for DeleteTopics
    nothing (-1): the current count comes from the cluster.
    """

    name: str | None
    topic_id: bytes | None
    partitions: int


def topics_of(api_key: int, version: int, body: dict[str, Any]) -> list[TopicRef]:
    """The topics a mutation request touches, in request order."""
    if api_key == ApiKey.CREATE_TOPICS:
        refs = []
        for t in body.get("topics") or []:
            assignments = t.get("assignments") or []
            count = len(assignments) if assignments else int(t.get("num_partitions", -1))
            refs.append(TopicRef(t.get("name"), None, count))
        return refs
    if api_key == ApiKey.CREATE_PARTITIONS:
        return [TopicRef(t.get("name"), None, int(t.get("count", 0))) for t in body.get("topics") or []]
    if api_key == ApiKey.DELETE_TOPICS:
        if version < 6:
            return [TopicRef(name, None, -1) for name in body.get("topic_names") or []]
        refs = []
        for t in body.get("topics") or []:
            tid = t.get("topic_id")
            refs.append(TopicRef(t.get("name"), tid if tid and tid != _ZERO_UUID else None, -1))
        return refs
    raise ValueError(f"api key {api_key} is not a mutation request")


def validate_only(api_key: int, body: dict[str, Any]) -> bool:
    return api_key != ApiKey.DELETE_TOPICS and bool(body.get("validate_only", False))


def admitted_request(
    api_key: int, version: int, body: dict[str, Any], keep: Sequence[bool]
) -> dict[str, Any]:
    """The request with only the topics flagged in ``keep`` (same order, other fields unchanged)."""
    field = "topic_names" if api_key == ApiKey.DELETE_TOPICS and version < 6 else "topics"
    items = body.get(field) or []
    out = dict(body)
    out[field] = [item for item, k in zip(items, keep, strict=True) if k]
    return out


def rejected_result(
    api_key: int, ref: TopicRef, error: int = ErrorCode.THROTTLING_QUOTA_EXCEEDED, message: str | None = None
) -> dict[str, Any]:
    """The proxy's own result for a topic it did not let through."""
    text = THROTTLING_QUOTA_EXCEEDED_MESSAGE if message is None else message
    result: dict[str, Any] = {"name": ref.name, "error_code": int(error), "error_message": text}
    if api_key == ApiKey.CREATE_TOPICS:
        result.update(topic_id=_ZERO_UUID, num_partitions=-1, replication_factor=-1, configs=[])
    elif api_key == ApiKey.DELETE_TOPICS:
        result["topic_id"] = ref.topic_id or _ZERO_UUID
    return result


RESULTS_FIELD: dict[int, str] = {  # where each mutation response lists its topics
    ApiKey.CREATE_TOPICS: "topics",
    ApiKey.CREATE_PARTITIONS: "results",
    ApiKey.DELETE_TOPICS: "responses",
}


def _results_field(api_key: int) -> str:
    return RESULTS_FIELD[api_key]


def _result_key(result: dict[str, Any]) -> tuple[str | None, bytes | None]:
    tid = result.get("topic_id")
    return (result.get("name"), tid if tid and tid != _ZERO_UUID else None)


def result_errors(api_key: int, body: dict[str, Any]) -> list[tuple[str | None, bytes | None, int]]:
    """(name, topic id, error code) of every result in a broker's response."""
    return [(*_result_key(r), int(r.get("error_code", 0))) for r in body.get(_results_field(api_key)) or []]


def _find(results: list[dict[str, Any]], ref: TopicRef, used: set[int]) -> dict[str, Any] | None:
    for i, r in enumerate(results):
        if i in used:
            continue
        name, tid = _result_key(r)
        if (ref.name is not None and name == ref.name) or (ref.topic_id is not None and tid == ref.topic_id):
            used.add(i)
            return r
    return None


def merged_response(
    api_key: int,
    refs: Sequence[TopicRef],
    accepted: Sequence[bool],
    broker: dict[str, Any] | None,
    throttle_ms: int,
) -> dict[str, Any]:
    """One response in the request's topic order: the broker's results for the admitted topics,
    the proxy's THROTTLING_QUOTA_EXCEEDED for the others, and the larger throttle time.

    ``broker`` is None when no topic was admitted (the proxy answers alone). A broker result the
    proxy cannot place (it should not happen) is kept at the end rather than dropped.
    """
    field = _results_field(api_key)
    out: dict[str, Any] = dict(broker) if broker is not None else {}
    theirs: list[dict[str, Any]] = list((broker or {}).get(field) or [])
    used: set[int] = set()
    results: list[dict[str, Any]] = []
    for ref, ok in zip(refs, accepted, strict=True):
        if not ok:
            results.append(rejected_result(api_key, ref))
            continue
        found = _find(theirs, ref, used)
        if found is None:
            found = rejected_result(api_key, ref, ErrorCode.UNKNOWN_SERVER_ERROR, "no result from the broker")
        results.append(found)
    results += [r for i, r in enumerate(theirs) if i not in used]
    out[field] = results
    out["throttle_time_ms"] = wire_throttle_ms(max(int(out.get("throttle_time_ms", 0)), throttle_ms))
    return out
