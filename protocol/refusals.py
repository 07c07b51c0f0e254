"""The proxy's own answer refusing a whole request, for the APIs a quota charges.

Each API says "no" in its own place: per partition (Produce), at the top from Fetch v7 (per
partition before it), per topic (the mutation APIs), or in one error code (InitProducerId).
Nothing is forwarded for a refused request, so no offset, topic or producer id comes back.
"""

from __future__ import annotations

from typing import Any

from protocol.api_keys import ApiKey
from protocol.messages import produce_error_response
from protocol.mutations import RESULTS_FIELD, rejected_result, topics_of

_FIRST_TOP_LEVEL_FETCH_ERROR = 7  # Fetch v7 (KIP-227) has a top-level error code

REFUSABLE_APIS = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.CREATE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.DELETE_TOPICS,
        ApiKey.INIT_PRODUCER_ID,
    }
)


def refusal_response(
    api_key: int, version: int, body: dict[str, Any], error: int, message: str
) -> dict[str, Any]:
    """A response answering every part of the request ``body`` with ``error`` (and ``message``
    where the version carries one)."""
    if api_key == ApiKey.PRODUCE:
        return produce_error_response(body, error, message, 0)
    if api_key == ApiKey.FETCH:
        return _fetch_refusal(version, body, error)
    if api_key in RESULTS_FIELD:
        refs = topics_of(api_key, version, body)
        return {RESULTS_FIELD[api_key]: [rejected_result(api_key, ref, error, message) for ref in refs]}
    if api_key == ApiKey.INIT_PRODUCER_ID:
        return {"error_code": error, "producer_id": -1, "producer_epoch": -1}
    raise ValueError(f"the proxy does not answer api key {api_key} by itself")


def _fetch_refusal(version: int, body: dict[str, Any], error: int) -> dict[str, Any]:
    if version >= _FIRST_TOP_LEVEL_FETCH_ERROR:
        # The session is refused as a whole; the client keeps its session id and epoch.
        return {"error_code": error, "session_id": 0, "responses": []}
    responses = []
    for topic in body.get("topics") or []:
        partitions = [
            {
                "partition_index": part["partition"],
                "error_code": error,
                "high_watermark": -1,
                "last_stable_offset": -1,
                "log_start_offset": -1,
                "aborted_transactions": None,
                "records": None,
            }
            for part in topic.get("partitions") or []
        ]
        responses.append({"topic": topic.get("topic"), "partitions": partitions})
    return {"responses": responses}
