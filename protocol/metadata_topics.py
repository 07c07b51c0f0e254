"""Topic ids and names read straight from a Metadata answer's bytes (v10+), its partitions stepped
over, never decoded.

``TopicNames`` keeps the Metadata answers that pass through unread and reads one only when a
request names a topic id it does not know. Decoding such an answer whole builds a dict per
partition: about 0.7 s of the event loop, every connection waiting, for 100,000 partitions. Only
each topic's error code, name and id are needed, so this walks the layout of versions 10-13 (all
flexible: compact strings and arrays, tagged fields) reading those and stepping over each
partition by its lengths: a few varints per partition and no objects. Compiled with mypyc (see
``protocol/compiled.py``); the schema's own decoder is the reference it is tested against.
Sans-IO.
"""

from __future__ import annotations

from typing import Final

from protocol.schema import Buffer, SchemaError, read_uvarint, skip_tagged_fields

FIRST_VERSION: Final = 10  # the first MetadataResponse version with topic ids
LAST_VERSION: Final = 13  # the newest whose layout this walks
ZERO_TOPIC_ID: Final = bytes(16)

# Fixed bytes stepped over: a partition's error code, index, leader and leader epoch; a topic's
# id and is_internal flag.
_PARTITION_FIXED: Final = 2 + 4 + 4 + 4
_TOPIC_ID_AND_FLAG: Final = 16 + 1


def _count(buf: Buffer, pos: int, what: str) -> tuple[int, int]:
    """A compact array's length; null where the schema allows none is refused."""
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise SchemaError(f"null {what} in a Metadata response")
    return n - 1, pos


def _skip_string(buf: Buffer, pos: int) -> int:
    n, pos = read_uvarint(buf, pos)
    return pos + max(n - 1, 0)


def _need(buf: Buffer, end: int) -> None:
    if end > len(buf):
        raise SchemaError("truncated Metadata response")


def metadata_topic_ids_from_bytes(version: int, body: Buffer) -> list[tuple[bytes, str]]:
    """(topic id, name) of every topic the answer shows with both and no error, in its order:
    what ``messages.metadata_topic_ids`` gives for the decoded answer."""
    if not FIRST_VERSION <= version <= LAST_VERSION:
        raise SchemaError(f"Metadata v{version} has no topic ids this walks")
    buf = body if isinstance(body, bytes) else bytes(body)  # compiled code indexes bytes natively
    pos = 4  # throttle_time_ms
    brokers, pos = _count(buf, pos, "broker list")
    for _ in range(brokers):
        pos = _skip_string(buf, pos + 4)  # node id, host
        pos = _skip_string(buf, pos + 4)  # port, rack
        pos = skip_tagged_fields(buf, pos)
    pos = _skip_string(buf, pos) + 4  # cluster id, controller id
    topics, pos = _count(buf, pos, "topic list")
    pairs: list[tuple[bytes, str]] = []
    for _ in range(topics):
        _need(buf, pos + 2)
        error = int.from_bytes(buf[pos : pos + 2], "big", signed=True)
        n, pos = read_uvarint(buf, pos + 2)
        name: str | None = None
        if n:
            _need(buf, pos + n - 1)
            try:
                name = str(buf[pos : pos + n - 1], "utf-8")
            except UnicodeDecodeError as exc:
                raise SchemaError(f"a topic name is not UTF-8: {exc}") from None
            pos += n - 1
        _need(buf, pos + _TOPIC_ID_AND_FLAG)
        topic_id = bytes(buf[pos : pos + 16])
        partitions, pos = _count(buf, pos + _TOPIC_ID_AND_FLAG, "partition list")
        for _ in range(partitions):
            pos += _PARTITION_FIXED
            for _ in range(3):  # replica nodes, ISR nodes, offline replicas: int32 each
                _need(buf, pos + 1)
                if buf[pos] & 0x80:  # a list of 127 nodes or more: a longer varint
                    nodes, pos = _count(buf, pos, "node list")
                else:
                    nodes = buf[pos] - 1
                    if nodes < 0:
                        raise SchemaError("null node list in a Metadata response")
                    pos += 1
                pos += 4 * nodes
            _need(buf, pos + 1)
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)  # most have none
        pos = skip_tagged_fields(buf, pos + 4)  # topic authorized operations, tags
        if error == 0 and name is not None and topic_id != ZERO_TOPIC_ID:
            pairs.append((topic_id, name))
    if version == 10:
        pos += 4  # cluster authorized operations (v8-10)
    if version >= 13:
        pos += 2  # the top-level error code
    pos = skip_tagged_fields(buf, pos)  # raises when the answer ends before its last field
    _need(buf, pos)
    return pairs
