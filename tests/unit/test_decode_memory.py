"""How much memory decoding a hostile request takes, per byte of frame (measured, not assumed).

The frame decoder never allocates past ``max_frame_bytes``, and array counts are checked against
the bytes left, but a decoded body is Python objects: a Produce made of the smallest possible
topics or partitions (3 to 8 bytes each) becomes one dict per element. The fuzzing work measured
about 80 bytes of objects per byte of such a frame (docs/fuzzing.md). These tests pin that
bound, so a change that makes it worse is noticed; lowering ``max_frame_bytes`` on client
listeners is what limits it in absolute terms.
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from protocol import messages

# Measured 83x at worst (flexible Produce, empty topics); the bound leaves room for allocator noise.
MAX_AMPLIFICATION = 100


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _v9_empty_topics(n: int) -> bytes:
    return b"\x00" + struct.pack(">hi", -1, 1000) + _uvarint(n + 1) + b"\x01\x01\x00" * n + b"\x00"


def _v3_empty_topics(n: int) -> bytes:
    return struct.pack(">hhii", -1, -1, 1000, n) + struct.pack(">hi", 0, 0) * n


def _v9_tiny_partitions(n: int) -> bytes:
    topic = b"\x02t" + _uvarint(n + 1) + (struct.pack(">i", 0) + b"\x00\x00") * n + b"\x00"
    return b"\x00" + struct.pack(">hi", -1, 1000) + _uvarint(2) + topic + b"\x00"


@pytest.mark.parametrize(
    ("version", "body"),
    [(9, _v9_empty_topics(60_000)), (3, _v3_empty_topics(30_000)), (9, _v9_tiny_partitions(30_000))],
    ids=["v9-empty-topics", "v3-empty-topics", "v9-tiny-partitions"],
)
def test_produce_decode_amplification_is_bounded(version: int, body: bytes) -> None:
    tracemalloc.start()
    try:
        decoded = messages.decode_request(0, version, body)
        messages.produce_request_partitions(decoded)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= MAX_AMPLIFICATION * len(body), f"{peak} bytes for a {len(body)}-byte body"


def test_record_bytes_are_not_copied() -> None:
    """Real produce traffic is mostly record bytes: they stay views into the frame."""
    records = bytes(61) * 2000
    body = struct.pack(">hhii", -1, -1, 1000, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1)
    body += struct.pack(">ii", 0, len(records)) + records
    tracemalloc.start()
    try:
        decoded = messages.decode_request(0, 3, body)
        messages.produce_request_partitions(decoded)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(body) // 4
