"""A large response moved from the broker's socket to the client's by the kernel: splice(2)
through a pipe, its bytes never copied into the proxy (Linux, plaintext on both sides).

A streamed response (``proxy/pipeline/frame_streams.py``) is handed over here with its first
bytes (read already; they go out first) and the count of its bytes still in the broker's
socket. Those go socket -> pipe -> socket. A stage that follows the response (the NodeEndpoints
filter) says which spans it skips unread (a partition's records); only those are spliced, and
the bytes between them (a partition's header, a few dozen bytes) are read into user space,
shown to the filter and written into the same pipe, so the order on the wire is kept. The bytes
the filter holds back at the end go out once it has finished them. The pipe is filled before it
is drained: the client gets the response in writes of up to 1 MiB, as a streamed one's pieces.

The transports keep their sockets: the pipeline pauses the broker side's reads meanwhile, and
the client side has nothing of its own to write (a streamed response goes first). This module
waits on duplicates of the two descriptors, as an event loop refuses a second watcher on a
transport's own. Reads stop at the response's last byte, so what follows it stays in the
socket for the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct
import termios
from collections.abc import Callable
from typing import Final, Protocol

SPLICE_SUPPORTED: Final = hasattr(os, "splice")
# A span the filter skips is spliced from this length; a shorter one is read with what is
# around it (a splice per few bytes would cost more than the copy it saves). The rest of a span
# begun is spliced however short.
SPLICE_FROM_BYTES: Final = 16 * 1024
READ_BYTES: Final = 4096  # read at a time where the filter looks at the bytes
PIPE_BYTES: Final = 1024 * 1024  # Linux's default pipe-max-size
MIN_PIPE_BYTES: Final = 256 * 1024  # a pipe smaller than this: the response is copied instead
_F_SETPIPE_SZ: Final = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_FLAGS: Final = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
_F_GETPIPE_SZ: Final = getattr(fcntl, "F_GETPIPE_SZ", 1032)
# What a transfer waits for: nothing (it is over), the broker's bytes, room at the client.
_NOTHING: Final = 0
_READABLE: Final = 1
_WRITABLE: Final = 2


class SpanFilter(Protocol):
    """A stage's view of a streamed response (``StreamFilter`` in proxy/pipeline/stages/base.py,
    whose calls these are; the pipeline's layer is above this one)."""

    def feed(self, data: memoryview | bytes) -> int: ...

    def finish(self, tail: bytearray) -> None: ...

    def skippable(self) -> int: ...

    def skip(self, n: int) -> None: ...


def let_out(
    stream_filter: SpanFilter | None, held: bytearray, data: bytes | memoryview
) -> bytes | memoryview:
    """What of a streamed response's next bytes may go out now. The filter's share, and once it
    holds any, everything after it, is added to ``held``: it goes out after ``finish``."""
    if stream_filter is None:
        return data
    if held:
        held += data
        return b""
    n = stream_filter.feed(data)
    if n < len(data):
        held += data[n:]
        return data[:n]
    return data


def socket_fd(transport: asyncio.BaseTransport) -> int | None:
    """The descriptor of a plaintext socket transport; None for TLS or no socket."""
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        family = sock.family
    except (AttributeError, OSError):
        return None
    if family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
        return None
    fd = sock.fileno()
    return fd if isinstance(fd, int) and fd >= 0 else None


class PipeTooSmall(OSError):
    """The pipe could not be given MIN_PIPE_BYTES: the user's pipe budget is spent
    (``fs.pipe-user-pages-soft``: 64 pipes of 1 MiB by default), or ``fs.pipe-max-size`` is
    lower. Splicing through a pipe of a page or two would cost more than the copy it saves."""


class SpliceLink:
    """One transfer's pipe and duplicates of the two socket descriptors (the event loop refuses
    a second watcher on a transport's own). Made per transfer and closed at its end: pipes count
    against a per-user budget, so only the responses under way hold one."""

    def __init__(self, loop: asyncio.AbstractEventLoop, source_fd: int, sink_fd: int) -> None:
        self.loop = loop
        self.closed = False
        self._fds: list[int] = []
        try:
            self.source = self._keep(os.dup(source_fd))
            self.sink = self._keep(os.dup(sink_fd))
            self.pipe_out, self.pipe_in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._fds += (self.pipe_out, self.pipe_in)
            with contextlib.suppress(OSError):  # over pipe-max-size or the budget: said below
                fcntl.fcntl(self.pipe_in, _F_SETPIPE_SZ, PIPE_BYTES)
            self.pipe_bytes: int = fcntl.fcntl(self.pipe_in, _F_GETPIPE_SZ)
            if self.pipe_bytes < MIN_PIPE_BYTES:
                raise PipeTooSmall(f"a pipe of {self.pipe_bytes} bytes (fs.pipe-user-pages-soft spent?)")
        except OSError:
            self.close()
            raise

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for fd in self._fds:
                os.close(fd)


class SpliceFailed(Exception):
    """A transfer ended early; ``sink_side``: it was the receiving side (the client) that went."""

    def __init__(self, reason: str, sink_side: bool) -> None:
        super().__init__(reason)
        self.sink_side = sink_side


class SpliceTransfer:
    """Moves ``left`` bytes of one response from the broker's socket to the client's, through
    ``link`` (closed at the end). ``done`` is called once all went out; ``failed`` with a
    SpliceFailed on an error or an early end (the pipeline then closes the connection: the
    client got part of a response). The filter, if any, sees every byte it does not skip, in
    order, as a streamed response's does."""

    def __init__(
        self,
        link: SpliceLink,
        left: int,
        span_filter: SpanFilter | None,
        done: Callable[[], None],
        failed: Callable[[SpliceFailed], None],
        held: bytes | bytearray = b"",
        first: bytes = b"",
    ) -> None:
        """``held``: what the filter already held back of the response's first bytes;
        ``first``: what goes out before the bytes still in the broker's socket."""
        self.link = link
        self.left = left  # still in the broker's socket
        self.filter = span_filter
        self.done = done
        self.failed = failed
        self.in_pipe = 0
        self.pending: bytes | memoryview = first  # read into user space, still to be written into the pipe
        self.held = bytearray(held)  # what the filter holds back until its end
        self.finished = span_filter is None
        self.spliced = 0  # bytes moved without a copy
        # A skippable span is spliced from its start to its end: what is left of one begun is
        # spliced however little (the threshold decides where to begin, not where to stop).
        self.mid_span = False
        self._watching = _NOTHING
        self.over = False

    def start(self) -> None:
        self._pump()

    def cancel(self) -> None:
        """The connection closes: stop, and call neither callback."""
        if not self.over:
            self.over = True
            self._stop()

    def _stop(self) -> None:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            self._watch(_NOTHING)
        self.link.close()

    def _watch(self, what: int) -> None:
        if what == self._watching:
            return
        link, loop = self.link, self.link.loop
        if self._watching == _READABLE:
            loop.remove_reader(link.source)
        elif self._watching == _WRITABLE:
            loop.remove_writer(link.sink)
        self._watching = what
        if what == _READABLE:
            loop.add_reader(link.source, self._pump)
        elif what == _WRITABLE:
            loop.add_writer(link.sink, self._pump)

    def _pump(self) -> None:
        if self.over:
            return
        try:
            wait = self._move()
            if wait:
                self._watch(wait)
                return
        except SpliceFailed as exc:
            self._end(exc)
            return
        except (OSError, ValueError) as exc:  # a socket's error, a filter's SchemaError
            self._end(SpliceFailed(str(exc) or type(exc).__name__, sink_side=False))
            return
        self._end(None)

    def _end(self, error: SpliceFailed | None) -> None:
        self.over = True
        self._stop()
        if error is None:
            self.done()
        else:
            self.failed(error)

    def _move(self) -> int:
        """Move what can move now: _NOTHING when all went out, else what to wait for. The pipe
        is filled before it is drained, as a streamed response goes out in 1 MiB writes: fewer,
        larger writes wake the client fewer times."""
        while True:
            full = self._fill()
            if self.in_pipe and (full or not self.left):
                if not self._drain():
                    return _WRITABLE  # the client's socket is full
                continue
            if self.left:
                return _READABLE  # the broker's socket is empty
            if not self.finished:
                self._finish_filter()
                continue
            return _NOTHING

    def _fill(self) -> bool:
        """Into the pipe: bytes read before, then the broker's socket's, until it is empty or
        the pipe full. True when the pipe is full."""
        pipe_bytes = self.link.pipe_bytes
        while True:
            if self.pending:
                try:
                    n = os.write(self.link.pipe_in, self.pending)
                except BlockingIOError:
                    n = 0
                self.pending = self.pending[n:]
                self.in_pipe += n
                if self.pending:
                    return True
                continue
            if not self.left:
                return False
            if self.in_pipe >= pipe_bytes:
                return True
            if not self._take(pipe_bytes - self.in_pipe):
                # Nothing came: the socket is empty, or the pipe has no slot left (it counts
                # pages, not bytes) while bytes wait in the socket.
                return bool(self.in_pipe) and _unread(self.link.source) > 0

    def _drain(self) -> bool:
        """The pipe into the client's socket: False when that is full first."""
        while self.in_pipe:
            try:
                n = os.splice(self.link.pipe_out, self.link.sink, self.in_pipe, flags=_FLAGS)
            except BlockingIOError:
                return False
            except OSError as exc:
                raise SpliceFailed(f"the client's socket: {exc}", sink_side=True) from exc
            self.in_pipe -= n
        return True

    def _take(self, room: int) -> bool:
        """Splice or read the response's next bytes from the broker's socket: True if any came."""
        span_filter = self.filter
        if span_filter is None:
            span = self.left
        else:  # once the filter holds bytes back, it sees all the rest
            span = 0 if self.held else span_filter.skippable()
            if span < SPLICE_FROM_BYTES and not self.mid_span:
                span = 0
        if span:
            try:
                n = os.splice(self.link.source, self.link.pipe_in, min(span, self.left, room), flags=_FLAGS)
            except BlockingIOError:
                return False
            if not n:
                raise SpliceFailed(_closed_early(self.left), sink_side=False)
            self.left -= n
            self.in_pipe += n
            self.spliced += n
            if span_filter is not None:
                span_filter.skip(n)
                self.mid_span = n < span
            return True
        try:
            data = os.read(self.link.source, min(READ_BYTES, self.left, room))
        except BlockingIOError:
            return False
        if not data:
            raise SpliceFailed(_closed_early(self.left), sink_side=False)
        self.left -= len(data)
        self.pending = let_out(span_filter, self.held, data)
        return True

    def _finish_filter(self) -> None:
        assert self.filter is not None
        self.filter.finish(self.held)
        self.pending = bytes(self.held)
        self.held.clear()
        self.finished = True


def _closed_early(left: int) -> str:
    return f"the broker closed the connection {left} bytes before the response's end"


def _unread(fd: int) -> int:
    """Bytes waiting in a socket's receive queue (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]
