"""Byte-rate quota enforcement for the pipeline: what a Produce or Fetch costs, and the answer.

The policy is in ``quota/``; this module turns decoded messages into quota inputs and decisions
into bytes (a patched throttle_time_ms, an empty throttled fetch response). Like the broker,
the proxy answers at once with the throttle time and then mutes the client connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from protocol import messages
from protocol.api_keys import ApiKey, api_name
from protocol.errors import ErrorCode
from protocol.schema import message_codec
from proxy.metrics import ProxyMetrics
from proxy.ratelog import RateLimitedLog
from quota.config import QuotaConfig
from quota.manager import ByteRateQuotas, Decision, PartitionUsage
from quota.mutations import MutationQuotas

if TYPE_CHECKING:
    from proxy.admission import MutationState

log = logging.getLogger(__name__)
throttle_log = RateLimitedLog(log)

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1


@dataclass(slots=True)
class FetchRequestInfo:
    session_id: int
    session_epoch: int


def _usage(parts: list[messages.PartitionBytes]) -> list[PartitionUsage]:
    return [PartitionUsage(p.topic, p.partition, p.size) for p in parts if isinstance(p.topic, str)]


class QuotaEnforcer:
    """Shared by all pipelines of one proxy: the quota state and the clock."""

    def __init__(
        self, cfg: QuotaConfig, metrics: ProxyMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        now = self.now_ms()
        self.cfg = cfg
        self.produce = ByteRateQuotas(cfg, produce=True, now_ms=now)
        self.fetch = ByteRateQuotas(cfg, produce=False, now_ms=now)
        self.mutations = MutationQuotas(cfg, now)

    def now_ms(self) -> float:
        return self.clock() * 1000.0

    @property
    def dry_run(self) -> bool:
        return self.cfg.dry_run

    def reconfigure(self, cfg: QuotaConfig) -> None:
        self.cfg = cfg
        self.produce.reconfigure(cfg)
        self.fetch.reconfigure(cfg)
        self.mutations.reconfigure(cfg)

    # --- produce ---------------------------------------------------------------------------

    def on_produce(self, user: str, client_id: str, request_size: int, body: dict[str, Any]) -> Decision:
        """Charge a Produce request (header + body bytes; per-partition record bytes)."""
        parts = _usage(messages.produce_request_partitions(body))
        decision = self.produce.record(user, client_id, request_size, parts, self.now_ms())
        self._count(ApiKey.PRODUCE, decision, user, client_id)
        return decision

    # --- fetch -------------------------------------------------------------------------------

    def fetch_cap(self, user: str, client_id: str) -> int | None:
        return self.fetch.max_bytes_in_window(user, client_id)

    def on_fetch_response(
        self, user: str, client_id: str, response_size: int, body: dict[str, Any]
    ) -> tuple[Decision, list[PartitionUsage]]:
        parts = _usage(messages.fetch_response_partitions(body))
        decision = self.fetch.record(user, client_id, response_size, parts, self.now_ms())
        if decision.throttled and not self.dry_run:
            # The client gets an empty response instead, so these bytes were never delivered.
            self.fetch.unrecord(decision, response_size, parts, self.now_ms())
        self._count(ApiKey.FETCH, decision, user, client_id)
        return decision, parts

    # --- partition mutations (KIP-599) ---------------------------------------------------------

    def mutation_quota_applies(self, user: str, client_id: str) -> bool:
        return self.mutations.active and self.mutations.match(user, client_id) is not None

    def on_mutation(self, user: str, client_id: str, state: MutationState, peer: str) -> None:
        """Decide which topics of a priced mutation request are admitted, and its throttle."""
        strict = state.strict
        admitted = self.mutations.admit(user, client_id, state.costs, strict, self.now_ms())
        state.bucket = admitted.bucket
        name = api_name(state.api_key) or str(state.api_key)
        mode = "dry-run" if self.dry_run else "applied"
        rejected = admitted.accepted.count(False)
        if rejected:
            self.metrics.mutation_rejected_topics.labels(name, mode).inc(rejected)
        if admitted.throttle_ms or rejected:
            self.metrics.throttled_requests.labels(name, mode).inc()
            self.metrics.throttle_seconds.labels(name).inc(admitted.throttle_ms / 1000.0)
            throttle_log.log(
                logging.INFO,
                "mutation",
                "%s v%d from %s (user %s, client %s): %d of %d topics rejected, throttle %d ms (%s, %s)",
                name,
                state.version,
                peer,
                user,
                client_id,
                rejected,
                len(state.refs),
                admitted.throttle_ms,
                "strict" if strict else "permissive",
                mode,
            )
        if self.dry_run:
            state.accepted = (True,) * len(state.refs)
            state.throttle_ms = 0
        else:
            state.accepted = admitted.accepted
            state.throttle_ms = admitted.throttle_ms

    def refund_mutations(self, state: MutationState, indexes: list[int]) -> None:
        """Give back tokens for admitted topics the broker refused (Kafka never charged them)."""
        if state.bucket is not None:
            self.mutations.refund(state.bucket, sum(state.costs[i] for i in indexes), self.now_ms())

    def _count(self, api_key: int, decision: Decision, user: str, client_id: str) -> None:
        if decision.throttled:
            name = "Produce" if api_key == ApiKey.PRODUCE else "Fetch"
            mode = "dry-run" if self.dry_run else "applied"
            self.metrics.throttled_requests.labels(name, mode).inc()
            self.metrics.throttle_seconds.labels(name).inc(decision.throttle_ms / 1000.0)
            throttle_log.log(
                logging.INFO,
                name,
                "%s from user %s, client %s throttled %d ms (client %d ms, partition %d ms, %s)",
                name,
                user,
                client_id,
                decision.throttle_ms,
                decision.client_throttle_ms,
                decision.partition_throttle_ms,
                mode,
            )


def throttled_fetch_response(version: int, throttle_ms: int, request: FetchRequestInfo) -> bytearray:
    """The empty response a broker sends to a throttled fetch (error NONE, no partitions).

    The broker keeps an incremental session's id and answers a full or sessionless fetch with
    INVALID_SESSION_ID, so the client starts over with a full fetch, as it would against Kafka.
    """
    incremental = request.session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH)
    body: dict[str, Any] = {
        "throttle_time_ms": throttle_ms,
        "error_code": int(ErrorCode.NONE),
        "session_id": request.session_id if incremental else INVALID_SESSION_ID,
        "responses": [],
    }
    return messages.encode(ApiKey.FETCH, version, body, response=True)


def fetch_request_info(version: int, body: dict[str, Any]) -> FetchRequestInfo:
    return FetchRequestInfo(int(body.get("session_id", 0)), int(body.get("session_epoch", FINAL_EPOCH)))


def cap_fetch_max_bytes(version: int, frame: bytearray, body_offset: int, cap: int) -> bool:
    """Lower a Fetch request's max_bytes in place to ``cap``; True if it changed."""
    if version < 3:
        return False
    codec = message_codec("FetchRequest", version)
    _obj, _end, positions = codec.read_with_positions(memoryview(frame), body_offset)
    pos = positions.get("max_bytes")
    if pos is None:
        return False
    current = int.from_bytes(frame[pos : pos + 4], "big", signed=True)
    if current <= cap:
        return False
    frame[pos : pos + 4] = max(cap, 1).to_bytes(4, "big", signed=True)
    return True
