"""The frame decoder gives back exactly the frames sent, however the stream is split."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import frames as frames_module
from protocol.frames import (
    PREFIXES_CACHED_UP_TO,
    READERS_KEPT,
    STREAM_CHUNK_BYTES,
    TLS_STREAM_CHUNK_BYTES,
    FrameDecoder,
    FrameError,
    FrameHead,
    Piece,
    size_prefix,
)

sizes = st.one_of(st.integers(0, 300), st.integers(1000, 5000))


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        sizes.map(lambda n: bytes((i * 7 + n) % 251 for i in range(n))), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(1, 4000), min_size=1, max_size=50),
    buffered=st.booleans(),
)
def test_frames_survive_any_split(payloads: list[bytes], cuts: list[int], buffered: bool) -> None:
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    # Small scratch, threshold and first buffer: large-frame mode, growth and compaction all run.
    dec = FrameDecoder(scratch_bytes=2048, big_frame_bytes=512, big_initial_bytes=600)  # and growth
    got: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        i += 1
        if buffered:
            target = dec.get_buffer()
            n = min(n, len(target), len(stream) - pos)
            target[:n] = stream[pos : pos + n]
            got.extend(bytes(f) for f in dec.written(n))
        else:
            got.extend(bytes(f) for f in dec.feed(stream[pos : pos + n]))
            n = min(n, len(stream) - pos)
        pos += n
    assert got == payloads
    assert not dec.mid_frame


def _plain_read(dec: FrameDecoder, data: bytes) -> list[bytes]:
    """A read handed over as bytes, as the pipeline takes it (``Pipeline.client_data``): the
    whole frames sliced out of it, the rest into the decoder's buffer."""
    out: list[bytes] = []
    taken = dec.take_whole(data, out)
    assert all(type(f) is bytes for f in out)
    rest = memoryview(data)[taken:]
    while rest:
        target = dec.get_buffer()
        n = min(len(target), len(rest))
        target[:n] = rest[:n]
        rest = rest[n:]
        out.extend(bytes(f) for f in dec.written(n))
    return out


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        sizes.map(lambda n: bytes((i * 5 + n) % 251 for i in range(n))), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(1, 12000), min_size=1, max_size=50),
)
def test_frames_survive_any_split_read_as_bytes(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    dec = FrameDecoder(scratch_bytes=2048, big_frame_bytes=512, big_initial_bytes=600)
    got: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        i += 1
        got.extend(_plain_read(dec, stream[pos : pos + n]))
        pos += n
    assert got == payloads
    assert not dec.mid_frame


def test_whole_frames_are_taken_from_a_read_only_while_the_decoder_holds_nothing() -> None:
    dec = FrameDecoder(stream_from=100)
    first = struct.pack(">i", 3) + b"abc"
    frames: list[bytes] = []
    assert dec.take_whole(first + struct.pack(">i", 5) + b"de", frames) == 7
    assert frames == [b"abc"]
    assert _plain_read(dec, struct.pack(">i", 5) + b"de") == []  # part of a frame: gathered
    frames.clear()
    assert dec.take_whole(b"fgh" + first, frames) == 0  # the decoder is mid-frame: nothing taken
    assert frames == [] and not dec.large_frames
    assert _plain_read(dec, b"fgh") == [b"defgh"]
    assert dec.take_whole(struct.pack(">i", 100) + bytes(100), frames) == 104
    assert dec.large_frames  # a frame that would have been streamed came whole


@pytest.mark.parametrize(
    ("prefix", "error"),
    [(struct.pack(">i", -1), "negative frame size"), (struct.pack(">i", 1001), "exceeds max_frame_bytes")],
)
def test_a_read_as_bytes_with_a_bad_size_prefix_is_refused(prefix: bytes, error: str) -> None:
    dec = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(FrameError, match=error):
        dec.take_whole(struct.pack(">i", 1) + b"x" + prefix, [])


def test_a_size_prefix_alone_costs_no_more_than_the_first_buffer() -> None:
    """Four bytes claiming 100 MiB must not make the proxy hold 100 MiB (a slowloris would
    multiply it by its connections): the buffer follows the bytes that arrived."""
    dec = FrameDecoder()
    assert dec.feed(struct.pack(">i", 100 * 1024 * 1024) + b"x" * 100) == []
    assert dec.mid_frame and dec.buffered == 100
    assert dec.allocated <= 64 * 1024
    dec.feed(b"y" * (1024 * 1024))
    assert dec.allocated <= 8 * (1024 * 1024 + 100)  # at most eight times what arrived
    assert dec.allocated < 100 * 1024 * 1024


def test_a_large_frame_grows_even_while_a_view_of_its_buffer_is_alive() -> None:
    """A caller still holding the last buffer it was given does not stop the growth."""
    payload = bytes(i % 251 for i in range(300_000))
    stream = struct.pack(">i", len(payload)) + payload
    dec = FrameDecoder(big_initial_bytes=4096)
    views, frames, pos = [], [], 0
    while pos < len(stream):
        target = dec.get_buffer()
        views.append(target)  # kept alive on purpose
        n = min(len(target), len(stream) - pos)
        target[:n] = stream[pos : pos + n]
        frames.extend(dec.written(n))
        pos += n
    assert [bytes(f) for f in frames] == [payload]


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        sizes.map(lambda n: bytes((i * 7 + n) % 251 for i in range(n))), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(1, 4000), min_size=1, max_size=50),
    take=st.lists(st.booleans(), min_size=1, max_size=12),
)
def test_streamed_and_gathered_frames_come_out_whole_and_in_order(
    payloads: list[bytes], cuts: list[int], take: list[bool]
) -> None:
    """A frame offered for streaming comes out as its head then its pieces (whose views stay
    valid after the decoder moves on), or whole when not taken; every frame is exactly as sent."""
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    dec = FrameDecoder(scratch_bytes=2048, big_frame_bytes=512, stream_from=1000, head_bytes=16)
    got: list[bytes] = []
    pieces: list[tuple[memoryview, bytes]] = []  # kept, as a transport may keep them
    current: bytearray | None = None
    offered = 0
    pos = i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        i += 1
        target = dec.get_buffer()
        n = min(n, len(target), len(stream) - pos)
        target[:n] = stream[pos : pos + n]
        pos += n
        for item in dec.written(n):
            if isinstance(item, FrameHead):
                assert item.size >= 1000 and len(item.head) >= 16
                offered += 1
                if take[offered % len(take)]:
                    current = bytearray(dec.stream())
                    if len(current) == item.size:  # the whole frame had arrived after all
                        got.append(bytes(current))
                        current = None
            elif isinstance(item, Piece):
                assert current is not None
                pieces.append((item.data, bytes(item.data)))
                current += item.data
                if item.last:
                    got.append(bytes(current))
                    current = None
            else:
                got.append(bytes(item))
    assert got == payloads
    assert not dec.mid_frame
    assert all(bytes(view) == seen for view, seen in pieces)  # never written over afterwards


@pytest.mark.parametrize("chunk", [STREAM_CHUNK_BYTES, TLS_STREAM_CHUNK_BYTES])
def test_a_streamed_frame_holds_one_chunk_not_the_whole_frame(chunk: int) -> None:
    """Pieces come out one per ``stream_chunk_bytes`` buffer filled (and the last at the frame's end), and
    the decoder never holds more than that buffer, however large the frame."""
    size = 10 * 1024 * 1024
    dec = FrameDecoder(stream_from=64 * 1024, stream_chunk_bytes=chunk)
    first = dec.get_buffer()
    first[:4] = struct.pack(">i", size)
    first[4:1004] = b"h" * 1000
    (head,) = dec.written(1004)
    assert isinstance(head, FrameHead) and head.size == size
    assert dec.stream() == b"h" * 1000
    left, pieces = size - 1000, []
    while left:
        target = dec.get_buffer()
        assert len(target) <= chunk
        n = min(len(target), 100_000, left)
        left -= n
        pieces += dec.written(n)
        assert dec.allocated <= chunk
    assert all(isinstance(p, Piece) for p in pieces)
    assert [len(p.data) for p in pieces[:-1]] == [chunk] * (len(pieces) - 1)
    assert sum(len(p.data) for p in pieces) == size - 1000
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert not dec.mid_frame


def test_a_streamed_frame_reuses_its_buffer_once_its_pieces_are_written() -> None:
    dec = FrameDecoder(stream_from=64 * 1024)
    first = dec.get_buffer()
    first[:4] = struct.pack(">i", 1024 * 1024)
    first[4:1004] = b"h" * 1000
    dec.written(1004)
    dec.stream()
    buffers = set()
    left = 1024 * 1024 - 1000
    while left:
        target = dec.get_buffer()
        buffers.add(id(target.obj))
        n = min(len(target), 50_000, left)
        target[:n] = b"x" * n
        left -= n
        for piece in dec.written(n):
            assert bytes(piece.data) == b"x" * len(piece.data)
            dec.reuse_chunk()  # as the pipeline does once the transport has flushed the piece
    assert len(buffers) == 1


def _stream_one(dec: FrameDecoder, size: int, fill: int, written: bool) -> list[memoryview]:
    """Stream a frame of ``size`` bytes of ``fill`` through ``dec``; its pieces' views. After each
    piece the caller says what the pipeline would: all written (``written``) or still held."""
    first = dec.get_buffer()
    first[:4] = struct.pack(">i", size)
    first[4:1004] = bytes([fill]) * 1000
    dec.written(1004)
    dec.stream()
    views, left = [], size - 1000
    while left:
        target = dec.get_buffer()
        n = min(len(target), 50_000, left)
        target[:n] = bytes([fill]) * n
        left -= n
        for piece in dec.written(n):
            views.append(piece.data)
            if written:
                dec.reuse_chunk()
            elif piece.last:
                dec.let_chunk_go()
    return views


def test_streamed_frames_one_after_another_share_a_buffer_once_their_pieces_are_written() -> None:
    """A frame over and its pieces all written, its buffer serves the next streamed frame, on this
    connection or another: no allocation and no zeroing per frame."""
    first, second = FrameDecoder(stream_from=64 * 1024), FrameDecoder(stream_from=64 * 1024)
    buffers: set[int] = set()
    for n, dec in enumerate((first, second, first, second)):
        views = _stream_one(dec, 200 * 1024, n, written=True)
        buffers.update(id(view.obj) for view in views)
        assert dec.allocated == 0  # the spare is the pool's, not the idle connection's
    assert len(buffers) == 1


def test_a_streamed_frames_buffer_still_held_is_never_handed_out_again() -> None:
    """A transport still holds the last pieces (not written): those bytes stay as they were while
    other frames stream, on any connection."""
    dec = FrameDecoder(stream_from=64 * 1024)
    held = _stream_one(dec, 200 * 1024, 7, written=False)
    kept = [bytes(view) for view in held]
    for n in range(4):
        _stream_one(dec, 200 * 1024, 100 + n, written=True)
        _stream_one(FrameDecoder(stream_from=64 * 1024), 200 * 1024, 150 + n, written=True)
        _stream_one(dec, 90 * 1024, 200 + n, written=False)
    assert [bytes(view) for view in held] == kept


def test_connections_taking_turns_share_spare_scratch_buffers_and_keep_their_frames() -> None:
    """A decoder that holds nothing gives its scratch back for the next read on any connection:
    the frames it returned are copies, so a buffer reused elsewhere changes none of them."""
    first, second = FrameDecoder(), FrameDecoder()
    kept: list[bytes] = []
    frames: list[bytearray] = []
    for n in range(50):
        for dec in (first, second):
            payload = bytes([n]) * (100 + n)
            buffer = dec.get_buffer()
            wire = struct.pack(">i", len(payload)) + payload
            buffer[: len(wire)] = wire
            out = dec.written(len(wire))
            assert dec.allocated == 0  # a read that ended on a frame boundary keeps no buffer
            frames.extend(out)
            kept.append(payload)
    assert [bytes(f) for f in frames] == kept

    # The buffer the last read went into is the one the next connection's read goes into.
    last = first.get_buffer()
    scratch = last.obj
    last[:4] = struct.pack(">i", 0)
    assert first.written(4) == [bytearray()]
    assert FrameDecoder().get_buffer().obj is scratch


def test_the_spare_scratch_pool_is_bounded_and_never_hands_out_one_buffer_twice() -> None:
    """Buffers given back beyond the pool's limit are dropped; each one taken is a distinct
    buffer, and the pool keeps no reference to a buffer it has handed out."""
    from protocol import frames

    size = 4096  # no decoder uses it: the pool's other buffers are not taken here
    given = [bytearray(size) for _ in range(frames.SPARE_SCRATCH_LIMIT + 3)]
    held = frames._spare_scratch.count
    for buffer in given:
        frames._give_scratch(buffer, memoryview(buffer))
    assert frames._spare_scratch.count == frames.SPARE_SCRATCH_LIMIT
    taken = [frames._take_scratch(size) for _ in range(frames.SPARE_SCRATCH_LIMIT - held)]
    assert len({id(buffer) for buffer, _ in taken}) == len(taken)
    assert all(view.obj is buffer and len(buffer) == size for buffer, view in taken)
    assert not any(any(spare is buffer for spare in frames._spare_scratch.buffers) for buffer, _ in taken)
    fresh, _ = frames._take_scratch(size)  # the pool is back to what it held: a new buffer
    assert all(fresh is not buffer for buffer in given)


def test_a_size_prefix_is_the_big_endian_int32_whether_kept_or_made() -> None:
    """Prefixes up to PREFIXES_CACHED_UP_TO are kept once made; the same bytes come back, and
    sizes past it (or a negative one, never kept) are packed as they come."""
    for size in (0, 1, 9_216, PREFIXES_CACHED_UP_TO, PREFIXES_CACHED_UP_TO + 1, 100 << 20, -1):
        assert size_prefix(size) == struct.pack(">i", size)
        assert size_prefix(size) == struct.pack(">i", size)  # from the list, where it is kept
    assert size_prefix(9_216) is size_prefix(9_216)


@pytest.mark.parametrize("size", [0, 80, 9 * 1024, PREFIXES_CACHED_UP_TO, PREFIXES_CACHED_UP_TO + 1])
def test_a_frame_read_whole_into_scratch_comes_out_as_immutable_bytes(size: int) -> None:
    """What the parsers read natively, and what a stage that changes a frame must copy first."""
    payload = bytes((i * 13) % 256 for i in range(size))
    decoder = FrameDecoder(scratch_bytes=64 * 1024, big_frame_bytes=32 * 1024)
    frames = decoder.feed(size_prefix(size) + payload + size_prefix(3) + b"abc")
    assert frames == [payload, b"abc"]
    assert [type(frame) for frame in frames] == [bytes, bytes]


def test_frames_of_more_sizes_than_readers_are_kept_for_come_out_whole() -> None:
    """A reader is kept for READERS_KEPT sizes at most (memory stays bounded whatever sizes
    clients send); frames of every other size are read the slower way, as whole."""
    decoder = FrameDecoder()
    sizes = range(1, READERS_KEPT + 600)
    for size in sizes:
        payload = bytes([size % 251]) * size
        assert decoder.feed(size_prefix(size) + payload) == [payload]  # one frame a read
    together = b"".join(size_prefix(size) + bytes([size % 7]) * size for size in sizes[-40:])
    assert decoder.feed(together) == [bytes([size % 7]) * size for size in sizes[-40:]]


def test_a_read_of_part_of_a_frame_makes_no_reader_for_what_it_held() -> None:
    """A reader of size and payload in one call is made for sizes whole frames had, never for the
    bytes a read of part of one happened to hold (over TLS, every large frame's first read)."""
    payload = bytes(range(256)) * 48 + bytes(57)  # 12,345 bytes
    wire = size_prefix(len(payload)) + payload
    readers = frames_module._readers
    room = readers.framed_made < READERS_KEPT  # the suite's other frames may have used it up
    decoder = FrameDecoder()
    assert decoder.feed(wire[:6_007]) == []
    assert readers.framed[6_003] is None
    assert decoder.feed(wire[6_007:]) == [payload]
    assert decoder.feed(wire) == [payload]  # the frame's own size: read in one call from now on
    assert (readers.framed[len(payload)] is not None) == room
