"""One partition's bytes in a Produce request or a Fetch answer: what the byte-rate quotas charge.

A plain class in a compiled module, not a dataclass: several are built for every request, and a
compiled dataclass's generated ``__init__`` runs interpreted (docs/architecture.md, "The compiled
hot path")."""

from __future__ import annotations


class PartitionBytes:
    __slots__ = ("partial", "partition", "producer_ids", "record_count", "size", "topic")

    def __init__(
        self,
        topic: str | bytes,
        partition: int,
        size: int,
        record_count: int = 0,
        producer_ids: set[int] | None = None,
        partial: int = 0,
    ) -> None:
        self.topic = topic  # name, or topic id (16 bytes) for versions that address topics by id
        self.partition = partition
        self.size = size
        self.record_count = record_count
        self.producer_ids: set[int] = set() if producer_ids is None else producer_ids
        # Fetch: bytes of a trailing partial batch (counted in ``size``), which the client drops.
        self.partial = partial

    def _fields(self) -> tuple[str | bytes, int, int, int, set[int], int]:
        return (self.topic, self.partition, self.size, self.record_count, self.producer_ids, self.partial)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionBytes):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"PartitionBytes(topic={self.topic!r}, partition={self.partition}, size={self.size}, "
            f"record_count={self.record_count}, producer_ids={self.producer_ids!r}, partial={self.partial})"
        )
