"""Broker addresses in a Metadata response, rewritten without decoding its topics.

A Metadata answer lists the brokers first (after throttle_time_ms) and then every topic with
every partition: on a large cluster, megabytes of partitions the proxy has no reason to change.
``rewrite_metadata_brokers`` reads the broker list, writes it again with the addresses the client
should see, and keeps everything after it as the same bytes, so passing a Metadata answer on costs
per broker, not per partition. Sans-IO.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from protocol.schema import SchemaError, read_uvarint, skip_tagged_fields, write_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# (node_id, host, port) -> (host, port) the client should see instead.
AddressMap = Callable[[int, str, int], tuple[str, int]]

FLEXIBLE_FROM = 9  # compact strings and arrays, tagged fields
THROTTLE_FROM = 3
RACK_FROM = 1
MAX_VERSION = 13  # the newest MetadataResponse version this layout is known for


class _Reader:
    """Reads the broker list from a body view, raising SchemaError for what ends too soon."""

    __slots__ = ("buf", "flexible", "pos")

    def __init__(self, buf: memoryview, pos: int, flexible: bool) -> None:
        self.buf, self.pos, self.flexible = buf, pos, flexible

    def fixed(self, st: struct.Struct) -> int:
        if self.pos + st.size > len(self.buf):
            raise SchemaError("truncated Metadata broker list")
        (value,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return int(value)

    def length(self, wide: struct.Struct) -> int:
        """A compact length (flexible versions) or a ``wide`` one: -1 for null."""
        if self.flexible:
            n, self.pos = read_uvarint(self.buf, self.pos)
            return n - 1
        return self.fixed(wide)

    def string(self, nullable: bool) -> str | None:
        n = self.length(_I16)
        if n < 0:
            if n < -1 or not nullable:
                raise SchemaError("null broker host in a Metadata response")
            return None
        end = self.pos + n
        if end > len(self.buf):
            raise SchemaError("truncated string in a Metadata broker list")
        try:
            text = bytes(self.buf[self.pos : end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError(f"a Metadata broker string is not UTF-8: {exc}") from None
        self.pos = end
        return text


def _write_string(out: bytearray, text: str | None, flexible: bool) -> None:
    if text is None:
        if flexible:
            out.append(0)
        else:
            out += _I16.pack(-1)
        return
    data = text.encode("utf-8")
    if flexible:
        write_uvarint(out, len(data) + 1)
    else:
        out += _I16.pack(len(data))
    out += data


def rewrite_metadata_brokers(version: int, body: memoryview, amap: AddressMap) -> tuple[bytearray, int, int]:
    """The response body's start up to its broker list's end, with every broker's address through
    ``amap``, and the offset in ``body`` where the unchanged rest begins (cluster id, controller,
    topics); and how many addresses were rewritten. The response is ``prefix + body[offset:]``."""
    if not 0 <= version <= MAX_VERSION:
        raise SchemaError(f"Metadata v{version} has no known broker layout")
    flexible = version >= FLEXIBLE_FROM
    reader = _Reader(body, 0, flexible)
    out = bytearray()
    if version >= THROTTLE_FROM:
        out += _I32.pack(reader.fixed(_I32))
    count = reader.length(_I32)
    if count < 0:
        raise SchemaError("null broker list in a Metadata response")
    if flexible:
        write_uvarint(out, count + 1)
    else:
        out += _I32.pack(count)
    rewritten = 0
    for _ in range(count):
        node_id = reader.fixed(_I32)
        host = reader.string(nullable=False)
        assert host is not None
        port = reader.fixed(_I32)
        rack = reader.string(nullable=True) if version >= RACK_FROM else None
        if node_id >= 0:
            host, port = amap(node_id, host, port)
            rewritten += 1
        out += _I32.pack(node_id)
        _write_string(out, host, flexible)
        out += _I32.pack(port)
        if version >= RACK_FROM:
            _write_string(out, rack, flexible)
        if flexible:
            start = reader.pos
            reader.pos = skip_tagged_fields(body, start)
            out += body[start : reader.pos]
    return out, reader.pos, rewritten
