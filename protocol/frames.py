"""Frames (4-byte big-endian size, then the payload) and request/response headers.

Sans-IO: ``FrameDecoder.feed`` takes whatever bytes arrived and hands back complete frames.
A size prefix over the limit is rejected before anything is allocated for it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from protocol.api_keys import api_name
from protocol.schema import Buffer, SchemaError, read_uvarint, write_uvarint
from protocol.versions import request_header_version, response_header_version

SIZE = struct.Struct(">i")
_REQ_FIXED = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # the broker's socket.request.max.bytes


class FrameError(ValueError):
    """A frame the proxy will not handle; the connection that sent it is closed."""


class FrameTooLarge(FrameError):
    pass


class FrameDecoder:
    """Accumulates bytes and splits them into frames (payloads without the size prefix)."""

    __slots__ = ("_buf", "_need", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._need = -1  # payload size of the frame being read, -1 while reading the prefix

    def feed(self, data: Buffer) -> list[bytearray]:
        buf = self._buf
        buf += data
        frames: list[bytearray] = []
        pos = 0
        while True:
            if self._need < 0:
                if len(buf) - pos < 4:
                    break
                (size,) = SIZE.unpack_from(buf, pos)
                if size < 0:
                    raise FrameError(f"negative frame size {size}")
                if size > self.max_frame_bytes:
                    raise FrameTooLarge(
                        f"frame of {size} bytes exceeds max_frame_bytes={self.max_frame_bytes}"
                    )
                pos += 4
                self._need = size
            if len(buf) - pos < self._need:
                break
            frames.append(buf[pos : pos + self._need])
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Payload bytes held for a frame not yet complete."""
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """True while part of a frame has arrived (a peer that closes now truncated it)."""
        return self._need >= 0 or bool(self._buf)


def frame(payload: Buffer) -> bytes:
    return SIZE.pack(len(payload)) + bytes(payload)


@dataclass(slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    size: int  # bytes of the header; the body starts here
    tagged: bytes = b""  # raw tagged-field section of a v2 header, kept verbatim

    @property
    def version(self) -> int:
        return request_header_version(self.api_key, self.api_version)


def parse_request_header(payload: Buffer) -> RequestHeader:
    """Read the request header; unknown api keys and truncation raise FrameError."""
    if len(payload) < 10:
        raise FrameError(f"request of {len(payload)} bytes is too short for a header")
    api_key, api_version, correlation_id = _REQ_FIXED.unpack_from(payload, 0)
    if api_name(api_key) is None:
        raise FrameError(f"unknown api key {api_key}")
    if api_version < 0:
        raise FrameError(f"negative api version {api_version}")
    (n,) = _I16.unpack_from(payload, 8)
    pos = 10
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(payload):
            raise FrameError("truncated client id")
        try:
            client_id = str(payload[pos : pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise FrameError("client id is not UTF-8") from exc
        pos += n
    elif n != -1:
        raise FrameError(f"invalid client id length {n}")
    header = RequestHeader(api_key, api_version, correlation_id, client_id, pos)
    if header.version >= 2:
        start = pos
        try:
            count, pos = read_uvarint(payload, pos)
            for _ in range(count):
                _tag, pos = read_uvarint(payload, pos)
                size, pos = read_uvarint(payload, pos)
                pos += size
        except SchemaError as exc:
            raise FrameError(f"bad request header tagged fields: {exc}") from exc
        if pos > len(payload):
            raise FrameError("truncated request header tagged fields")
        header.size = pos
        header.tagged = bytes(payload[start:pos])
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
        count, pos = read_uvarint(payload, 4)
        for _ in range(count):
            _tag, pos = read_uvarint(payload, pos)
            size, pos = read_uvarint(payload, pos)
            pos += size
    except SchemaError as exc:
        raise FrameError(f"bad response header: {exc}") from exc
    if pos > len(payload):
        raise FrameError("truncated response header")
    return pos


def encode_response_header(api_key: int, api_version: int, correlation_id: int) -> bytearray:
    out = bytearray(SIZE.pack(correlation_id))
    if response_header_version(api_key, api_version) == 1:
        write_uvarint(out, 0)
    return out
