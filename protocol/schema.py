"""Compile Kafka's message JSON schemas into fast per-version readers and writers.

The schemas are the ones Kafka generates its own code from; kafka-python 3.x ships them as
package data, so we load them from there rather than keep a copy. kafka-python's own codec
drops unknown tagged fields and copies record bytes, so the walker here is ours: it keeps
unknown tagged fields as raw bytes (re-encoded verbatim, in tag order), returns record sets
as zero-copy memoryviews, and can report where each top-level field starts so a caller can
patch a value in place instead of re-encoding.

A decoded struct is a plain ``dict`` keyed by snake_case field names. Tagged fields appear
only when they were present on the wire; unknown ones live under ``UNKNOWN_TAGS``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from kafka.protocol.schemas.load_json import load_json
from mypy_extensions import i64

UNKNOWN_TAGS: Final = "_unknown_tags"
MAX_VERSION: Final = 32767

Buffer = bytes | bytearray | memoryview
Reader = Callable[[Buffer, int], tuple[Any, int]]
Writer = Callable[[bytearray, Any], None]


class SchemaError(ValueError):
    """Bytes that do not match the schema: truncated, negative lengths, trailing garbage."""


# --- primitives -----------------------------------------------------------------------------

_I8: Final = struct.Struct(">b")
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_U16: Final = struct.Struct(">H")
_F64: Final = struct.Struct(">d")


# Over ``bytes`` (the decoder's frames), compiled, a byte is read natively: no boxed index, no
# call into ``struct``, no tuple. The callers check the bounds.
def int16_at(buf: bytes, pos: i64) -> i64:
    """A big-endian int16."""
    value: i64 = buf[pos] << 8 | buf[pos + 1]
    return value - 0x10000 if value >= 0x8000 else value


def int32_at(buf: bytes, pos: i64) -> i64:
    """A big-endian int32."""
    value: i64 = buf[pos] << 24 | buf[pos + 1] << 16 | buf[pos + 2] << 8 | buf[pos + 3]
    return value - 0x100000000 if value >= 0x80000000 else value


def uvarint_at(buf: bytes, pos: i64) -> tuple[i64, i64]:
    """``read_uvarint`` over bytes, with the bounds checked; a one-byte varint, nearly every
    count and length, read first."""
    if 0 <= pos < len(buf):
        first: i64 = buf[pos]
        if first < 0x80:
            return first, pos + 1
    result: i64 = 0
    shift: i64 = 0
    size: i64 = len(buf)
    while True:
        if pos < 0 or pos >= size:
            raise SchemaError("truncated varint")
        byte: i64 = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise SchemaError("varint too long")


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 varint, as Kafka's compact lengths and tags use."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise SchemaError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise SchemaError("varint too long")


def skip_tagged_fields(buf: Buffer, pos: int) -> int:
    """Position after a tagged-field section starting at ``pos`` (count, then tag/size/data each)."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise SchemaError("truncated tagged fields")
    return pos


def write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _fixed(st: struct.Struct) -> tuple[Reader, Writer]:
    size = st.size
    unpack_from = st.unpack_from
    pack = st.pack

    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        end = pos + size
        if end > len(buf):
            raise SchemaError("truncated")
        return unpack_from(buf, pos)[0], end

    def write(out: bytearray, value: Any) -> None:
        out += pack(value)

    return read, write


def _bool() -> tuple[Reader, Writer]:
    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos >= len(buf):
            raise SchemaError("truncated")
        return buf[pos] != 0, pos + 1

    def write(out: bytearray, value: Any) -> None:
        out.append(1 if value else 0)

    return read, write


def _uuid() -> tuple[Reader, Writer]:
    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        end = pos + 16
        if end > len(buf):
            raise SchemaError("truncated")
        return bytes(buf[pos:end]), end

    def write(out: bytearray, value: Any) -> None:
        if len(value) != 16:
            raise SchemaError("uuid must be 16 bytes")
        out += value

    return read, write


def _length_codec(compact: bool, wide: bool) -> tuple[Reader, Writer]:
    """Length prefix: compact = uvarint(n + 1) with 0 for null, else int16/int32 with -1 for null."""
    if compact:

        def read_c(buf: Buffer, pos: int) -> tuple[Any, int]:
            n, pos = read_uvarint(buf, pos)
            return n - 1, pos

        def write_c(out: bytearray, n: Any) -> None:
            write_uvarint(out, n + 1)

        return read_c, write_c
    return _fixed(_I32 if wide else _I16)


def _blob(kind: str, compact: bool, nullable: bool) -> tuple[Reader, Writer]:
    """string (str), bytes (bytes) and records (zero-copy memoryview)."""
    read_len, write_len = _length_codec(compact, wide=kind != "string")

    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        n, pos = read_len(buf, pos)
        if n < 0:
            if n == -1 and (nullable or kind == "records"):
                return None, pos
            raise SchemaError(f"negative length {n} for {kind}")
        end = pos + n
        if end > len(buf):
            raise SchemaError(f"truncated {kind}")
        if kind == "string":
            try:
                return str(buf[pos:end], "utf-8"), end
            except UnicodeDecodeError as exc:
                raise SchemaError("string is not UTF-8") from exc
        if kind == "records":
            return memoryview(buf)[pos:end], end
        return bytes(buf[pos:end]), end

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            write_len(out, -1)
            return
        data = value.encode("utf-8") if isinstance(value, str) else value
        write_len(out, len(data))
        out += data

    return read, write


def _array(elem_read: Reader, elem_write: Writer, compact: bool) -> tuple[Reader, Writer]:
    read_len, write_len = _length_codec(compact, wide=True)

    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        n, pos = read_len(buf, pos)
        if n < 0:
            if n == -1:
                return None, pos
            raise SchemaError(f"negative array length {n}")
        if n > len(buf) - pos:  # every element takes at least one byte
            raise SchemaError(f"array length {n} exceeds the frame")
        items: list[Any] = []
        append = items.append
        for _ in range(n):
            item, pos = elem_read(buf, pos)
            append(item)
        return items, pos

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            write_len(out, -1)
            return
        write_len(out, len(value))
        for item in value:
            elem_write(out, item)

    return read, write


# --- schema model -------------------------------------------------------------------------


def parse_versions(text: str | None) -> tuple[int, int] | None:
    """'3+', '0-7', '5', 'none' -> inclusive (lo, hi), or None for 'none'/missing."""
    if text is None or text.strip() in ("", "none"):
        return None
    text = text.strip()
    if text.endswith("+"):
        return int(text[:-1]), MAX_VERSION
    if "-" in text:
        lo, hi = text.split("-")
        return int(lo), int(hi)
    return int(text), int(text)


def _in(version: int, rng: tuple[int, int] | None) -> bool:
    return rng is not None and rng[0] <= version <= rng[1]


_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


@cache
def snake(name: str) -> str:
    """Kafka's CamelCase field names as snake_case keys: ThrottleTimeMs -> throttle_time_ms."""
    return _CAMEL.sub("_", name).lower()


_DEFAULTS: Final = {
    "bool": False,
    "float64": 0.0,
    "uuid": bytes(16),
    "string": "",
    "bytes": b"",
    "records": None,
}


def _default(field: dict[str, Any], version: int) -> Any:
    ftype: str = field["type"]
    raw = field.get("default")
    nullable = _in(version, parse_versions(field.get("nullableVersions")))
    if ftype.startswith("[]"):
        return None if raw == "null" and nullable else []
    if ftype[0].isupper():
        return None
    if raw == "null" and nullable:
        return None
    if ftype in ("int8", "int16", "int32", "int64", "uint16"):
        return int(raw, 0) if isinstance(raw, str) and raw not in ("", "null") else 0
    if ftype == "bool":
        return raw == "true" if isinstance(raw, str) else bool(raw)
    if ftype == "string" and isinstance(raw, str) and raw != "null":
        return raw
    return _DEFAULTS.get(ftype)


@dataclass(frozen=True)
class StructCodec:
    """Reader and writer for one struct at one version."""

    read: Reader
    write: Writer
    field_names: tuple[str, ...]
    read_with_positions: Callable[[Buffer, int], tuple[dict[str, Any], int, dict[str, int]]]


def compile_struct(fields: list[dict[str, Any]], version: int, flexible: bool) -> StructCodec:
    """Build a codec for ``fields`` at ``version``; ``flexible`` selects compact encodings + tags."""
    plain: list[tuple[str, Reader, Writer, Any]] = []
    tagged: dict[int, tuple[str, Reader, Writer]] = {}
    for field in fields:
        if not _in(version, parse_versions(field.get("versions"))):
            continue
        name = snake(field["name"])
        field_flexible = flexible and field.get("flexibleVersions") != "none"
        field_read, field_write = _field_codec(field, version, field_flexible)
        if flexible and _in(version, parse_versions(field.get("taggedVersions"))):
            tagged[int(field["tag"])] = (name, field_read, field_write)
        else:
            plain.append((name, field_read, field_write, _default(field, version)))
    by_name = {name: (tag, w) for tag, (name, _r, w) in tagged.items()}
    names = tuple(p[0] for p in plain) + tuple(by_name)

    def read_tags(buf: Buffer, pos: int, obj: dict[str, Any]) -> int:
        count, pos = read_uvarint(buf, pos)
        unknown: dict[int, bytes] | None = None
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise SchemaError("truncated tagged field")
            known = tagged.get(tag)
            if known is None:
                if unknown is None:
                    unknown = obj[UNKNOWN_TAGS] = {}
                unknown[tag] = bytes(buf[pos:end])
            else:
                value, used = known[1](buf, pos)
                if used != end:
                    raise SchemaError(f"tagged field {tag} has {end - used} stray bytes")
                obj[known[0]] = value
            pos = end
        return pos

    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        obj: dict[str, Any] = {}
        for name, reader, _w, _d in plain:
            obj[name], pos = reader(buf, pos)
        if flexible:
            pos = read_tags(buf, pos, obj)
        return obj, pos

    def read_with_positions(buf: Buffer, pos: int) -> tuple[dict[str, Any], int, dict[str, int]]:
        obj: dict[str, Any] = {}
        positions: dict[str, int] = {}
        for name, reader, _w, _d in plain:
            positions[name] = pos
            obj[name], pos = reader(buf, pos)
        if flexible:
            pos = read_tags(buf, pos, obj)
        return obj, pos, positions

    def write(out: bytearray, obj: Any) -> None:
        for name, _r, writer, default in plain:
            writer(out, obj.get(name, default))
        if not flexible:
            return
        entries: list[tuple[int, bytes]] = []
        for name, (tag, writer) in by_name.items():
            if name in obj:
                tmp = bytearray()
                writer(tmp, obj[name])
                entries.append((tag, bytes(tmp)))
        unknown = obj.get(UNKNOWN_TAGS)
        if unknown:
            entries.extend(unknown.items())
        entries.sort(key=lambda e: e[0])
        write_uvarint(out, len(entries))
        for tag, data in entries:
            write_uvarint(out, tag)
            write_uvarint(out, len(data))
            out += data

    return StructCodec(read, write, names, read_with_positions)


def _field_codec(field: dict[str, Any], version: int, flexible: bool) -> tuple[Reader, Writer]:
    ftype: str = field["type"]
    nullable = _in(version, parse_versions(field.get("nullableVersions")))
    if ftype.startswith("[]"):
        elem = ftype[2:]
        if elem[0].isupper():
            sub = compile_struct(field["fields"], version, flexible)
            return _array(sub.read, sub.write, flexible)
        er, ew = _primitive(elem, flexible, nullable=False)
        return _array(er, ew, flexible)
    if ftype[0].isupper():
        sub = compile_struct(field["fields"], version, flexible)
        if not nullable:
            return sub.read, sub.write
        return _nullable_struct(sub)
    return _primitive(ftype, flexible, nullable)


def _nullable_struct(sub: StructCodec) -> tuple[Reader, Writer]:
    """Nullable structs carry a leading int8: -1 for null, 1 for present."""

    read_marker = _fixed(_I8)[0]

    def read(buf: Buffer, pos: int) -> tuple[Any, int]:
        marker, pos = read_marker(buf, pos)
        if marker < 0:
            return None, pos
        return sub.read(buf, pos)

    def write(out: bytearray, value: Any) -> None:
        if value is None:
            out += _I8.pack(-1)
        else:
            out += _I8.pack(1)
            sub.write(out, value)

    return read, write


def _primitive(ftype: str, flexible: bool, nullable: bool) -> tuple[Reader, Writer]:
    fixed = {"int8": _I8, "int16": _I16, "int32": _I32, "int64": _I64, "uint16": _U16, "float64": _F64}
    if ftype in fixed:
        return _fixed(fixed[ftype])
    if ftype == "bool":
        return _bool()
    if ftype == "uuid":
        return _uuid()
    if ftype in ("string", "bytes", "records"):
        return _blob(ftype, flexible, nullable)
    raise SchemaError(f"unsupported field type {ftype!r}")


# --- message registry -----------------------------------------------------------------------


@dataclass(frozen=True)
class MessageSchema:
    """One request or response message: its api key, valid and flexible versions, fields."""

    name: str
    api_key: int
    valid: tuple[int, int]
    flexible: tuple[int, int] | None
    fields: list[dict[str, Any]]

    def is_flexible(self, version: int) -> bool:
        return _in(version, self.flexible)

    def supports(self, version: int) -> bool:
        return _in(version, self.valid)


@cache
def message_schema(name: str) -> MessageSchema:
    """Load e.g. 'ProduceRequest' from the schemas that ship with kafka-python."""
    data = load_json(name)
    valid = parse_versions(data["validVersions"])
    if valid is None:
        raise SchemaError(f"{name} has no valid versions")
    return MessageSchema(
        name=name,
        api_key=int(data.get("apiKey", -1)),
        valid=valid,
        flexible=parse_versions(data.get("flexibleVersions")),
        fields=data["fields"],
    )


@cache
def message_codec(name: str, version: int) -> StructCodec:
    """The compiled codec for one message at one version (compiled once, then cached)."""
    schema = message_schema(name)
    if not schema.supports(version):
        raise SchemaError(f"{name} v{version} is outside {schema.valid[0]}-{schema.valid[1]}")
    return compile_struct(schema.fields, version, schema.is_flexible(version))
