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

from mypy_extensions import i64

from protocol.api_keys import FETCH_KEY
from protocol.schema import SchemaError, read_uvarint, uvarint_at

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
        self._walk = _fetch(version) if api_key == FETCH_KEY else _produce(version)
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
        self._went_by(pos, need)
        return pos

    def skippable(self) -> int:
        """How many of the frame's next bytes the walk skips unread (a partition's records):
        they may go by without being fed, as ``skip``. 0 when it reads the next bytes."""
        need = self._need
        return -need if need < 0 else 0

    def skip(self, n: int) -> None:
        """``n`` (at most ``skippable()``) of the frame's next bytes went by unseen."""
        need = self._need
        if not 0 < n <= -need:
            raise ValueError(f"cannot skip {n} bytes where the walk skips {max(0, -need)}")
        need += n
        if not need:
            try:
                need = self._walk.send(None)
            except StopIteration as exc:  # pragma: no cover - the walks end by yielding 0
                raise SchemaError("response walk ended early") from exc
        self._went_by(n, need)

    def _went_by(self, n: int, need: int) -> None:
        """``n`` more of the frame's bytes went by, and the walk now asks for ``need``."""
        self._need = need
        self.consumed += n
        if not need:
            self.tail_at = self.consumed


# A whole frame up to this size is walked as a bytes copy: compiled, a bytes object is indexed
# natively, a bytearray or memoryview only through the generic protocol (a boxed int and a call a
# byte; a Produce answer's walk cost ten times its copy). Larger frames are walked in place.
TAIL_COPY_LIMIT: Final = 64 * 1024


def tail_of(
    api_key: int, version: int, frame: bytes | bytearray | memoryview, copy_limit: int = TAIL_COPY_LIMIT
) -> memoryview:
    """The top-level tagged fields of a whole Produce or Fetch response frame, a view of it (the
    same walk as ``TailFinder``, straight over the bytes: a small response costs a microsecond)."""
    if len(frame) > copy_limit:
        finder = TailFinder(api_key, version)
        finder.feed(frame)
        if finder.tail_at is None or finder.tail_at >= len(frame):
            raise SchemaError(f"truncated {api_key} v{version} response")
        return memoryview(frame)[finder.tail_at :]
    return memoryview(frame)[_tail_at(api_key, version, bytes(frame)) :]


def _tail_at(api_key: int, version: int, buf: bytes) -> int:
    # Native 64-bit positions and counters (i64): compiled, plain C arithmetic, no tagged-int
    # checks; `while` loops, as a `for` over a `range` of an i64 builds a range object and boxes
    # each step (fifteen of them a small Produce answer).
    fetch = api_key == FETCH_KEY
    pos = _skip_tags_at(buf, 4)  # correlation id, response header
    if fetch:
        pos += 10  # throttle_time_ms, error_code, session_id
    topics, pos = uvarint_at(buf, pos)
    topic: i64 = 1
    while topic < topics:
        topic += 1
        if version >= 13:
            pos += 16
        else:
            n, pos = uvarint_at(buf, pos)
            pos += n - 1
        partitions, pos = uvarint_at(buf, pos)
        partition: i64 = 1
        while partition < partitions:
            partition += 1
            pos += 30
            items, pos = uvarint_at(buf, pos)  # aborted transactions, or record errors
            item: i64 = 1
            while item < items:
                item += 1
                if fetch:
                    pos += 16
                else:
                    pos += 4
                    n, pos = uvarint_at(buf, pos)
                    if n > 1:
                        pos += n - 1
                pos = _skip_tags_at(buf, pos)
            if fetch:
                pos += 4  # preferred_read_replica
            n, pos = uvarint_at(buf, pos)  # records, or error_message
            if n > 1:
                pos += n - 1
            pos = _skip_tags_at(buf, pos)
        pos = _skip_tags_at(buf, pos)
    if not fetch:
        pos += 4  # throttle_time_ms
    if pos >= len(buf):
        raise SchemaError(f"truncated {api_key} v{version} response")
    return pos


def _skip_tags_at(buf: bytes, pos: i64) -> i64:
    """``schema.skip_tagged_fields`` over bytes."""
    if 0 <= pos < len(buf) and buf[pos] == 0:
        return pos + 1  # none, as nearly always
    count, pos = uvarint_at(buf, pos)
    while count > 0:
        count -= 1
        _tag, pos = uvarint_at(buf, pos)
        size, pos = uvarint_at(buf, pos)
        pos += size
    if pos > len(buf):
        raise SchemaError("truncated tagged fields")
    return pos


def node_endpoints_at(tail: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(offset of its tag, offset past its data) of NodeEndpoints in a tagged-field section."""
    return _endpoints_in(bytes(tail), 0)


def has_node_endpoints(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> bool:
    """Whether a whole Produce or Fetch response frame ends with NodeEndpoints: ``tail_of`` and
    ``node_endpoints_at`` in one walk over one copy (asked of nearly every such response)."""
    if isinstance(frame, bytes):
        buf = frame  # the decoder's frames are: walked with no copy
    elif len(frame) > TAIL_COPY_LIMIT:
        return node_endpoints_at(tail_of(api_key, version, frame)) is not None
    else:
        buf = bytes(frame)
    return _endpoints_in(buf, _tail_at(api_key, version, buf)) is not None


def _endpoints_in(buf: bytes, pos: i64) -> tuple[int, int] | None:
    """NodeEndpoints in the tagged-field section at ``pos``: its tag's and its end's offsets from
    there."""
    origin = pos
    count, pos = uvarint_at(buf, pos)
    while count > 0:
        count -= 1
        start = pos
        tag, pos = uvarint_at(buf, pos)
        size, pos = uvarint_at(buf, pos)
        if pos + size > len(buf):
            raise SchemaError("truncated tagged field")
        if tag == NODE_ENDPOINTS_TAG:
            return int(start - origin), int(pos + size - origin)
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
