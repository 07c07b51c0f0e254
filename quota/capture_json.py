"""One capture record as a compact JSON object: the message value of the proxy's Kafka capture sink.

The object has exactly the capture schema's field names (``FIELD_NAMES``), partitions as objects
with ``PARTITION_FIELDS``' names; the schema version travels beside it (a message header, see
``CAPTURE_VERSION_KEY``), not inside. ``decode`` checks every field against its schema type, so a
decoded row always fits the Arrow schema (``arrow_schema``) and the files sink's writer.

Pure: no I/O, no Kafka client; the proxy encodes, ``kthrottle capture-export`` decodes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from quota.capture_schema import FIELD_NAMES, FIELDS, PARTITION_FIELDS, Field

PARTITION_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in PARTITION_FIELDS)
_FIELD_SET: Final = frozenset(FIELD_NAMES)
_PARTITION_SET: Final = frozenset(PARTITION_NAMES)
_INT_BOUNDS: Final = {
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}


class CaptureJsonError(ValueError):
    """A message value that is not a capture record of this schema; the text names the field."""


def _partition_object(p: Any) -> dict[str, Any]:
    if isinstance(p, Mapping):
        return {name: p[name] for name in PARTITION_NAMES}
    return dict(zip(PARTITION_NAMES, p, strict=True))


def encode(row: Sequence[Any]) -> bytes:
    """A row (values in ``FIELD_NAMES`` order) as compact UTF-8 JSON.

    Raises ``ValueError`` for a row of the wrong length or a float that JSON cannot carry.
    """
    obj = dict(zip(FIELD_NAMES, row, strict=True))
    obj["partitions"] = [_partition_object(p) for p in obj["partitions"]]
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _check(value: Any, type_name: str, where: str) -> Any:
    bounds = _INT_BOUNDS.get(type_name)
    if bounds is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaptureJsonError(f"{where}: {value!r} is not an integer ({type_name})")
        if not bounds[0] <= value <= bounds[1]:
            raise CaptureJsonError(f"{where}: {value} is out of range for {type_name}")
        return value
    if type_name == "float64":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CaptureJsonError(f"{where}: {value!r} is not a number")
        return float(value)
    if type_name == "bool":
        if not isinstance(value, bool):
            raise CaptureJsonError(f"{where}: {value!r} is not true or false")
        return value
    if type_name == "string":
        if not isinstance(value, str):
            raise CaptureJsonError(f"{where}: {value!r} is not a string")
        return value
    if type_name.startswith("list<"):
        if not isinstance(value, list):
            raise CaptureJsonError(f"{where}: {value!r} is not a list")
        inner = type_name[5:-1]
        if inner == "partition":
            return [_partition(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return [_check(item, inner, f"{where}[{i}]") for i, item in enumerate(value)]
    raise CaptureJsonError(f"{where}: schema type {type_name!r} unknown to the JSON codec")


def _partition(value: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(value, dict):
        raise CaptureJsonError(f"{where}: {value!r} is not a partition object")
    _same_keys(value, _PARTITION_SET, where)
    return tuple(_check(value[f.name], f.type, f"{where}.{f.name}") for f in PARTITION_FIELDS)


def _same_keys(obj: dict[str, Any], want: frozenset[str], where: str) -> None:
    keys = set(obj)
    if keys != want:
        problems = []
        if want - keys:
            problems.append("missing " + ", ".join(sorted(want - keys)))
        if keys - want:
            problems.append("unknown " + ", ".join(sorted(keys - want)))
        raise CaptureJsonError(f"{where}: " + "; ".join(problems))


def decode(value: bytes | bytearray | memoryview | str) -> tuple[Any, ...]:
    """The row (``FIELD_NAMES`` order, partitions as tuples) of one encoded record.

    Raises ``CaptureJsonError`` naming the first field that is missing, unknown or mistyped.
    """
    try:
        obj = json.loads(bytes(value) if isinstance(value, memoryview) else value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaptureJsonError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CaptureJsonError(f"not a JSON object but {type(obj).__name__}")
    _same_keys(obj, _FIELD_SET, "record")
    return tuple(_field(obj, f) for f in FIELDS)


def _field(obj: dict[str, Any], f: Field) -> Any:
    return _check(obj[f.name], f.type, f.name)
