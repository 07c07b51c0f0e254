"""What a Produce quota charges, read straight from the request's bytes.

The generic schema walker builds a dict of every field, and the quotas need only each
partition's topic, index, record-set size, record count and producer ids: this reads those and
skips the rest, without making the dict (several times faster on the small requests most
traffic is). The walker still decodes a request when a stage needs its body (a refusal, a
parked produce's answer, the capture). The layout (Produce v3-v13; flexible from v9: compact
lengths and tagged fields; v13 names topics by id) is the schema's; a test checks both readers
agree at every version.
"""

from __future__ import annotations

import struct
from typing import Final

from mypy_extensions import i64

from protocol.partition_bytes import PartitionBytes
from protocol.schema import Buffer, SchemaError, int16_at, read_uvarint, skip_tagged_fields, uvarint_at

_FIRST_FLEXIBLE: Final = 9
_FIRST_TOPIC_ID: Final = 13
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_BATCH_LEN: Final = struct.Struct(">i")
_PID: Final = struct.Struct(">q")
_COUNT: Final = struct.Struct(">i")
_LOG_OVERHEAD: Final = 12
_BATCH_HEADER: Final = 61


def produce_partitions(version: int, body: Buffer) -> list[PartitionBytes]:
    """Each partition of a Produce request (body after the request header) with its record-set
    size, record count and producer ids; SchemaError when the bytes do not fit the version."""
    flexible = version >= _FIRST_FLEXIBLE
    end = len(body)
    try:
        if flexible:
            n, pos = _uvarint(body, 0)
            pos += max(n - 1, 0)  # transactional_id (compact nullable string)
        else:
            (n,) = _I16.unpack_from(body, 0)
            pos = 2 + max(n, 0)
        pos += 6  # acks, timeout_ms
        topics, pos = _count(body, pos, flexible)
        out: list[PartitionBytes] = []
        for _ in range(topics):
            topic: str | bytes
            if version >= _FIRST_TOPIC_ID:
                topic = bytes(body[pos : pos + 16])
                pos += 16
            else:
                if flexible:
                    n, pos = _uvarint(body, pos)
                    n -= 1
                else:
                    (n,) = _I16.unpack_from(body, pos)
                    pos += 2
                if n < 0 or pos + n > end:
                    raise SchemaError("bad topic name length")
                topic = bytes(body[pos : pos + n]).decode("utf-8")
                pos += n
            partitions, pos = _count(body, pos, flexible)
            for _ in range(partitions):
                (index,) = _I32.unpack_from(body, pos)
                pos += 4
                if flexible:
                    n = body[pos]  # the one-byte varint inline: the common case, per partition
                    if n < 0x80:
                        pos += 1
                    else:
                        n, pos = read_uvarint(body, pos)
                    n -= 1
                else:
                    (n,) = _I32.unpack_from(body, pos)
                    pos += 4
                if n < 0:
                    out.append(PartitionBytes(topic, index, 0))
                else:
                    if pos + n > end:
                        raise SchemaError("records past the end of the request")
                    out.append(_summary(topic, index, body, pos, pos + n))
                    pos += n
                if flexible:
                    pos = pos + 1 if body[pos] == 0 else skip_tagged_fields(body, pos)
            if flexible:
                pos = _skip_tags(body, pos)
        if flexible:
            pos = _skip_tags(body, pos)
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise SchemaError(f"Produce v{version}: {exc}") from exc
    if pos != end:
        raise SchemaError(f"Produce v{version}: {end - pos} bytes after the request")
    return out


def read_produce_acks(version: int, body: Buffer, start: int = 0) -> int:
    """A Produce request's acks without decoding the request (its body from ``start``: a whole
    frame and its header's size need no view made): what a connection with nothing to charge
    needs (acks=0 has no response). v0-2 begin with acks; v3+ put a nullable transactional_id
    before it."""
    if isinstance(body, bytes):
        return _acks_at(version, body, start)
    # A large frame's buffer: its first bytes, copied (a transactional id is a string, at most
    # 32,767 bytes), are read natively.
    return _acks_at(version, bytes(body[start : start + _ACKS_PEEK_BYTES]), 0)


_ACKS_PEEK_BYTES: Final = 64 * 1024


def _acks_at(version: int, body: bytes, start: i64) -> int:
    pos = start
    if version >= 3:
        if pos + 2 > len(body):  # the shortest transactional_id and acks
            raise SchemaError("Produce request truncated before acks")
        if version >= _FIRST_FLEXIBLE:
            length, pos = uvarint_at(body, pos)
            length -= 1  # compact: 0 is null
        else:
            length = int16_at(body, pos)
            pos += 2
        if length > 0:
            pos += length
    if pos + 2 > len(body):
        raise SchemaError("Produce request truncated before acks")
    return int16_at(body, pos)


def _uvarint(body: Buffer, pos: int) -> tuple[int, int]:
    """A varint, the one-byte case (nearly every length here) without a call."""
    b = body[pos]
    return (b, pos + 1) if b < 0x80 else read_uvarint(body, pos)


def _skip_tags(body: Buffer, pos: int) -> int:
    return pos + 1 if body[pos] == 0 else skip_tagged_fields(body, pos)


def _count(body: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = _uvarint(body, pos)
        return max(n - 1, 0), pos
    (n,) = _I32.unpack_from(body, pos)
    return max(n, 0), pos + 4


def _summary(topic: str | bytes, index: int, body: Buffer, start: int, end: int) -> PartitionBytes:
    """A partition's record set: its size, and its complete batches' record counts and producer
    ids (as ``records.iter_batches`` reads them; legacy message sets count one record each)."""
    part = PartitionBytes(topic, index, end - start)
    pos = start
    count = 0
    length: int
    pid: int
    while pos + _LOG_OVERHEAD <= end:
        (length,) = _BATCH_LEN.unpack_from(body, pos + 8)
        size = _LOG_OVERHEAD + length
        if length < 0 or pos + size > end:
            break
        if size >= _BATCH_HEADER and body[pos + 16] >= 2:
            (pid,) = _PID.unpack_from(body, pos + 43)
            if pid >= 0:
                part.producer_ids.add(pid)
            batch_records: int = _COUNT.unpack_from(body, pos + 57)[0]
            count += batch_records
        else:
            count += 1
        pos += size
    part.record_count = count
    return part
