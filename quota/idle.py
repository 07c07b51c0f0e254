"""Dropping quota state nobody used for ``idle_expiry_seconds`` (Kafka: an hour), one table at a
time: each table's entries (windowed rates, token buckets) know when they were last charged."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Charged(Protocol):
    @property
    def last_record_ms(self) -> float: ...


K = TypeVar("K")
V = TypeVar("V", bound=Charged)


def drop_idle(table: dict[K, V], horizon_ms: float) -> int:
    """Remove the entries last charged before ``horizon_ms``; how many went."""
    stale = [key for key, entry in table.items() if entry.last_record_ms < horizon_ms]
    for key in stale:
        del table[key]
    return len(stale)
