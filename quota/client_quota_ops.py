"""Kafka's client-quota Admin API (KIP-546) over the proxy's quota model, sans-IO.

DescribeClientQuotas and AlterClientQuotas are answered from the quotas the proxy enforces: the
config file's quotas with an overlay of API alterations applied per entity and key. This module
validates alterations exactly as Kafka 4's controller does (``ClientQuotaControlManager``: same
checks, same order, same error names and message texts), filters entities as the broker's
``ClientQuotasImage.describe`` does, and merges the overlay into a ``QuotaConfig``. It does no
I/O: storage (a compacted topic) and authorization are the proxy's part.

Error codes are returned by Kafka's *name* ("INVALID_REQUEST"): ``quota/`` does not import
``protocol/``, where the numbers live (``protocol.errors.ErrorCode[name]``).

Entities are Kafka's: ``user``, ``client-id``, ``user`` + ``client-id``, ``ip``; a null name is
the default entity, which the proxy's config spells ``<default>`` (a literal ``<default>`` name is
the same entity, as in the config file). Overlay values: a number sets the key; ``None`` marks it
removed through the API, which wins over the config file until the key is set again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from quota.config import QuotaConfig, is_ip_literal
from quota.keys import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
    REQUEST_PERCENTAGE,
)

# The quotas an entity's ``scope`` applies to (one across gateway replicas, or per replica).
SCOPED_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_IDS_RATE)

USER: Final = "user"
CLIENT_ID: Final = "client-id"
IP: Final = "ip"
CONNECTION_CREATION_RATE: Final = "connection_creation_rate"

# DescribeClientQuotasRequest match types (values fixed by the protocol).
MATCH_EXACT: Final = 0
MATCH_DEFAULT: Final = 1
MATCH_ANY: Final = 2  # Kafka's MATCH_TYPE_SPECIFIED: any name, default included

# Kafka's ConfigDef types of the quota keys (QuotaConfig.userAndClientQuotaConfigs / ipConfigs):
# integral types refuse fractions and values past the type's maximum.
_LONG_MAX: Final = float(2**63 - 1)
_INT_MAX: Final = float(2**31 - 1)
USER_CLIENT_KEYS: Final[dict[str, str]] = {
    PRODUCER_BYTE_RATE: "LONG",
    CONSUMER_BYTE_RATE: "LONG",
    REQUEST_PERCENTAGE: "DOUBLE",
    CONTROLLER_MUTATION_RATE: "DOUBLE",
}
# KIP-936's producer_ids_rate (which Kafka never shipped) is the proxy's own, per user only.
USER_ONLY_KEYS: Final[dict[str, str]] = {PRODUCER_IDS_RATE: "DOUBLE"}
IP_KEYS: Final[dict[str, str]] = {CONNECTION_CREATION_RATE: "INT"}

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
_HOST_NAME: Final = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")

Name = str | None  # None: the default entity
Entity = tuple[tuple[str, Name], ...]  # (type, name) pairs sorted by type: one spelling per entity
Values = dict[str, float | None]  # overlay values of one entity; None: removed through the API
Overlay = dict[Entity, Values]


@dataclass(frozen=True, slots=True)
class ApiError:
    """A Kafka error by name (``protocol.errors.ErrorCode`` member) and its message."""

    name: str
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.name != "NONE"


NONE: Final = ApiError("NONE")


class DescribeError(Exception):
    """A filter Kafka refuses: the whole DescribeClientQuotas request fails with this error."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.error = ApiError(name, message)


@dataclass(frozen=True, slots=True)
class Op:
    """One key of an alteration: ``value`` None removes the key (Kafka's ``remove`` flag)."""

    key: str
    value: float | None


@dataclass(frozen=True, slots=True)
class Alteration:
    """One entry of an AlterClientQuotas request, as sent: entity (type, name) pairs and ops."""

    entity: tuple[tuple[str, Name], ...]
    ops: tuple[Op, ...]


@dataclass(slots=True)
class AlterResult:
    """Per distinct entity (first-seen order): the pairs to echo and its outcome; the overlay
    changes of the entities that succeeded (empty when nothing changes)."""

    results: list[tuple[tuple[tuple[str, Name], ...], ApiError]] = field(default_factory=list)
    changes: Overlay = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Component:
    """One DescribeClientQuotas filter component."""

    entity_type: str
    match_type: int
    match: str | None = None


# --- entities --------------------------------------------------------------------------------


def _name(name: str | None) -> Name:
    return None if name is None or name == DEFAULT else name


def entity_map(pairs: Iterable[tuple[str, str | None]]) -> dict[str, Name]:
    """The entity of a request entry: later pairs of a type replace earlier ones, as Kafka's
    request parsing puts them into one map."""
    out: dict[str, Name] = {}
    for entity_type, name in pairs:
        out[entity_type] = name
    return out


def canonical(entity: Mapping[str, str | None]) -> Entity:
    """The one spelling of an entity: sorted pairs, ``<default>`` as None."""
    return tuple(sorted((t, _name(n)) for t, n in entity.items()))


def _java_hash(text: str) -> int:
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h


def _hashmap_order(keys: list[str], initial_capacity: int) -> list[str]:
    """The iteration order of a java.util.HashMap built with this capacity and these keys (in
    order): Kafka's messages print entities as HashMaps."""
    cap = 1
    while cap < max(1, initial_capacity):
        cap *= 2
    while len(keys) > int(cap * 0.75):
        cap *= 2

    def bucket(key: str) -> int:
        h = _java_hash(key)
        return (h ^ (h >> 16)) & (cap - 1)

    return sorted(keys, key=lambda k: (bucket(k), keys.index(k)))


def entity_text(entity: Mapping[str, Name], initial_capacity: int | None = None) -> str:
    """Kafka's ``ClientQuotaEntity.toString()`` (the map in Java HashMap order)."""
    keys = _hashmap_order(list(entity), initial_capacity or len(entity))
    inner = ", ".join(f"{k}={'null' if entity[k] is None else entity[k]}" for k in keys)
    return f"ClientQuotaEntity(entries={{{inner}}})"


def looks_like_host(name: str) -> bool:
    """Whether ``name`` is a host name by its spelling (sans-IO; the proxy resolves it instead)."""
    return _HOST_NAME.fullmatch(name) is not None


# --- validation (ClientQuotaControlManager) ---------------------------------------------------


def _validate_entity(entity: Mapping[str, Name]) -> ApiError:
    if not entity:
        return ApiError("INVALID_REQUEST", "Invalid empty client quota entity")
    for entity_type, name in entity.items():
        if entity_type not in (USER, CLIENT_ID, IP):
            return ApiError("INVALID_REQUEST", f"Unhandled client quota entity type: {entity_type}")
        if name is not None and name == "":
            return ApiError("INVALID_REQUEST", f"Empty {entity_type} not supported")
    return NONE


def keys_for(
    entity: Mapping[str, Name],
    ip_valid: Callable[[str], bool] = is_ip_literal,
    resolvable: Callable[[str], bool] | None = None,
) -> dict[str, str] | ApiError:
    """The keys (and their Kafka types) an entity may carry, or Kafka's error for the combination."""
    has_user, has_client, has_ip = USER in entity, CLIENT_ID in entity, IP in entity
    if has_ip:
        if has_user or has_client:
            # Kafka's text, its missing space included.
            return ApiError(
                "INVALID_REQUEST",
                "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
            )
        ip = entity[IP]
        if ip is not None and not ip_valid(ip):
            if (resolvable or looks_like_host)(ip):
                # Kafka would resolve it; the proxy matches connections by address only.
                return ApiError(
                    "INVALID_REQUEST",
                    f"kthrottle: {ip} is a host name; give its IP address (the proxy matches client "
                    "connections by address)",
                )
            return ApiError("INVALID_REQUEST", f"{ip} is not a valid IP or resolvable host.")
        return dict(IP_KEYS)
    if has_user or has_client:
        keys = dict(USER_CLIENT_KEYS)
        if not has_client:
            keys.update(USER_ONLY_KEYS)
        return keys
    return ApiError("INVALID_REQUEST", "Invalid empty client quota entity")


def validate_value(keys: Mapping[str, str], key: str, value: float) -> ApiError:
    """Kafka's validateQuotaKeyValue: known key, positive, integral where the type is."""
    kind = keys.get(key)
    if kind is None:
        return ApiError("INVALID_REQUEST", f"Invalid configuration key {key}")
    if math.isnan(value) or value <= 0.0:
        # Kafka lets NaN through to the config; the proxy's quotas cannot hold it.
        return ApiError("INVALID_REQUEST", f"Quota {key} must be greater than 0")
    if kind == "DOUBLE":
        if math.isinf(value):  # likewise: no finite quota
            return ApiError("INVALID_REQUEST", f"Quota {key} must be greater than 0")
        return NONE
    limit, article, name = (_INT_MAX, "an", "INT") if kind == "INT" else (_LONG_MAX, "a", "LONG")
    if value > limit:
        return ApiError("INVALID_REQUEST", f"Proposed value for {key} is too large for {article} {name}.")
    if abs(math.fmod(value, 1.0)) > 1e-6:
        return ApiError("INVALID_REQUEST", f"{key} cannot be a fractional value.")
    return NONE


def alter(
    alterations: Iterable[Alteration],
    current: Overlay,
    ip_valid: Callable[[str], bool] = is_ip_literal,
    resolvable: Callable[[str], bool] | None = None,
) -> AlterResult:
    """Validate a request's alterations as Kafka's controller does; the changes of the entities
    that passed. Nothing is applied here (validate_only simply drops ``changes``).

    As in Kafka, a duplicate key in one entry, or an entity given twice, fails that entity with
    "Ignoring duplicate entity ..."; unlike Kafka (whose first occurrence is still written), an
    entity reported as failed is never changed.
    """
    result = AlterResult()
    outcomes: dict[Entity, ApiError] = {}
    echoes: dict[Entity, tuple[tuple[str, Name], ...]] = {}
    for alteration in alterations:
        entity = entity_map(alteration.entity)
        key = canonical(entity)
        # The broker answers with its HashMap of the entity, in that order.
        echo = tuple((t, entity[t]) for t in _hashmap_order(list(entity), len(entity)))
        duplicate_key = False
        values: dict[str, float | None] = {}
        for op in alteration.ops:
            if op.key in values:
                duplicate_key = True  # Kafka then overwrites this with the duplicate entity text
            else:
                values[op.key] = op.value
        if duplicate_key or key in outcomes:
            outcomes[key] = ApiError("INVALID_REQUEST", f"Ignoring duplicate entity {entity_text(entity)}")
            echoes.setdefault(key, echo)
            result.changes.pop(key, None)
            continue
        echoes[key] = echo
        outcomes[key], change = _alter_entity(entity, values, current.get(key, {}), ip_valid, resolvable)
        if change:
            result.changes[key] = change
    result.results = [(echoes[k], outcomes[k]) for k in outcomes]
    return result


def _alter_entity(
    entity: Mapping[str, Name],
    values: Mapping[str, float | None],
    current: Mapping[str, float | None],
    ip_valid: Callable[[str], bool],
    resolvable: Callable[[str], bool] | None,
) -> tuple[ApiError, Values]:
    error = _validate_entity(entity)
    if error.failed:
        return error, {}
    keys = keys_for(entity, ip_valid, resolvable)
    if isinstance(keys, ApiError):
        return keys, {}
    # Every key given is recorded, changed or not: a diff against this instance's view of the
    # overlay could be stale (another alteration landing meanwhile), and recording is idempotent.
    change: Values = {}
    for key, value in values.items():
        if value is None:
            # Kafka removes without checking the key; the proxy records the removal of a key the
            # entity can carry (it wins over the config file).
            if key in keys:
                change[key] = None
            continue
        error = validate_value(keys, key, value)
        if error.failed:
            return error, {}
        change[key] = float(value)
    return NONE, change


# --- the overlay on the config file's quotas --------------------------------------------------


def _section(data: dict[str, Any], entity: Entity) -> dict[str, Any] | None:
    """The config dict (created on demand) that holds an entity's keys; None for entities the
    proxy's config cannot express (it never gets one: alterations are validated first)."""
    e = dict(entity)
    if IP in e and len(e) == 1:
        return data.setdefault("ips", {}).setdefault(e[IP] or DEFAULT, {})  # type: ignore[no-any-return]
    if set(e) == {USER}:
        return data.setdefault("users", {}).setdefault(e[USER] or DEFAULT, {})  # type: ignore[no-any-return]
    if set(e) == {CLIENT_ID}:
        return data.setdefault("clients", {}).setdefault(e[CLIENT_ID] or DEFAULT, {})  # type: ignore[no-any-return]
    if set(e) == {USER, CLIENT_ID}:
        user = data.setdefault("users", {}).setdefault(e[USER] or DEFAULT, {})
        return user.setdefault("clients", {}).setdefault(e[CLIENT_ID] or DEFAULT, {})  # type: ignore[no-any-return]
    return None


def apply_overlay(cfg: QuotaConfig, overlay: Overlay) -> QuotaConfig:
    """The effective quotas: the config file's with each overlaid key set or removed."""
    if not overlay:
        return cfg
    data = cfg.model_dump(mode="python", by_alias=True, exclude_none=True)
    for entity, values in overlay.items():
        section = _section(data, entity)
        if section is None:
            continue
        for key, value in values.items():
            if value is None:
                section.pop(key, None)
            else:
                section[key] = value
        if section.get("scope") is not None and not any(key in section for key in SCOPED_KEYS):
            section.pop("scope")  # no quota left that a scope applies to
    return QuotaConfig.model_validate(data)


def effective_entities(cfg: QuotaConfig) -> dict[Entity, dict[str, float]]:
    """Every entity with at least one quota key, and its keys (what DescribeClientQuotas lists)."""
    out: dict[Entity, dict[str, float]] = {}

    def add(entity: dict[str, Name], values: Mapping[str, float | None]) -> None:
        found = {k: float(v) for k, v in values.items() if v is not None}
        if found:
            out[canonical(entity)] = found

    client_keys = (*USER_CLIENT_KEYS, *USER_ONLY_KEYS)
    for user, uq in cfg.users.items():
        add({USER: _name(user)}, {k: uq.get(k) for k in client_keys})
        for client, cq in uq.clients.items():
            add({USER: _name(user), CLIENT_ID: _name(client)}, {k: cq.get(k) for k in client_keys})
    for client, cq in cfg.clients.items():
        add({CLIENT_ID: _name(client)}, {k: cq.get(k) for k in client_keys})
    for ip, iq in cfg.ips.items():
        add({IP: _name(ip)}, {CONNECTION_CREATION_RATE: iq.connection_creation_rate})
    return out


# --- describe (ClientQuotasImage.describe) ----------------------------------------------------


def describe(
    cfg: QuotaConfig, components: Iterable[Component], strict: bool
) -> list[tuple[Entity, dict[str, float]]]:
    """Entities of the effective quotas matching the filter, as the broker answers; raises
    ``DescribeError`` with Kafka's error and text for a filter it refuses."""
    exact: dict[str, Name] = {}
    typed: set[str] = set()
    for c in components:
        if c.entity_type == "":
            raise DescribeError("INVALID_REQUEST", "Invalid empty entity type.")
        if c.entity_type in exact or c.entity_type in typed:
            raise DescribeError(
                "INVALID_REQUEST", f"Entity type {c.entity_type} cannot appear more than once in the filter."
            )
        if c.entity_type not in (IP, USER, CLIENT_ID):
            raise DescribeError("UNSUPPORTED_VERSION", f"Unsupported entity type {c.entity_type}")
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                raise DescribeError(
                    "INVALID_REQUEST", "Request specified MATCH_TYPE_EXACT, but set match string to null."
                )
            exact[c.entity_type] = _name(c.match)
        elif c.match_type == MATCH_DEFAULT:
            if c.match is not None:
                raise DescribeError(
                    "INVALID_REQUEST",
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                )
            exact[c.entity_type] = None
        elif c.match_type == MATCH_ANY:
            if c.match is not None:
                raise DescribeError(
                    "INVALID_REQUEST",
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                )
            typed.add(c.entity_type)
        else:
            raise DescribeError("INVALID_REQUEST", f"Unknown match type {c.match_type}")
    if (IP in exact or IP in typed) and (
        USER in exact or USER in typed or CLIENT_ID in exact or CLIENT_ID in typed
    ):
        raise DescribeError(
            "INVALID_REQUEST",
            "Invalid entity filter component combination. IP filter component should not be used "
            "with user or clientId filter component.",
        )
    found = []
    for entity, values in effective_entities(cfg).items():
        e = dict(entity)
        if strict and len(e) != len(exact) + len(typed):
            continue
        if any(t not in e or e[t] != name for t, name in exact.items()):
            continue
        if any(t not in e for t in typed):
            continue
        found.append((entity, values))
    return found


# --- storage encoding (the compacted topic) ---------------------------------------------------


class RecordError(ValueError):
    """A stored overlay record the proxy cannot read (skipped, logged)."""


def encode_key(entity: Entity, key: str) -> bytes:
    """Topic key of one quota key of an entity: compact JSON of the entity's sorted [type, name]
    pairs (null: default) and the key. One record per (entity, key), so alterations of different
    keys of one entity, made at once through different proxies, never overwrite each other."""
    return json.dumps([[list(p) for p in entity], key], separators=(",", ":")).encode()


def encode_value(value: float | None) -> bytes:
    """Topic value: the number, or null for a key removed (which wins over the config file)."""
    return json.dumps(value).encode()


def decode_key(data: bytes) -> tuple[Entity, str]:
    try:
        pairs, key = json.loads(data)
        entity = {str(t): (None if n is None else str(n)) for t, n in pairs}
    except (ValueError, TypeError, RecursionError) as exc:
        raise RecordError(f"not an entity and key: {exc}") from exc
    keys = keys_for(entity, lambda _ip: True) if not _validate_entity(entity).failed else None
    if keys is None or isinstance(keys, ApiError):
        raise RecordError(f"not a quota entity: {entity}")
    if not isinstance(key, str) or key not in keys:
        raise RecordError(f"key {key!r} not valid for {entity}")
    return canonical(entity), key


def decode_value(entity: Entity, key: str, data: bytes | None) -> tuple[bool, float | None]:
    """(present, value) of a record: a tombstone is not present (the file's value again); a value
    Kafka would refuse is an error, so a bad record never reaches the quotas."""
    if data is None:
        return False, None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON: {exc}") from exc
    if value is None:
        return True, None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RecordError(f"{key}: {value!r} is not a number")
    try:
        number = float(value)
    except OverflowError as exc:  # an integer past a float's range
        raise RecordError(f"{key}: an integer past a float's range") from exc
    keys = keys_for(dict(entity), lambda _ip: True)
    assert not isinstance(keys, ApiError)  # decode_key checked the entity
    error = validate_value(keys, key, number)
    if error.failed:
        raise RecordError(error.message or key)
    return True, number
