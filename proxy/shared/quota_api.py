"""Kafka's client-quota Admin API answered by the proxy (KIP-546), and the store behind it.

Validation, filters and the overlay merge are ``quota/client_quota_ops.py`` (sans-IO). This
module keeps the overlay of API alterations in a compacted topic (``quota_api.topic``; key = the
entity, value = JSON of its overlaid keys) that every proxy instance reads from its start and
follows, so an alteration made through one instance reaches all of them and survives restarts.
The quotas enforced are the config file's with the overlay applied per entity and key; each
change, from the topic or from a hot reload of the file, rebuilds them and goes through the
same ``QuotaEnforcer.reconfigure`` as a reload.

Before this instance has read the topic to its end, describe answers from the file and what was
read so far; alterations wait for the end (``catch_up_timeout_seconds``), since each record holds
an entity's whole overlay and must start from the latest one.

The same service answers the Kafka requests (through the pipeline) and the admin HTTP endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from protocol.errors import ErrorCode
from proxy.config import ProxyConfig
from proxy.ratelog import RateLimitedLog
from proxy.shared.exchange import CompactedTopic, ExchangeSettings, exchange_metrics, shown_value
from proxy.shared.throttling import QuotaEnforcer
from quota import client_quota_ops as ops
from quota.client_quota_ops import Alteration, AlterResult, ApiError, Component, Op, Overlay
from quota.config import QuotaConfig, is_ip_literal

log = logging.getLogger(__name__)
# Skipped store records: a topic full of bad ones (read again at every reconnect) must not flood.
skip_log = RateLimitedLog(log)
_ABSENT = object()  # no value for a key in the overlay

AUTHORIZATION_FAILED = ApiError("CLUSTER_AUTHORIZATION_FAILED", "Cluster authorization failed.")


def principal_of(user: str) -> str:
    """The Kafka principal of a connection's user (``ANONYMOUS`` is ``User:ANONYMOUS``)."""
    return f"User:{user}"


def allowed(principal: str, principals: list[str] | None) -> bool:
    """None allows everyone; ``User:*`` is Kafka's wildcard principal."""
    if principals is None:
        return True
    return principal in principals or "User:*" in principals


def error_code(error: ApiError) -> int:
    return int(ErrorCode[error.name])


# --- Kafka messages <-> ops ------------------------------------------------------------------


def alterations_of(body: Mapping[str, Any]) -> list[Alteration]:
    """The entries of a decoded AlterClientQuotas request (a removal's value is ignored)."""
    out = []
    for entry in body.get("entries") or []:
        entity = tuple((str(e["entity_type"]), e["entity_name"]) for e in entry.get("entity") or [])
        op_list = tuple(
            Op(str(o["key"]), None if o.get("remove") else float(o["value"])) for o in entry.get("ops") or []
        )
        out.append(Alteration(entity, op_list))
    return out


def components_of(body: Mapping[str, Any]) -> list[Component]:
    return [
        Component(str(c["entity_type"]), int(c["match_type"]), c.get("match"))
        for c in body.get("components") or []
    ]


def _entity_data(pairs: Any) -> list[dict[str, Any]]:
    return [{"entity_type": t, "entity_name": n} for t, n in pairs]


def alter_response(results: list[tuple[Any, ApiError]]) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "entries": [
            {
                "error_code": error_code(err),
                "error_message": err.message,
                "entity": _entity_data(entity),
            }
            for entity, err in results
        ],
    }


def refused_alter_response(body: Mapping[str, Any], err: ApiError) -> dict[str, Any]:
    """Every entry failed with ``err``, the entities echoed as sent (Kafka's getErrorResponse)."""
    return {
        "throttle_time_ms": 0,
        "entries": [
            {
                "error_code": error_code(err),
                "error_message": err.message,
                "entity": list(e.get("entity") or []),
            }
            for e in body.get("entries") or []
        ],
    }


def describe_response(found: list[tuple[ops.Entity, dict[str, float]]] | ApiError) -> dict[str, Any]:
    if isinstance(found, ApiError):
        return {
            "throttle_time_ms": 0,
            "error_code": error_code(found),
            "error_message": found.message,
            "entries": None,
        }
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "error_message": None,
        "entries": [
            {
                "entity": _entity_data(entity),
                "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
            }
            for entity, values in found
        ],
    }


# What became of each record read from the store (kthrottle_quota_store_records_total{outcome}).
STORE_OUTCOMES = ("applied", "cleared", "unchanged", "unreadable", "no_key")


class QuotaApiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.alterations = Counter(
            "kthrottle_quota_api_alterations",
            "Client-quota alteration entries, by source (kafka, http) and result (Kafka error name)",
            ["source", "result"],
            registry=registry,
        )
        self.describes = Counter(
            "kthrottle_quota_api_describes",
            "Client-quota describe requests, by source",
            ["source"],
            registry=registry,
        )
        records = Counter(
            "kthrottle_quota_store_records",
            "Records read from the client-quota store (quota_api.topic), by outcome: applied (a value "
            "or a removal put into the overlay), cleared (a tombstone: the key follows the config "
            "file again), unchanged (already in force: this instance's own alteration read back, or "
            "the topic read again after a reconnect), unreadable (a key or value that does not "
            "decode, or a value Kafka would refuse) and no_key (a record without a key); the last "
            "two are skipped and logged",
            ["outcome"],
            registry=registry,
        )
        # Every outcome resolved now, so a scrape shows each at 0 before its first record.
        self.store_records = {outcome: records.labels(outcome) for outcome in STORE_OUTCOMES}


async def _resolves(name: str, timeout: float = 2.0) -> bool:
    """Whether a host name resolves (Kafka's InetAddress.getByName check), without blocking."""
    try:
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(name, None), timeout)
    except (OSError, TimeoutError, UnicodeError):
        return False
    return True


class QuotaApiService:
    """The overlay of API alterations, its topic, and the answers to describe and alter."""

    def __init__(self, cfg: ProxyConfig, enforcer: QuotaEnforcer, registry: CollectorRegistry) -> None:
        self.cfg = cfg
        self.enforcer = enforcer
        self.file_quotas: QuotaConfig = cfg.quotas
        self.overlay: Overlay = {}
        self.metrics = QuotaApiMetrics(registry)
        self.exchange = CompactedTopic(
            ExchangeSettings.of(cfg),
            cfg.quota_api.topic,
            self._on_record,
            exchange_metrics(registry),
            topic_configs={"delete.retention.ms": "86400000"},
        )
        self._lock = asyncio.Lock()  # one alteration at a time per instance: each reads the overlay

    @property
    def mode(self) -> str:
        return self.cfg.quota_api.mode

    def start(self) -> None:
        self.exchange.start()
        log.info("quota API: mode %s, store topic %s", self.mode, self.cfg.quota_api.topic)

    async def stop(self) -> None:
        await self.exchange.stop()

    async def wait_caught_up(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) until the store has been read to its end."""
        if seconds <= 0:
            return self.exchange.caught_up.is_set()
        try:
            await asyncio.wait_for(self.exchange.caught_up.wait(), seconds)
        except TimeoutError:
            log.warning(
                "quota API: store %s not read within %g s; enforcing the config file's quotas and "
                "applying the stored alterations as they are read",
                self.cfg.quota_api.topic,
                seconds,
            )
            return False
        log.info("quota API: store read, %d entities altered through the API", len(self.overlay))
        return True

    # --- the effective quotas --------------------------------------------------------------

    def effective(self, file_quotas: QuotaConfig | None = None) -> QuotaConfig:
        """The file's quotas (these, or the last loaded) with the overlay applied."""
        base = self.file_quotas if file_quotas is None else file_quotas
        try:
            return ops.apply_overlay(base, self.overlay)
        except ValidationError as exc:  # cannot happen for validated alterations; never fatal
            log.error("quota API: overlay does not fit the config, enforcing the file alone: %s", exc)
            return base

    def reload(self, file_quotas: QuotaConfig) -> QuotaConfig:
        """A hot reload of the file: the overlay goes on top of the new quotas."""
        self.file_quotas = file_quotas
        return self.effective()

    def _enforce(self) -> None:
        self.enforcer.reconfigure(self.effective())

    def _on_record(self, key: bytes | None, value: bytes | None) -> None:
        """Apply one record of the store to the overlay; every record is counted by its outcome
        (``STORE_OUTCOMES``) and one skipped is logged."""
        outcome = self._apply_record(key, value)
        self.metrics.store_records[outcome].inc()

    def _apply_record(self, key: bytes | None, value: bytes | None) -> str:
        if key is None:
            # The exchange hands over key and value only: the topic is named, not the offset.
            skip_log.log(
                logging.WARNING,
                "no-key",
                "quota API: a record of %s without a key skipped (value %s)",
                self.cfg.quota_api.topic,
                shown_value(value),
            )
            return "no_key"
        try:
            entity, quota_key = ops.decode_key(key)
            present, number = ops.decode_value(entity, quota_key, value)
        except ops.RecordError as exc:
            skip_log.log(logging.WARNING, "unreadable", "quota API: record %r skipped: %s", key, exc)
            return "unreadable"
        values = self.overlay.get(entity, {})
        if present:
            if quota_key in values and values[quota_key] == number:
                # This instance's own alteration, applied when it was made, or a record read
                # again (a reconnect reads the topic from its start).
                return "unchanged"
            self.overlay.setdefault(entity, {})[quota_key] = number
        elif values.pop(quota_key, _ABSENT) is _ABSENT:
            return "unchanged"  # a tombstone for a key the overlay does not hold
        elif not values:
            self.overlay.pop(entity, None)
        shown = number if present else "as in the config file"
        log.info(
            "quota API: %s %s now %s",
            dict(entity),
            quota_key,
            "removed" if present and number is None else shown,
        )
        self._enforce()
        return "applied" if present else "cleared"

    # --- describe ----------------------------------------------------------------------------

    def may_describe(self, principal: str) -> bool:
        return allowed(principal, self.cfg.quota_api.describers)

    def describe(
        self, components: list[Component], strict: bool, source: str = "kafka"
    ) -> list[tuple[ops.Entity, dict[str, float]]] | ApiError:
        self.metrics.describes.labels(source).inc()
        try:
            return ops.describe(self.effective(), components, strict)
        except ops.DescribeError as exc:
            return exc.error

    # --- alter -------------------------------------------------------------------------------

    def may_alter(self, principal: str) -> bool:
        return allowed(principal, self.cfg.quota_api.admins)

    async def validate(self, alterations: list[Alteration]) -> AlterResult:
        """Kafka's validation; IP entities that are host names are resolved first, so a name
        that does not resolve gets Kafka's own error text."""
        names = {
            name
            for a in alterations
            for t, name in a.entity
            if t == ops.IP and name is not None and not is_ip_literal(name) and ops.looks_like_host(name)
        }
        resolved = dict(zip(names, await asyncio.gather(*(_resolves(n) for n in names)), strict=True))
        return ops.alter(alterations, self.overlay, resolvable=lambda name: resolved.get(name, False))

    async def alter(
        self, alterations: list[Alteration], validate_only: bool, source: str = "kafka", who: str = "?"
    ) -> AlterResult:
        """Validate, then (unless validate_only) store and apply the changes; per-entity results."""
        async with self._lock:
            result = await self.validate(alterations)
            if not validate_only:
                await self.store(result)
        for _entity, err in result.results:
            self.metrics.alterations.labels(source, err.name).inc()
        log.info(
            "quota API: %s altered client quotas%s: %s",
            who,
            " (validate only)" if validate_only else "",
            "; ".join(
                f"{dict(e)} {err.name}{f' ({err.message})' if err.failed else ''}"
                for e, err in result.results
            ),
        )
        return result

    async def store_serialized(self, result: AlterResult, only: set[ops.Entity] | None = None) -> None:
        """``store`` behind this instance's other alterations."""
        async with self._lock:
            await self.store(result, only)

    async def store(self, result: AlterResult, only: set[ops.Entity] | None = None) -> None:
        """Publish the changes (of the entities in ``only``, if given) and apply them at once;
        an entity whose publication fails gets an error instead of NONE."""
        changes = {e: c for e, c in result.changes.items() if only is None or e in only}
        if not changes:
            return
        failed: dict[ops.Entity, ApiError] = {}
        timeout = self.cfg.quota_api.catch_up_timeout_seconds
        topic = self.cfg.quota_api.topic
        try:
            await asyncio.wait_for(self.exchange.caught_up.wait(), timeout)
        except TimeoutError:
            err = ApiError(
                "REQUEST_TIMED_OUT",
                f"kthrottle: the quota store (topic {topic}) was not read within {timeout:g} s; "
                "nothing was changed",
            )
            failed = dict.fromkeys(changes, err)
        else:
            for entity, change in changes.items():
                for quota_key, number in change.items():
                    if await self.exchange.publish(
                        ops.encode_key(entity, quota_key), ops.encode_value(number)
                    ):
                        self.overlay.setdefault(entity, {})[quota_key] = number
                    else:
                        failed[entity] = ApiError(
                            "REQUEST_TIMED_OUT",
                            f"kthrottle: the quota store (topic {topic}) did not take the change",
                        )
            self._enforce()
        if failed:
            result.results = [
                (echo, failed.get(ops.canonical(dict(echo)), err)) for echo, err in result.results
            ]


@dataclass
class QuotaAlterBoth:
    """Mode both: the proxy's verdict on an alteration, forwarded to the broker as sent.

    Once the broker has answered, the proxy stores the entries both accepted. The answer is the
    broker's, entry by entry, except where the proxy refused an entry (its error then) or could
    not store it (REQUEST_TIMED_OUT): an entry reads NONE only when both have applied it.
    """

    result: AlterResult
    body: dict[str, Any]

    async def complete(self, service: QuotaApiService, broker: dict[str, Any]) -> dict[str, Any]:
        broker_errors: dict[ops.Entity, tuple[int, str | None]] = {}
        for entry in broker.get("entries") or []:
            pairs = ((str(e["entity_type"]), e["entity_name"]) for e in entry.get("entity") or [])
            broker_errors[ops.canonical(ops.entity_map(pairs))] = (
                int(entry.get("error_code", 0)),
                entry.get("error_message"),
            )
        mine = {ops.canonical(dict(echo)): err for echo, err in self.result.results}
        accepted = {
            e for e, err in mine.items() if not err.failed and broker_errors.get(e, (0, None))[0] == 0
        }
        if not self.body.get("validate_only"):
            await service.store_serialized(self.result, only=accepted)
        stored = {ops.canonical(dict(echo)): err for echo, err in self.result.results}
        for err in stored.values():
            service.metrics.alterations.labels("kafka", err.name).inc()
        entries = []
        for entry in broker.get("entries") or []:
            pairs = ((str(e["entity_type"]), e["entity_name"]) for e in entry.get("entity") or [])
            own = stored.get(ops.canonical(ops.entity_map(pairs)))
            if own is not None and own.failed:
                entry = {**entry, "error_code": error_code(own), "error_message": own.message}
            entries.append(entry)
        return {**broker, "entries": entries}


async def stop_quietly(service: QuotaApiService | None) -> None:
    if service is not None:
        with contextlib.suppress(Exception):
            await service.stop()
