"""Broker addresses at the end of Produce (v10+) and Fetch (v16+) responses (KIP-951), found
without decoding the response.

Those responses may end with ``NodeEndpoints``: the host and port of new partition leaders, a
broker address the proxy must not let through. It is a top-level tagged field, after all the
partitions (and their records). ``TailFinder`` walks a response's structure as its bytes go by
(partition headers read, records skipped by their length), so the proxy knows where the
top-level tagged fields begin without building the response, and without having all of it: it
is fed the frame piece by piece, as a streamed response arrives, or whole. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Final

from protocol.api_keys import ApiKey
from protocol.schema import SchemaError, read_uvarint, skip_tagged_fields

# What the walk asks for next: n > 0 read n bytes (sent back), n < 0 skip -n bytes, 0 the
# top-level tagged fields begin here.
_Walk = Generator[int, bytes | None, None]

NODE_ENDPOINTS_TAG: Final = 0
# What a neutralised NodeEndpoints becomes: a tag no client knows for these responses (the same
# one-byte varint), so the response keeps its length and clients skip the field.
WITHHELD_TAG: Final = 0x7F


def _uvarint() -> Generator[int, bytes | None, int]:
    value = shift = 0
    while True:
        got = yield 1
        assert got is not None
        byte = got[0]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if shift > 28:
            raise SchemaError("varint too long")


def _length() -> Generator[int, bytes | None, int]:
    """A compact length (varint n + 1, 0 for null): -1 for null."""
    return (yield from _uvarint()) - 1


def _skip_tags() -> _Walk:
    count = yield from _uvarint()
    for _ in range(count):
        yield from _uvarint()  # tag
        size = yield from _uvarint()
        if size:
            yield -size


def _skip_compact(nullable: bool = True) -> _Walk:
    n = yield from _length()
    if n > 0:
        yield -n
    elif n < 0 and not nullable:
        raise SchemaError("null where none is allowed")


def _topic_key(version: int) -> _Walk:
    if version >= 13:
        yield -16  # topic id
    else:
        yield from _skip_compact(nullable=False)  # topic name


def _fetch(version: int) -> _Walk:
    yield -4  # correlation id
    yield from _skip_tags()  # response header
    yield -10  # throttle_time_ms, error_code, session_id
    for _ in range(max(0, (yield from _length()))):
        yield from _topic_key(version)
        for _ in range(max(0, (yield from _length()))):
            yield -30  # index, error_code, high_watermark, last_stable_offset, log_start_offset
            for _ in range(max(0, (yield from _length()))):  # aborted transactions (nullable)
                yield -16
                yield from _skip_tags()
            yield -4  # preferred_read_replica
            yield from _skip_compact()  # records
            yield from _skip_tags()
        yield from _skip_tags()
    yield 0


def _produce(version: int) -> _Walk:
    yield -4  # correlation id
    yield from _skip_tags()  # response header
    for _ in range(max(0, (yield from _length()))):
        yield from _topic_key(version)
        for _ in range(max(0, (yield from _length()))):
            yield -30  # index, error_code, base_offset, log_append_time_ms, log_start_offset
            for _ in range(max(0, (yield from _length()))):  # record errors
                yield -4
                yield from _skip_compact()
                yield from _skip_tags()
            yield from _skip_compact()  # error_message
            yield from _skip_tags()
        yield from _skip_tags()
    yield -4  # throttle_time_ms
    yield 0


class TailFinder:
    """Where the top-level tagged fields of one Produce or Fetch response begin, found as its
    frame's bytes are fed in order (from the correlation id on)."""

    __slots__ = ("_gathered", "_need", "_walk", "consumed", "tail_at")

    def __init__(self, api_key: int, version: int) -> None:
        self._walk = _fetch(version) if api_key == ApiKey.FETCH else _produce(version)
        self._need = next(self._walk)
        self._gathered = bytearray()  # bytes of a read not complete yet
        self.consumed = 0  # bytes of the frame walked so far
        self.tail_at: int | None = None  # the frame offset of the top-level tagged fields

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Walk the frame's next bytes; how many of them come before the tagged fields (all of
        them until those are found). SchemaError for a response that is not what it claims."""
        if self.tail_at is not None:
            return 0
        pos, size = 0, len(data)
        need, walk = self._need, self._walk
        try:
            while need and pos < size:
                if need < 0:
                    take = min(-need, size - pos)
                    pos += take
                    need += take
                    if not need:
                        need = walk.send(None)
                    continue
                gathered = self._gathered
                if not gathered and size - pos >= need:
                    piece, pos = bytes(data[pos : pos + need]), pos + need
                else:
                    take = min(need - len(gathered), size - pos)
                    gathered += data[pos : pos + take]
                    pos += take
                    if len(gathered) < need:
                        continue
                    piece = bytes(gathered)
                    gathered.clear()
                need = walk.send(piece)
        except StopIteration as exc:  # pragma: no cover - the walks end by yielding 0
            raise SchemaError("response walk ended early") from exc
        self._need = need
        self.consumed += pos
        if not need:
            self.tail_at = self.consumed
        return pos


def tail_of(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> memoryview:
    """The top-level tagged fields of a whole Produce or Fetch response frame (the same walk as
    ``TailFinder``, straight over the bytes: a small response costs a few microseconds)."""
    buf = memoryview(frame)
    pos = skip_tagged_fields(buf, 4)  # correlation id, response header
    if api_key == ApiKey.FETCH:
        pos += 10  # throttle_time_ms, error_code, session_id
    topics, pos = read_uvarint(buf, pos)
    for _ in range(topics - 1):
        if version >= 13:
            pos += 16
        else:
            n, pos = read_uvarint(buf, pos)
            pos += n - 1
        partitions, pos = read_uvarint(buf, pos)
        for _ in range(partitions - 1):
            pos += 30
            items, pos = read_uvarint(buf, pos)  # aborted transactions, or record errors
            for _ in range(items - 1):
                if api_key == ApiKey.FETCH:
                    pos += 16
                else:
                    pos += 4
                    n, pos = read_uvarint(buf, pos)
                    pos += max(0, n - 1)
                pos = skip_tagged_fields(buf, pos)
            if api_key == ApiKey.FETCH:
                pos += 4  # preferred_read_replica
            n, pos = read_uvarint(buf, pos)  # records, or error_message
            pos += max(0, n - 1)
            pos = skip_tagged_fields(buf, pos)
        pos = skip_tagged_fields(buf, pos)
    if api_key == ApiKey.PRODUCE:
        pos += 4  # throttle_time_ms
    if pos >= len(buf):
        raise SchemaError(f"truncated {api_key} v{version} response")
    return buf[pos:]


def node_endpoints_at(tail: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(offset of its tag, offset past its data) of NodeEndpoints in a tagged-field section."""
    count, pos = read_uvarint(tail, 0)
    for _ in range(count):
        start = pos
        tag, pos = read_uvarint(tail, pos)
        size, pos = read_uvarint(tail, pos)
        if pos + size > len(tail):
            raise SchemaError("truncated tagged field")
        if tag == NODE_ENDPOINTS_TAG:
            return start, pos + size
        pos += size
    return None


def withhold_node_endpoints(tail: bytearray | memoryview) -> bool:
    """Turn NodeEndpoints into a field clients skip, in place (same length; its bytes zeroed so
    no address is left in it); False when there is none."""
    found = node_endpoints_at(tail)
    if found is None:
        return False
    start, end = found
    tail[start] = WITHHELD_TAG
    _tag, pos = read_uvarint(tail, start)
    _size, pos = read_uvarint(tail, pos)
    tail[pos:end] = bytes(end - pos)
    return True
