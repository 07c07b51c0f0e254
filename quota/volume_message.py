"""The volume usage message of the Strimzi cluster-wide volume quota proposal, as JSON. Sans-IO.

Each broker's usage is one record on a compacted topic, keyed by the broker id (decimal ASCII),
its value this JSON (the proposal's field names; the proposal chose JSON for debuggability)::

    {"SnapshotAt": "2024-05-01T12:00:00.000Z",
     "HardLimit": {"type": "MinFreePercentage", "level": 5},
     "SoftLimit": {"type": "MinFreePercentage", "level": 10},
     "Volumes": [{"VolumeName": "/var/lib/kafka/data-0", "Capacity": 1000000, "Consumed": 200000},
                 {"VolumeName": "/var/lib/kafka/data-1", "Capacity": 1000000, "Consumed": 950000,
                  "SoftLimit": {"type": "MinFreeBytes", "level": 100000}}]}

The message-level limits are the source broker's broker-wide limits; a volume may carry its own
``HardLimit``/``SoftLimit`` overriding them (the proposal's note 2). The proposal's table labels the
limits "Hard limit" and "Soft limit": they are written ``HardLimit``/``SoftLimit`` (the spelling of
its other identifiers, SnapshotAt and VolumeName) and read under either spelling. Unknown fields are
ignored, so a newer publisher can add fields without breaking older readers.

Decoding never lets a KeyError or TypeError out: every problem is a ``VolumeMessageError`` (a
ValueError) naming the field, e.g. ``Volumes[1].Capacity: must be an integer, got "10"``.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

LONG_MAX = 2**63 - 1  # the proposal's "long"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
# Dates Python's datetime can write: year 1 to 9999 (UTC).
MIN_SNAPSHOT_MS = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH) // _MS
MAX_SNAPSHOT_MS = (datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC) - EPOCH) // _MS

SNAPSHOT_AT = "SnapshotAt"
HARD_LIMIT = "HardLimit"
SOFT_LIMIT = "SoftLimit"
VOLUMES = "Volumes"
VOLUME_NAME = "VolumeName"
CAPACITY = "Capacity"
CONSUMED = "Consumed"
LIMIT_TYPE = "type"
LIMIT_LEVEL = "level"
# The spelling of the proposal's table, accepted when reading.
_LIMIT_ALIASES = {HARD_LIMIT: "Hard limit", SOFT_LIMIT: "Soft limit"}


class LimitType(enum.StrEnum):
    """The proposal's three limit types; the value is the wire (and config) name."""

    CONSUMED_SPACE = "ConsumedSpace"  # consumed bytes reach the level
    MIN_FREE_BYTES = "MinFreeBytes"  # free bytes fall to the level
    MIN_FREE_PERCENTAGE = "MinFreePercentage"  # free bytes fall to level % of capacity


_LIMIT_TYPES = ", ".join(t.value for t in LimitType)


class VolumeMessageError(ValueError):
    """A malformed volume message or key; ``field`` is the path of the bad field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def within(self, prefix: str) -> VolumeMessageError:
        """The same problem, its field path under ``prefix`` (a containing field)."""
        field = f"{prefix}.{self.field}" if self.field else prefix
        return VolumeMessageError(field, self.problem)


def _fail(field: str, problem: str) -> NoReturn:
    raise VolumeMessageError(field, problem)


def _show(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _check_long(field: str, value: object, low: int, high: int = LONG_MAX) -> int:
    # bool is an int to Python; never to JSON
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(field, f"must be an integer, got {_show(value)}")
    if not low <= value <= high:
        _fail(field, f"must be between {low} and {high}, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class LimitDefinition:
    """A limit as the proposal's Limit Definition: a type and the level at which it applies."""

    type: LimitType
    level: int | float

    def __post_init__(self) -> None:
        if not isinstance(self.type, LimitType):
            _fail(LIMIT_TYPE, f"must be one of {_LIMIT_TYPES}, got {_show(self.type)}")
        level = self.level
        if not isinstance(level, int | float) or isinstance(level, bool):
            _fail(LIMIT_LEVEL, f"must be a number, got {_show(level)}")
        try:
            finite = math.isfinite(level)
        except OverflowError:  # an integer past any float's range
            _fail(LIMIT_LEVEL, "must be a finite number >= 0, got an integer past a float's range")
        if not finite or level < 0:
            _fail(LIMIT_LEVEL, f"must be a finite number >= 0, got {level}")
        if self.type is LimitType.MIN_FREE_PERCENTAGE and level > 100:
            _fail(LIMIT_LEVEL, f"a {self.type.value} level is a percentage (0 to 100), got {level}")

    def to_json(self) -> dict[str, Any]:
        return {LIMIT_TYPE: self.type.value, LIMIT_LEVEL: self.level}

    @staticmethod
    def from_json(data: object) -> LimitDefinition:
        """Read a limit object; errors name ``type`` or ``level`` (callers prefix the path)."""
        obj = _object("", data)
        kind = _required(obj, LIMIT_TYPE)
        try:
            limit_type = LimitType(kind) if isinstance(kind, str) else None
        except ValueError:
            limit_type = None
        if limit_type is None:
            _fail(LIMIT_TYPE, f"must be one of {_LIMIT_TYPES}, got {_show(kind)}")
        return LimitDefinition(limit_type, _required(obj, LIMIT_LEVEL))


@dataclass(frozen=True, slots=True)
class VolumeDetails:
    """One storage volume of a broker: capacity and consumed bytes, and optional own limits."""

    name: str
    capacity: int
    consumed: int
    soft_limit: LimitDefinition | None = None  # overrides the message's broker-wide soft limit
    hard_limit: LimitDefinition | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            _fail(VOLUME_NAME, f"must be a non-empty string, got {_show(self.name)}")
        try:
            self.name.encode("utf-8")
        except UnicodeEncodeError:
            _fail(VOLUME_NAME, "must be valid Unicode (no lone surrogates)")
        _check_long(CAPACITY, self.capacity, 1)
        _check_long(CONSUMED, self.consumed, 0)
        if self.consumed > self.capacity:
            _fail(CONSUMED, f"{self.consumed} is more than the Capacity, {self.capacity}")
        for field, limit in ((SOFT_LIMIT, self.soft_limit), (HARD_LIMIT, self.hard_limit)):
            if limit is not None and not isinstance(limit, LimitDefinition):
                _fail(field, f"must be a limit definition, got {_show(limit)}")

    @property
    def free(self) -> int:
        """Free bytes: capacity less consumed (the proposal's model of a volume)."""
        return self.capacity - self.consumed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {VOLUME_NAME: self.name, CAPACITY: self.capacity, CONSUMED: self.consumed}
        if self.hard_limit is not None:
            out[HARD_LIMIT] = self.hard_limit.to_json()
        if self.soft_limit is not None:
            out[SOFT_LIMIT] = self.soft_limit.to_json()
        return out

    @staticmethod
    def from_json(data: object) -> VolumeDetails:
        obj = _object("", data)
        hard = _limit(obj, HARD_LIMIT, required=False)
        soft = _limit(obj, SOFT_LIMIT, required=False)
        return VolumeDetails(
            _required(obj, VOLUME_NAME),
            _required(obj, CAPACITY),
            _required(obj, CONSUMED),
            soft_limit=soft,
            hard_limit=hard,
        )


@dataclass(frozen=True, slots=True)
class VolumeSnapshot:
    """One broker's volume usage at ``snapshot_at_ms`` (Unix epoch ms) and the limits it declares."""

    snapshot_at_ms: int
    soft_limit: LimitDefinition
    hard_limit: LimitDefinition
    volumes: tuple[VolumeDetails, ...]

    def __post_init__(self) -> None:
        _check_long(SNAPSHOT_AT, self.snapshot_at_ms, MIN_SNAPSHOT_MS, MAX_SNAPSHOT_MS)
        for field, limit in ((SOFT_LIMIT, self.soft_limit), (HARD_LIMIT, self.hard_limit)):
            if not isinstance(limit, LimitDefinition):
                _fail(field, f"must be a limit definition, got {_show(limit)}")
        if not isinstance(self.volumes, tuple):
            _fail(VOLUMES, f"must be a tuple of volume details, got {_show(self.volumes)}")
        if not self.volumes:
            _fail(VOLUMES, "must list at least one volume")
        seen: set[str] = set()
        for i, volume in enumerate(self.volumes):
            if not isinstance(volume, VolumeDetails):
                _fail(f"{VOLUMES}[{i}]", f"must be volume details, got {_show(volume)}")
            if volume.name in seen:
                _fail(f"{VOLUMES}[{i}].{VOLUME_NAME}", f"{_show(volume.name)} is listed twice")
            seen.add(volume.name)

    @property
    def snapshot_at(self) -> str:
        """SnapshotAt as written: ISO 8601, UTC, millisecond precision."""
        return format_snapshot_at(self.snapshot_at_ms)

    def volume(self, name: str) -> VolumeDetails | None:
        return next((v for v in self.volumes if v.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            SNAPSHOT_AT: self.snapshot_at,
            HARD_LIMIT: self.hard_limit.to_json(),
            SOFT_LIMIT: self.soft_limit.to_json(),
            VOLUMES: [v.to_json() for v in self.volumes],
        }

    def encode(self) -> bytes:
        """The record value: compact UTF-8 JSON, never NaN or Infinity (not JSON)."""
        return json.dumps(self.to_json(), ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def format_snapshot_at(ms: int) -> str:
    """Epoch milliseconds as ISO 8601 in UTC, e.g. ``2024-05-01T12:00:00.250Z``."""
    return (EPOCH + ms * _MS).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_snapshot_at(text: object) -> int:
    """ISO 8601 date-time with a UTC offset (or Z) to epoch ms, rounded down to the millisecond."""
    if not isinstance(text, str):
        _fail(SNAPSHOT_AT, f"must be an ISO 8601 date-time string, got {_show(text)}")
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        _fail(SNAPSHOT_AT, f"is not an ISO 8601 date-time: {_show(text)}")
    if when.tzinfo is None or when.utcoffset() is None:
        _fail(SNAPSHOT_AT, f"needs a UTC offset or Z (a time without one is ambiguous): {_show(text)}")
    ms = (when - EPOCH) // _MS
    if not MIN_SNAPSHOT_MS <= ms <= MAX_SNAPSHOT_MS:
        _fail(SNAPSHOT_AT, f"is outside years 1 to 9999 in UTC: {_show(text)}")
    return ms


def _object(field: str, data: object) -> Mapping[str, object]:
    """``data`` as a JSON object; ``field`` is "" for a nested one (its caller names the path)."""
    if not isinstance(data, dict):
        _fail(field, f"must be a JSON object, got {_show(data)}")
    return data


def _required(obj: Mapping[str, object], key: str) -> Any:
    if key not in obj:
        _fail(key, "is missing")
    return obj[key]


def _limit(obj: Mapping[str, object], key: str, required: bool) -> LimitDefinition | None:
    alias = _LIMIT_ALIASES[key]
    if key in obj and alias in obj:
        _fail(key, f"given twice, as {key!r} and {alias!r}")
    name = alias if alias in obj else key
    if name not in obj:
        if required:
            _fail(key, "is missing")
        return None
    try:
        return LimitDefinition.from_json(obj[name])
    except VolumeMessageError as exc:
        raise exc.within(name) from None


def _no_constants(name: str) -> NoReturn:
    _fail("(message)", f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            _fail(key, "appears twice in one object")
        out[key] = value
    return out


def _parse_json(data: bytes, hook: Callable[[list[tuple[str, Any]]], dict[str, Any]]) -> object:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        _fail("(message)", f"is not UTF-8 (byte {exc.start})")
    try:
        return json.loads(text, object_pairs_hook=hook, parse_constant=_no_constants)
    except VolumeMessageError:
        raise
    except json.JSONDecodeError as exc:
        _fail("(message)", f"is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except ValueError as exc:  # e.g. an integer past Python's digit limit
        _fail("(message)", f"is not usable JSON: {exc}")
    except RecursionError:
        _fail("(message)", "is nested too deeply")


def decode(data: bytes | bytearray | memoryview) -> VolumeSnapshot:
    """Parse a record value; a VolumeMessageError (ValueError) naming the field on any problem."""
    if not isinstance(data, bytes | bytearray | memoryview):
        _fail("(message)", f"must be bytes, got {type(data).__name__}")
    obj = _object("(message)", _parse_json(bytes(data), _unique_keys))
    at = parse_snapshot_at(_required(obj, SNAPSHOT_AT))
    hard = _limit(obj, HARD_LIMIT, required=True)
    soft = _limit(obj, SOFT_LIMIT, required=True)
    assert hard is not None and soft is not None
    raw = _required(obj, VOLUMES)
    if not isinstance(raw, list):
        _fail(VOLUMES, f"must be a JSON array, got {_show(raw)}")
    volumes = []
    for i, item in enumerate(raw):
        try:
            volumes.append(VolumeDetails.from_json(item))
        except VolumeMessageError as exc:
            raise exc.within(f"{VOLUMES}[{i}]") from None
    return VolumeSnapshot(at, soft, hard, tuple(volumes))


def encode_key(broker_id: int) -> bytes:
    """The record key: the broker id in decimal ASCII."""
    if not isinstance(broker_id, int) or isinstance(broker_id, bool) or broker_id < 0:
        _fail("(key)", f"a broker id is an integer >= 0, got {_show(broker_id)}")
    return str(broker_id).encode("ascii")


def decode_key(key: bytes | bytearray | memoryview | None) -> int:
    """The broker id of a record key; VolumeMessageError unless decimal ASCII digits."""
    if key is None:
        _fail("(key)", "is missing: volume records are keyed by broker id")
    raw = bytes(key)
    if not raw or len(raw) > 10 or not raw.isdigit():
        _fail("(key)", f"must be a broker id in decimal ASCII, got {raw[:20]!r}")
    broker_id = int(raw)
    if broker_id > 2**31 - 1:
        _fail("(key)", f"broker id {broker_id} is past int32")
    return broker_id
