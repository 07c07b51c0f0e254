"""The stages of a proxy, in order, and each connection's table of which run for which API key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from proxy.pipeline.stages.base import Connection, Stage, StageFactory

if TYPE_CHECKING:
    from proxy.shared.throttling import QuotaEnforcer


_MAX_RESOLVED: Final = 1024  # (key, version) pairs remembered per connection


class StageSet:
    """The proxy's stage factories, in the order their ``on_request`` runs."""

    def __init__(self, factories: Sequence[StageFactory], enforcer: QuotaEnforcer) -> None:
        self.factories = tuple(factories)
        self.enforcer = enforcer

    def for_connection(self, conn: Connection) -> StageChain:
        return StageChain([make(conn) for make in self.factories], self.enforcer)


class StageChain:
    """One connection's stages and, per API key and version, the ones that asked for its
    requests: resolved once, and again only when the quotas are reconfigured (a request nobody
    asked for maps to an empty tuple, and is forwarded undecoded)."""

    __slots__ = ("_generation", "_last_slot", "_last_stages", "_rules", "_table", "stages")

    def __init__(self, stages: list[Stage], enforcer: QuotaEnforcer) -> None:
        self.stages = stages
        self._rules = enforcer.rules
        self._generation = self._rules.value
        self._table: dict[int, tuple[Stage, ...]] = {}
        # The last key and version asked for, and its stages: a connection mostly sends one kind
        # of request after another, and an int compare costs less than a dict's boxed lookup.
        self._last_slot = -1
        self._last_stages: tuple[Stage, ...] = ()

    def for_request(self, api_key: int, api_version: int) -> tuple[Stage, ...]:
        if self._generation != self._rules.value:
            self._table.clear()
            self._last_slot = -1
            self._generation = self._rules.value
        slot = api_key << 16 | api_version
        if slot == self._last_slot:
            return self._last_stages
        found = self._table.get(slot)
        if found is None:
            if len(self._table) >= _MAX_RESOLVED:  # a client trying every version: start over
                self._table.clear()
            found = self._table[slot] = self._resolve(api_key, api_version)
        self._last_slot, self._last_stages = slot, found
        return found

    def _resolve(self, api_key: int, api_version: int) -> tuple[Stage, ...]:
        chosen = []
        for stage in self.stages:
            keys = stage.request_keys()
            if (keys is None or api_key in keys) and stage.wants_version(api_key, api_version):
                chosen.append(stage)
        return tuple(chosen)
