"""Record batch headers read at fixed offsets: sizes, counts and producer ids, never the records.

Layout of a v2 (magic 2) batch header, in bytes from the batch start:
baseOffset 0 (8), batchLength 8 (4), partitionLeaderEpoch 12 (4), magic 16 (1), crc 17 (4),
attributes 21 (2), lastOffsetDelta 23 (4), baseTimestamp 27 (8), maxTimestamp 35 (8),
producerId 43 (8), producerEpoch 51 (2), baseSequence 53 (4), recordCount 57 (4); 61 in all.
Legacy message sets (magic 0/1) have the 12-byte log overhead and no producer id.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from protocol.schema import Buffer

LOG_OVERHEAD: Final = 12  # baseOffset + batchLength
BATCH_HEADER_SIZE: Final = 61
NO_PRODUCER_ID: Final = -1

_LEN: Final = struct.Struct(">i")
_PID_EPOCH_SEQ_COUNT: Final = struct.Struct(">qhii")
_ATTRIBUTES: Final = struct.Struct(">h")
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20


class BatchInfo:
    """One record batch's header fields. A plain class: compiled, a dataclass's generated
    ``__init__`` would run interpreted, and one is built per batch."""

    __slots__ = (
        "base_sequence",
        "control",
        "magic",
        "producer_epoch",
        "producer_id",
        "record_count",
        "size",
        "transactional",
    )

    def __init__(
        self,
        size: int,
        magic: int,
        record_count: int,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        transactional: bool,
        control: bool,
    ) -> None:
        self.size = size
        self.magic = magic
        self.record_count = record_count
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.control = control


def iter_batches(records: Buffer) -> Iterator[BatchInfo]:
    """Yield one BatchInfo per complete batch; a trailing partial batch (fetch responses) is skipped."""
    pos = 0
    end = len(records)
    length: int
    attrs: int
    while pos + LOG_OVERHEAD <= end:
        (length,) = _LEN.unpack_from(records, pos + 8)
        size = LOG_OVERHEAD + length
        if length < 0 or pos + size > end:
            return
        magic = records[pos + 16] if pos + 17 <= end else -1
        if magic >= 2 and size >= BATCH_HEADER_SIZE:
            (attrs,) = _ATTRIBUTES.unpack_from(records, pos + 21)
            fields: tuple[int, int, int, int] = _PID_EPOCH_SEQ_COUNT.unpack_from(records, pos + 43)
            pid, epoch, seq, count = fields
            yield BatchInfo(
                size, magic, count, pid, epoch, seq, bool(attrs & _TRANSACTIONAL), bool(attrs & _CONTROL)
            )
        else:
            yield BatchInfo(size, magic, 1, NO_PRODUCER_ID, -1, -1, False, False)
        pos += size


def complete_size(records: Buffer) -> int:
    """Bytes of the complete batches at the start of a record set: a Fetch response may end a
    partition's records with part of a batch (cut at the fetch's size limit), which the client
    throws away and fetches again."""
    pos = 0
    end = len(records)
    length: int
    while pos + LOG_OVERHEAD <= end:
        (length,) = _LEN.unpack_from(records, pos + 8)
        if length < 0 or pos + LOG_OVERHEAD + length > end:
            break
        pos += LOG_OVERHEAD + length
    return pos


def producer_ids(records: Buffer) -> set[int]:
    """Producer ids of the idempotent or transactional batches in a record set."""
    return {b.producer_id for b in iter_batches(records) if b.producer_id != NO_PRODUCER_ID}
