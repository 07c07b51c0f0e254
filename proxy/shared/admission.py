"""KIP-599 admission for CreateTopics, CreatePartitions and DeleteTopics at the proxy.

The pipeline hands a decoded mutation request here; this module works out what each topic costs
(asking the cluster through the topic catalog where the request does not say), asks the mutation
quota which topics are admitted, and shapes what goes upstream and what comes back:

- strict versions (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): rejected topics get
  THROTTLING_QUOTA_EXCEEDED from the proxy; the admitted ones go upstream in a rewritten request,
  and the broker's answer is merged with the proxy's in the original order. When nothing is
  admitted the proxy answers alone.
- older versions: always forwarded; the cost is recorded and the client throttled by muting.

Kafka's controller validates a topic before it charges it, so a topic the broker refuses for its
own reasons (it already exists, bad config, ...) is refunded when its result comes back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from protocol import messages
from protocol.api_keys import ApiKey, api_name
from protocol.errors import ErrorCode
from protocol.mutations import (
    TopicRef,
    admitted_request,
    merged_response,
    result_errors,
    topics_of,
    validate_only,
)
from protocol.versions import STRICT_MUTATION_FROM
from proxy.shared.topic_catalog import KAFKA_DEFAULT_PARTITIONS, TopicCatalog
from quota.cluster_report import MutationRecord
from quota.entities import Bucket

log = logging.getLogger(__name__)


@dataclass(slots=True)
class MutationState:
    """A mutation request between its admission and its response."""

    api_key: int
    version: int
    refs: list[TopicRef]
    costs: list[int] = field(default_factory=list)
    accepted: tuple[bool, ...] = ()
    bucket: Bucket | None = None
    throttle_ms: int = 0
    record: MutationRecord | None = None  # decided across replicas (quota/cluster_mutations.py)

    @property
    def strict(self) -> bool:
        return self.version >= STRICT_MUTATION_FROM[self.api_key]

    @property
    def partial(self) -> bool:
        """Some topics were rejected by the proxy: the response must be merged."""
        return not all(self.accepted)


def parse(
    api_key: int, version: int, body: dict[str, Any], charge_validate_only: bool
) -> MutationState | None:
    """The state to admit this request with, or None when the quota does not apply to it."""
    if validate_only(api_key, body) and not charge_validate_only:
        return None
    return MutationState(api_key, version, topics_of(api_key, version, body))


async def resolve_costs(state: MutationState, catalog: TopicCatalog) -> list[int]:
    """Partition mutations per topic, in request order, as Kafka's controller counts them.

    If the cluster cannot be asked, topics whose cost the request does not state are charged
    nothing (logged): the proxy fails open rather than refusing admin work it cannot price.
    """
    refs = state.refs
    needs_counts = state.api_key in (ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS)
    counts: dict[str | bytes, int] = {}
    default = KAFKA_DEFAULT_PARTITIONS
    try:
        if needs_counts:
            counts = await catalog.partition_counts(refs)
        elif any(r.partitions < 0 for r in refs):
            default = await catalog.default_partitions()
    except ConnectionError as exc:
        log.warning(
            "%s: cannot price partition mutations, charging what the request states: %s",
            api_name(state.api_key),
            exc,
        )
    costs = []
    for ref in refs:
        current = counts.get(ref.name) if ref.name is not None else None
        if current is None and ref.topic_id is not None:
            current = counts.get(ref.topic_id)
        if state.api_key == ApiKey.CREATE_TOPICS:
            costs.append(ref.partitions if ref.partitions >= 0 else default)
        elif state.api_key == ApiKey.CREATE_PARTITIONS:
            costs.append(max(0, ref.partitions - current) if current is not None else 0)
        else:
            costs.append(current or 0)
    return costs


def upstream_request(state: MutationState, body: dict[str, Any]) -> dict[str, Any] | None:
    """The body to forward when some topics were rejected (None: forward the original frame)."""
    if not state.partial:
        return None
    return admitted_request(state.api_key, state.version, body, state.accepted)


def local_response(state: MutationState) -> dict[str, Any]:
    """The proxy's whole answer when no topic was admitted."""
    return merged_response(state.api_key, state.refs, state.accepted, None, state.throttle_ms)


def broker_refusals(state: MutationState, body: dict[str, Any]) -> list[int]:
    """Indexes of admitted topics the broker refused (to refund: Kafka never charged them)."""
    errors: dict[str | bytes, int] = {}
    for name, tid, error in result_errors(state.api_key, body):
        if name is not None:
            errors[name] = error
        if tid is not None:
            errors[tid] = error
    refused = []
    for i, (ref, ok) in enumerate(zip(state.refs, state.accepted, strict=True)):
        if not ok or not state.costs or state.costs[i] == 0:
            continue
        code: int | None = errors.get(ref.name) if ref.name is not None else None
        if code is None and ref.topic_id is not None:
            code = errors.get(ref.topic_id)
        if code not in (None, ErrorCode.NONE):
            refused.append(i)
    return refused


def merged(state: MutationState, body: dict[str, Any]) -> dict[str, Any]:
    return merged_response(state.api_key, state.refs, state.accepted, body, state.throttle_ms)


def encode_request(state: MutationState, body: dict[str, Any]) -> bytearray:
    return messages.encode(state.api_key, state.version, body, response=False)
