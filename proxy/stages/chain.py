"""The stages of a proxy, in order, and each connection's table of which run for which API key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.stages.base import Connection, Stage, StageFactory

if TYPE_CHECKING:
    from proxy.throttling import QuotaEnforcer


class StageSet:
    """The proxy's stage factories, in the order their ``on_request`` runs."""

    def __init__(self, factories: Sequence[StageFactory], enforcer: QuotaEnforcer) -> None:
        self.factories = tuple(factories)
        self.enforcer = enforcer

    def for_connection(self, conn: Connection) -> StageChain:
        return StageChain([make(conn) for make in self.factories], self.enforcer)


class StageChain:
    """One connection's stages and, per API key, the ones that asked for its requests: resolved
    once per key, and again only when the quotas are reconfigured (a key nobody asked for maps
    to an empty tuple, and its requests are forwarded undecoded)."""

    __slots__ = ("_enforcer", "_generation", "_table", "stages")

    def __init__(self, stages: list[Stage], enforcer: QuotaEnforcer) -> None:
        self.stages = stages
        self._enforcer = enforcer
        self._generation = enforcer.generation
        self._table: dict[int, tuple[Stage, ...]] = {}

    def for_key(self, api_key: int) -> tuple[Stage, ...]:
        if self._generation != self._enforcer.generation:
            self._table.clear()
            self._generation = self._enforcer.generation
        found = self._table.get(api_key)
        if found is None:
            found = self._resolve(api_key)
            self._table[api_key] = found
        return found

    def _resolve(self, api_key: int) -> tuple[Stage, ...]:
        chosen = []
        for stage in self.stages:
            keys = stage.request_keys()
            if keys is None or api_key in keys:
                chosen.append(stage)
        return tuple(chosen)
