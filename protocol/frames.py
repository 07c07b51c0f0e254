"""Frames (4-byte big-endian size, then the payload) and request/response headers.

Sans-IO: ``FrameDecoder.feed`` takes whatever bytes arrived and hands back complete frames.
A size prefix over the limit is rejected before anything is allocated for it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from mypy_extensions import i64

from protocol.api_keys import is_known_key
from protocol.schema import Buffer, SchemaError, int16_at, int32_at, skip_tagged_fields, write_uvarint
from protocol.versions import header_flexible, request_header_version, response_header_version

SIZE: Final = struct.Struct(">i")
_REQ_FIXED: Final = struct.Struct(">hhi")
# Bound once: compiled, ``SIZE.unpack_from(...)`` looks the method up on its Struct at every call
# (a type lookup and a method object made); a bound method is called straight.
pack_size: Final = SIZE.pack
unpack_size_from: Final = SIZE.unpack_from
_NO_TAGS: Final = b"\x00"  # an empty tagged-field section
PREFIXES_CACHED_UP_TO: Final = 16 * 1024
_prefixes: Final[list[bytes | None]] = [None] * (PREFIXES_CACHED_UP_TO + 1)


class _FrameReaders:
    """``Struct`` readers of a frame of one size out of a scratch buffer, made on first use and
    kept: its payload (``"{size}s"``) and its size prefix with it (``">i{size}s"``). At most
    READERS_KEPT of each, about 1.2 MiB each way (a Struct and its bound method are 290 bytes);
    a size met after that is read by the slower way."""

    def __init__(self) -> None:
        self.payload: list[Callable[[bytearray, int], tuple[bytes]] | None] = [None] * (
            PREFIXES_CACHED_UP_TO + 1
        )
        self.framed: list[Callable[[bytearray, int], tuple[int, bytes]] | None] = [None] * (
            PREFIXES_CACHED_UP_TO + 1
        )
        self.payload_made: i64 = 0
        self.framed_made: i64 = 0


READERS_KEPT: Final = 4096
_readers: Final = _FrameReaders()
_I16: Final = struct.Struct(">h")
DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024  # the broker's socket.request.max.bytes


class FrameError(ValueError):
    """A frame the proxy will not handle; the connection that sent it is closed."""


class FrameTooLarge(FrameError):
    pass


# A streamed frame is read into buffers this large, each written out once full. 1 MiB rather than
# 256 KiB: a quarter of the writes and of the client's wake-ups on a bulk fetch, 9% less CPU per
# GB (bench/request_cost.py --workload fetch, and a Java consumer side by side); a client reads a
# response only once it is whole, and a frame's last piece goes out as soon as it arrives.
STREAM_CHUNK_BYTES: Final = 1024 * 1024
# Over TLS the same buffer is decrypted into and encrypted from (and the transport's copies of it
# follow): a quarter of the size keeps it in the core's cache between the two, 1-6% less CPU per GB
# of TLS fetches than 1 MiB in five runs (bench/request_cost.py --workload fetch --tls --baseline).
TLS_STREAM_CHUNK_BYTES: Final = 256 * 1024

# Scratch buffers a decoder gave back when it held nothing, for the next one that needs one: a
# fresh 32 KiB bytearray is a malloc and a memset, and a busy connection needs one per read (its
# scratch is released whenever a read ended on a frame boundary). Bounded: the connections idle
# between reads still hold no buffer memory, and the pool holds at most this many.
SPARE_SCRATCH_LIMIT: Final = 16


class _ScratchPool:
    """The spare scratch buffers, each with its whole view, as a stack in two fixed lists: a list
    popped to empty and appended to again frees and reallocates its item array every time, a
    realloc and a free per read."""

    def __init__(self, limit: int) -> None:
        self.buffers: list[bytearray] = [_NO_BUFFER] * limit
        self.views: list[memoryview] = [_NO_VIEW] * limit
        self.count: i64 = 0
        self.limit: i64 = limit


_NO_BUFFER: Final = bytearray()
_NO_VIEW: Final = memoryview(b"")
_spare_scratch: Final = _ScratchPool(SPARE_SCRATCH_LIMIT)


def _take_scratch(size: int) -> tuple[bytearray, memoryview]:
    """A scratch buffer of ``size`` bytes (its contents stale) and a view of all of it: a spare
    one when there is one."""
    pool = _spare_scratch
    top = pool.count - 1
    if top >= 0 and len(pool.buffers[top]) == size:
        scratch, view = pool.buffers[top], pool.views[top]
        pool.buffers[top] = _NO_BUFFER  # the pool holds no buffer it has handed out
        pool.views[top] = _NO_VIEW
        pool.count = top
        return scratch, view
    scratch = bytearray(size)
    return scratch, memoryview(scratch)


def _give_scratch(scratch: bytearray, view: memoryview) -> None:
    """A scratch buffer no frame, head or view but its own refers to any more."""
    pool = _spare_scratch
    if pool.count < pool.limit:
        pool.buffers[pool.count] = scratch
        pool.views[pool.count] = view
        pool.count += 1


# Streamed frames' buffers, given back once every piece of a frame was written out, for the next
# streamed frame on any connection: a fresh one is a malloc and a memset of up to 1 MiB, once per
# frame of a bulk produce (a byte zeroed for every byte streamed). Spares are kept by the largest
# power of two not above their length (from 64 KiB), at most this many of each: 12 MiB in all.
SPARE_CHUNKS_PER_SIZE: Final = 4
_SMALLEST_SPARE: Final = 64 * 1024
_spare_chunks: Final[dict[int, list[bytearray]]] = {}


def _take_chunk(wanted: int) -> bytearray:
    """A buffer of at least ``wanted`` bytes for a streamed frame (its contents stale): a spare
    that holds it if there is one (of its size, or of the next), else a new one of just that many
    bytes (a larger one would be zeroed all through, and might never come back)."""
    size = _spare_size(wanted)
    for kept in (size, 2 * size):
        spare = _spare_chunks.get(kept)
        if spare:
            for index in range(len(spare) - 1, -1, -1):
                if len(spare[index]) >= wanted:
                    return spare.pop(index)
    return bytearray(wanted)


def _spare_size(length: int) -> int:
    """The size a buffer of ``length`` bytes is kept by: the largest power of two not above it,
    from 64 KiB."""
    size = _SMALLEST_SPARE
    while size * 2 <= length:
        size *= 2
    return size


def _give_chunk(chunk: bytearray) -> None:
    """A buffer none of whose pieces is held by anything any more."""
    if len(chunk) < _SMALLEST_SPARE:
        return
    spare = _spare_chunks.setdefault(_spare_size(len(chunk)), [])
    if len(spare) < SPARE_CHUNKS_PER_SIZE:
        spare.append(chunk)


class FrameHead:
    """A large frame has begun: its payload size and first bytes (a view valid until the next
    call into the decoder). ``FrameDecoder.stream()`` takes it; otherwise it is gathered whole.
    (A plain class: mypyc compiles no dataclass field typed ``memoryview``.)"""

    __slots__ = ("head", "size")

    def __init__(self, size: int, head: memoryview) -> None:
        self.size = size
        self.head = head


class Piece:
    """Bytes of a streamed frame, in order; ``last`` on the one that ends it."""

    __slots__ = ("data", "last")

    def __init__(self, data: memoryview, last: bool) -> None:
        self.data = data
        self.last = last


class FrameDecoder:
    """Splits a byte stream into frames (payloads without the size prefix).

    Ways in: ``feed(data)`` for bytes that already arrived; the buffered pair ``get_buffer()`` /
    ``written(n)`` for an ``asyncio.BufferedProtocol``, where the socket reads straight into the
    decoder's memory; and ``take_whole(data, frames)`` for a read handed over as ``bytes``, the
    frames it holds whole sliced out of it (the rest then goes in by the buffered pair).
    Small frames are gathered in a scratch buffer; a large
    frame gets its own buffer of exactly its size, allocated once its size prefix is checked,
    and the socket then writes its payload directly into it: no copy in user space. The scratch
    buffer is released whenever it holds nothing, so an idle connection costs no buffer memory.

    A large frame's buffer grows with what has arrived (from ``big_initial_bytes``, eightfold
    at a time), not with what its size prefix claims: four bytes claiming 100 MiB cost 64 KiB,
    so memory follows the bytes a client actually sent (a 1 MiB frame costs ~16 us more to
    gather than with one allocation of its size).

    With ``stream_from`` set, a frame at least that large that has not fully arrived is offered
    instead: ``written`` ends with a ``FrameHead`` (its size and first ``head_bytes``), and the
    caller may take it with ``stream()``. The rest of the frame then comes out as ``Piece``s, one
    per ``stream_chunk_bytes`` buffer filled (fewer, larger writes) and the last at the frame's
    end, each a view the decoder never writes into again (safe to hand to a transport that keeps
    it) until the caller says all were written out (``reuse_chunk``). Not taken, the frame is
    gathered whole.
    """

    __slots__ = (
        "_big",
        "_big_filled",
        "_big_size",
        "_chunk",
        "_chunk_emitted",
        "_chunk_filled",
        "_end",
        "_offered",
        "_scratch",
        "_scratch_bytes",
        "_scratch_view",
        "_start",
        "_stream_left",
        "big_frame_bytes",
        "big_initial_bytes",
        "head_bytes",
        "large_taken",
        "max_frame_bytes",
        "stream_chunk_bytes",
        "stream_from",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        scratch_bytes: int = 32 * 1024,
        big_frame_bytes: int = 16 * 1024,
        big_initial_bytes: int = 64 * 1024,
        stream_from: int = 0,
        head_bytes: int = 512,
        stream_chunk_bytes: int = STREAM_CHUNK_BYTES,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.stream_chunk_bytes = stream_chunk_bytes
        self.big_initial_bytes = big_initial_bytes
        self.stream_from = stream_from  # 0: never offer a frame for streaming
        self.large_taken = False  # take_whole took a frame of stream_from bytes or more
        self.head_bytes = min(head_bytes, scratch_bytes // 2)
        self._offered = False  # a FrameHead was returned; scratch[start:] holds its beginning
        self._stream_left = 0  # payload bytes of the frame being streamed still to come
        self._chunk: bytearray | None = None  # where a streamed frame's bytes are read into
        self._chunk_filled = 0
        self._chunk_emitted = 0  # the part of it already handed out as Pieces
        self.big_frame_bytes = min(big_frame_bytes, scratch_bytes // 2)
        self._scratch_bytes = scratch_bytes
        self._scratch: bytearray | None = None
        self._scratch_view: memoryview | None = None  # all of _scratch (a view a read, not two)
        self._start = 0  # unconsumed bytes are scratch[start:end]
        self._end = 0
        self._big: bytearray | None = None  # payload of a large frame being filled
        self._big_filled = 0
        self._big_size = 0  # the large frame's size; its buffer may still be shorter

    def get_buffer(self) -> memoryview:
        """Where the next bytes read from the socket should go (never empty)."""
        if self._stream_left:
            chunk = self._chunk
            if chunk is None or self._chunk_filled == len(chunk):
                chunk = self._chunk = _take_chunk(min(self._stream_left, self.stream_chunk_bytes))
                self._chunk_filled = self._chunk_emitted = 0
            return memoryview(chunk)[self._chunk_filled : self._chunk_filled + self._stream_left]
        if self._offered:
            self._gather_offered()
        if self._big is not None:
            if self._big_filled == len(self._big):
                self._grow_big()
            return memoryview(self._big)[self._big_filled :]
        view = self._scratch_view
        if view is None:
            scratch, view = _take_scratch(self._scratch_bytes)
            self._scratch, self._scratch_view = scratch, view
        elif self._end == len(view):
            self._compact()
        end = self._end
        return view if not end else view[end:]

    def written(self, n: int) -> list[Any]:
        """``n`` bytes were written into the last buffer; returns the frames now complete
        (``bytearray``s), then possibly a ``FrameHead``; or, while streaming, one ``Piece``."""
        if self._stream_left:
            chunk = self._chunk
            assert chunk is not None
            self._chunk_filled += n
            self._stream_left -= n
            if self._chunk_filled < len(chunk) and self._stream_left:
                return []  # gathered into fewer, larger writes: out once the buffer is full
            start, self._chunk_emitted = self._chunk_emitted, self._chunk_filled
            # At the frame's end the buffer stays until the caller says whether its pieces were
            # all written out (reuse_chunk: spare for the next frame) or not (let_chunk_go).
            return [Piece(memoryview(chunk)[start : self._chunk_filled], not self._stream_left)]
        if self._big is not None:
            self._big_filled += n
            if self._big_filled < self._big_size:
                return []
            frames = [self._big]
            self._big = None
        else:
            self._end += n
            frames = []
        self._split(frames)
        return frames

    def take_whole(self, data: bytes, frames: list[Any]) -> int:
        """The frames at the start of ``data`` (a read handed over as ``bytes``, by a plain
        protocol's ``data_received``) that it holds whole, sliced straight out of it onto
        ``frames``; how many of its bytes they took. Only while the decoder holds nothing (else
        0): the bytes not taken go in by ``get_buffer`` / ``written``. A size prefix out of
        bounds raises FrameError, as there."""
        if self._end != self._start or self._big is not None or self._stream_left or self._offered:
            return 0
        total: i64 = len(data)
        pos: i64 = 0
        while total - pos >= 4:
            size = int32_at(data, pos)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of {size} bytes exceeds max_frame_bytes={self.max_frame_bytes}")
            end = pos + 4 + size
            if end > total:
                break
            if self.stream_from and size >= self.stream_from:
                self.large_taken = True
            frames.append(data[pos + 4 : end])
            pos = end
        return int(pos)

    @property
    def large_frames(self) -> bool:
        """A frame that would be streamed was taken whole (``take_whole``), or a large frame is
        being gathered into its own buffer, offered, or streamed."""
        return self.large_taken or self._big is not None or bool(self._stream_left) or self._offered

    def feed(self, data: Buffer) -> list[Any]:
        view = memoryview(data)
        frames: list[Any] = []
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            frames.extend(self.written(n))
        return frames

    def _split(self, frames: list[Any]) -> None:
        scratch = self._scratch
        if scratch is None or self._offered:
            return
        left = self._end - self._start
        if 4 <= left <= PREFIXES_CACHED_UP_TO + 4 and left - 4 <= self.max_frame_bytes:
            # Most reads end where the one frame they hold ends: its size and payload in one call
            # (the size read apart is a call of its own). Not so, the frames are split below.
            size_read, payload = _framed_at(scratch, self._start, left - 4)
            if size_read == left - 4:
                frames.append(payload)
                self._start = self._end
        first = True
        while self._end - self._start >= 4:
            size: int = unpack_size_from(scratch, self._start)[0]
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of {size} bytes exceeds max_frame_bytes={self.max_frame_bytes}")
            begin = self._start + 4
            have = self._end - begin
            if have >= size:
                frames.append(_payload_at(scratch, begin, size))
                self._start = begin + size
                if first and self._start == self._end:
                    _learn_framed(size)
                first = False
                continue
            if self.stream_from and size >= self.stream_from:
                if have < min(size, self.head_bytes):
                    break  # its head is still to come (into scratch, like a small frame)
                self._offered = True
                frames.append(FrameHead(size, memoryview(scratch)[begin : self._end]))
                return
            if size >= self.big_frame_bytes:
                self._begin_big(scratch, begin, have, size)
                return
            break
        if self._start == self._end:
            # Every frame in it was copied out and it was never offered (no FrameHead views it).
            self._start = self._end = 0
            view = self._scratch_view
            assert view is not None
            self._scratch = self._scratch_view = None
            _give_scratch(scratch, view)
        elif self._start > len(scratch) // 2:
            self._compact()

    def _begin_big(self, scratch: bytearray, begin: int, have: int, size: int) -> None:
        big = bytearray(min(size, max(have, self.big_initial_bytes)))
        big[:have] = scratch[begin : self._end]
        self._big, self._big_filled, self._big_size = big, have, size
        self._start = self._end = 0
        self._scratch = self._scratch_view = None

    def _gather_offered(self) -> None:
        """The offered frame was not taken for streaming: gather it whole."""
        self._offered = False
        scratch = self._scratch
        assert scratch is not None
        size: int = SIZE.unpack_from(scratch, self._start)[0]
        begin = self._start + 4
        self._begin_big(scratch, begin, self._end - begin, size)

    def stream(self) -> bytes:
        """Take the offered frame: its bytes so far (the head and what came with it); the rest
        comes out of ``written`` as ``Piece``s."""
        assert self._offered and self._scratch is not None
        self._offered = False
        self.let_chunk_go()  # the last frame's buffer, if no one said its pieces were written
        begin = self._start + 4
        size: int = SIZE.unpack_from(self._scratch, self._start)[0]
        head = bytes(self._scratch[begin : self._end])
        self._stream_left = size - len(head)
        self._start = self._end = 0
        self._scratch = self._scratch_view = None
        return head

    def hand_over(self) -> int:
        """The caller moves the rest of the streamed frame itself (``proxy/net/splice.py``,
        straight from socket to socket): how many bytes of it are still to come. The decoder
        forgets the frame; the caller reads the socket no further than that before it reads
        into the decoder again."""
        left = self._stream_left
        self._stream_left = 0
        self._chunk = None
        self._chunk_filled = self._chunk_emitted = 0
        return left

    def reuse_chunk(self) -> None:
        """Every piece of the current buffer has been written out and no view of it is kept
        anywhere: read the streamed frame's next bytes into it again, from its start (a fresh
        buffer per chunk costs an allocation and its page faults); the frame over, the buffer
        is a spare for the next streamed frame, on any connection."""
        if self._chunk_emitted == self._chunk_filled:
            self._chunk_filled = self._chunk_emitted = 0
            chunk = self._chunk
            if not self._stream_left and chunk is not None:
                self._chunk = None
                _give_chunk(chunk)

    def let_chunk_go(self) -> None:
        """The streamed frame is over but a piece of its buffer is still held (a transport has
        not written it all): the decoder forgets the buffer, which is freed with the last view
        of it, never handed out again."""
        if not self._stream_left:
            self._chunk = None
            self._chunk_filled = self._chunk_emitted = 0

    def _grow_big(self) -> None:
        """Eight times larger (at most the frame's size): a 1 MiB frame takes two steps, and
        memory held is at most eight times what arrived. A new buffer and a copy, not a resize:
        a caller may still hold a view of the old one, and it measured faster than realloc."""
        big = self._big
        assert big is not None
        grown = bytearray(min(self._big_size, 8 * len(big)))
        grown[: len(big)] = big
        self._big = grown

    def _compact(self) -> None:
        assert self._scratch is not None
        pending = self._end - self._start
        self._scratch[:pending] = self._scratch[self._start : self._end]
        self._start, self._end = 0, pending

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return self._big_filled if self._big is not None else self._end - self._start

    @property
    def allocated(self) -> int:
        """Bytes of buffer memory held now (scratch and large-frame buffers)."""
        big = len(self._big) if self._big is not None else 0
        chunk = len(self._chunk) if self._chunk is not None else 0
        return big + chunk + (len(self._scratch) if self._scratch is not None else 0)

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame has arrived (a peer that closes now truncated it)."""
        return self._big is not None or self._end > self._start or bool(self._stream_left)


def frame(payload: Buffer) -> bytes:
    return SIZE.pack(len(payload)) + bytes(payload)


def _payload_at(scratch: bytearray, begin: int, size: int) -> bytes:
    """A frame's payload in a scratch buffer, copied out as ``bytes`` (what every parser then
    reads natively, compiled). By a ``Struct`` of that size, made once for each size met: one
    call and a copy, where a view sliced and copied out costs three calls and two objects."""
    if size <= PREFIXES_CACHED_UP_TO:
        readers = _readers
        unpack = readers.payload[size]
        if unpack is None and readers.payload_made < READERS_KEPT:
            unpack = readers.payload[size] = struct.Struct(f"{size}s").unpack_from
            readers.payload_made += 1
        if unpack is not None:
            found: tuple[bytes] = unpack(scratch, begin)
            return found[0]
    return memoryview(scratch)[begin : begin + size].tobytes()


def _framed_at(scratch: bytearray, start: int, size: int) -> tuple[int, bytes]:
    """The size prefix at ``start`` and the ``size`` bytes after it, in one ``Struct`` call: what
    ``_payload_at`` copies, when the prefix is still to be read. Only by a reader kept for that
    size (``_learn_framed``); (-1, b"") when there is none (a plain tuple, compiled, is not
    boxed)."""
    unpack = _readers.framed[size]
    if unpack is None:
        return -1, b""
    found: tuple[int, bytes] = unpack(scratch, start)
    return found


def _learn_framed(size: int) -> None:
    """A read held exactly one frame of ``size`` bytes: keep a reader of such a read (its size
    and payload in one call) for the next one. Made only for sizes frames had, never for what a
    read of part of a frame happened to hold, so a failed try is rare."""
    readers = _readers
    if size <= PREFIXES_CACHED_UP_TO and readers.framed[size] is None and readers.framed_made < READERS_KEPT:
        readers.framed[size] = struct.Struct(f">i{size}s").unpack_from
        readers.framed_made += 1


def size_prefix(size: int) -> bytes:
    """A frame's 4-byte size prefix. Those of frames up to PREFIXES_CACHED_UP_TO bytes are made
    once each and kept: a call into ``struct`` and a new object for every small frame cost more
    than reading a list (the list is 128 KiB; each size met adds a 37-byte object to it)."""
    if 0 <= size <= PREFIXES_CACHED_UP_TO:
        found = _prefixes[size]
        if found is None:
            found = _prefixes[size] = pack_size(size)
        return found
    return pack_size(size)


class RequestHeader:
    """A request's header. A plain class, not a dataclass: compiled, a dataclass's generated
    ``__init__`` stays interpreted, and one is built per request."""

    __slots__ = ("api_key", "api_version", "client_id", "correlation_id", "size", "tagged")

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        client_id: str | None,
        size: int,
        tagged: bytes = b"",
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.size = size  # bytes of the header; the body starts here
        self.tagged = tagged  # raw tagged-field section of a v2 header, kept verbatim

    def __repr__(self) -> str:
        return (
            f"RequestHeader(api_key={self.api_key}, api_version={self.api_version}, "
            f"correlation_id={self.correlation_id}, client_id={self.client_id!r}, size={self.size})"
        )

    @property
    def version(self) -> int:
        return request_header_version(self.api_key, self.api_version)


class LastClientId:
    """The client id a connection sent last, its bytes and its text: nearly every request repeats
    it, and its text is then reused with no decode."""

    __slots__ = ("raw", "text")

    def __init__(self) -> None:
        self.raw = b""
        self.text = ""


# A request header is read from a copy of at most this much of a frame that is not ``bytes`` (a
# large frame's buffer, a streamed frame's head): a client id is at most 32,767 bytes.
HEADER_PEEK_BYTES: Final = 64 * 1024


def parse_request_header(payload: Buffer, last: LastClientId | None = None) -> RequestHeader:
    """Read the request header; unknown api keys and truncation raise FrameError. ``last``: the
    connection's last client id, read again without a decode when the bytes are the same."""
    if isinstance(payload, bytes):
        return _parse_request_header(payload, len(payload), last)
    return _parse_request_header(bytes(payload[:HEADER_PEEK_BYTES]), len(payload), last)


def _parse_request_header(buf: bytes, size: i64, last: LastClientId | None) -> RequestHeader:
    """The header at the start of ``buf``, the first bytes of a ``size``-byte frame. Over
    ``bytes``, compiled, each field is read natively: no call into ``struct``, no tuple."""
    if size < 10:
        raise FrameError(f"request of {size} bytes is too short for a header")
    api_key = int16_at(buf, 0)
    api_version = int16_at(buf, 2)
    correlation_id = int32_at(buf, 4)
    n = int16_at(buf, 8)
    if not is_known_key(api_key):
        raise FrameError(f"unknown api key {api_key}")
    if api_version < 0:
        raise FrameError(f"negative api version {api_version}")
    pos: i64 = 10
    client_id: str | None = None
    if n >= 0:
        if pos + n > size:
            raise FrameError("truncated client id")
        if pos + n > len(buf):
            raise FrameError(f"request header longer than {HEADER_PEEK_BYTES} bytes")
        raw = buf[pos : pos + n]
        if last is not None and raw == last.raw:
            client_id = last.text
        else:
            try:
                client_id = str(raw, "utf-8")
            except UnicodeDecodeError as exc:
                raise FrameError("client id is not UTF-8") from exc
            if last is not None:
                last.raw, last.text = raw, client_id
        pos += n
    elif n != -1:
        raise FrameError(f"invalid client id length {n}")
    header = RequestHeader(api_key, api_version, correlation_id, client_id, pos)
    if header_flexible(api_key, api_version):
        if pos < len(buf) and buf[pos] == 0:
            header.size = pos + 1  # no tagged fields, as nearly every client sends
            header.tagged = _NO_TAGS
            return header
        start = pos
        try:
            end = skip_tagged_fields(buf, pos)
        except SchemaError as exc:
            raise FrameError(f"bad request header tagged fields: {exc}") from exc
        header.size = end
        header.tagged = buf[start:end]
    return header


def encode_request_header(header: RequestHeader) -> bytearray:
    out = bytearray(_REQ_FIXED.pack(header.api_key, header.api_version, header.correlation_id))
    if header.client_id is None:
        out += _I16.pack(-1)
    else:
        cid = header.client_id.encode("utf-8")
        out += _I16.pack(len(cid)) + cid
    if header.version >= 2:
        out += header.tagged or b"\x00"
    return out


def response_header_size(api_key: int, api_version: int, payload: Buffer) -> int:
    """Bytes taken by the response header (correlation id, plus tagged fields for v1)."""
    if response_header_version(api_key, api_version) == 0:
        return 4
    try:
        return skip_tagged_fields(payload, 4)
    except SchemaError as exc:
        raise FrameError(f"bad response header: {exc}") from exc


def encode_response_header(api_key: int, api_version: int, correlation_id: int) -> bytearray:
    out = bytearray(SIZE.pack(correlation_id))
    if response_header_version(api_key, api_version) == 1:
        write_uvarint(out, 0)
    return out
