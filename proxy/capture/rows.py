"""Building one capture record (quota/capture_schema.py) as a request goes through the pipeline.

A draft is started when the request is read, filled in from the quota decisions and the decoded
response, and turned into a row (a tuple in the schema's field order) when the response goes
back to the client.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from protocol import messages
from protocol.frames import RequestHeader

NOT_READ = -1


def _partition_rows(parts: Sequence[messages.PartitionBytes]) -> list[tuple[str, int, int, int]]:
    """(topic, partition, bytes, records) per partition: tuples, which Arrow takes as structs."""
    return [
        (
            p.topic if isinstance(p.topic, str) else p.topic.hex(),
            p.partition,
            p.size,
            p.record_count if p.record_count else -1,
        )
        for p in parts
    ]


def _error_codes(body: Any, found: set[int]) -> None:
    """Every non-zero ``error_code`` anywhere in a decoded body (records are opaque views)."""
    if isinstance(body, dict):
        code = body.get("error_code")
        if isinstance(code, int) and code:
            found.add(code)
        for value in body.values():
            if isinstance(value, (dict, list)):
                _error_codes(value, found)
    elif isinstance(body, list):
        for item in body:
            if isinstance(item, (dict, list)):
                _error_codes(item, found)


class CaptureDraft:
    __slots__ = (
        "broker_throttle_ms",
        "decided_throttle_ms",
        "error_codes",
        "mutations",
        "mutations_rejected",
        "new_producer_ids",
        "parts",
        "producer_ids",
        "request_bytes",
        "response_bytes",
        "ts_ms",
    )

    def __init__(self, ts_ms: int, request_bytes: int) -> None:
        self.ts_ms = ts_ms
        self.request_bytes = request_bytes
        self.response_bytes = 0
        self.parts: Sequence[messages.PartitionBytes] = ()  # rendered at row(): ids may get names
        self.producer_ids: list[int] = []
        self.new_producer_ids = NOT_READ
        self.mutations = NOT_READ
        self.mutations_rejected = 0
        self.error_codes: list[int] = []
        self.decided_throttle_ms = 0
        self.broker_throttle_ms = NOT_READ

    @classmethod
    def of(cls, header: RequestHeader, frame_size: int) -> CaptureDraft:
        return cls(int(time.time() * 1000), frame_size)

    def on_produce(self, parts: Sequence[messages.PartitionBytes], new_ids: int, decided_ms: int) -> None:
        self.parts = parts
        self.producer_ids = sorted({pid for p in parts for pid in p.producer_ids})
        self.new_producer_ids = new_ids
        self.decided_throttle_ms = max(self.decided_throttle_ms, decided_ms)

    def on_fetch(self, parts: Sequence[messages.PartitionBytes], decided_ms: int) -> None:
        """What a fetch response returned, per partition, and the throttle decided on it."""
        self.parts = parts
        self.decided_throttle_ms = max(self.decided_throttle_ms, decided_ms)

    def unnamed(self) -> list[messages.PartitionBytes]:
        """Partitions whose topic is still an id (a lookup may name them before the row is made)."""
        return [p for p in self.parts if isinstance(p.topic, bytes)]

    def on_mutation(self, costs: Sequence[int], accepted: Sequence[bool], decided_ms: int) -> None:
        self.mutations = sum(costs)
        self.mutations_rejected = sum(c for c, ok in zip(costs, accepted, strict=True) if not ok)
        self.decided_throttle_ms = max(self.decided_throttle_ms, decided_ms)

    def on_response(self, body: dict[str, Any]) -> None:
        """What the broker answered: error codes and its throttle."""
        found: set[int] = set()
        _error_codes(body, found)
        self.error_codes = sorted(found)
        throttle = body.get("throttle_time_ms")
        if isinstance(throttle, int):
            self.broker_throttle_ms = throttle

    def row(
        self,
        instance: str,
        node: int | None,
        conn: int,
        client_addr: str,
        principal: str,
        client_id: str,
        api_key: int,
        api_version: int,
        throttle_ms: int,
        upstream_ms: float,
        dry_run: bool,
    ) -> tuple[Any, ...]:
        """The record, in quota.capture_schema.FIELD_NAMES order."""
        return (
            self.ts_ms,
            instance,
            -1 if node is None else node,
            conn,
            client_addr,
            principal,
            client_id,
            api_key,
            api_version,
            self.request_bytes,
            self.response_bytes,
            _partition_rows(self.parts),
            self.producer_ids,
            self.new_producer_ids,
            self.mutations,
            self.mutations_rejected,
            self.error_codes,
            throttle_ms,
            max(self.decided_throttle_ms, throttle_ms),
            self.broker_throttle_ms,
            upstream_ms,
            dry_run,
        )
