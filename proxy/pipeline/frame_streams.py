"""Large frames forwarded as their bytes arrive, when no stage needs more of them than their
first bytes: memory per connection stays bounded by the socket buffers, not by the frame size.

A Produce request whose stages read no more than its header is streamed upstream (its acks, in
its first bytes, say whether a response comes); a response none looks at (no stage asked for it
and no throttle is to be patched into it) is streamed to the client. Everything else is gathered
whole, as before. While a request streams, other requests wait for it to end; while a response
streams, answers the proxy makes itself wait for theirs.

A streamed response goes from the broker's socket to the client's by splice(2) where it can
(``proxy/net/splice.py``: plaintext both sides, ``splice_responses``, nothing else waiting to go
to the client): only its first bytes pass through the proxy, and what its filter looks at.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Final

from protocol.api_keys import PRODUCE_KEY
from protocol.frames import SIZE, FrameError, FrameHead, Piece, parse_request_header
from protocol.schema import SchemaError
from proxy.net.splice import SPLICE_SUPPORTED, SpliceFailed, SpliceLink, SpliceTransfer, let_out, socket_fd
from proxy.pipeline.stages import InFlight, Request
from proxy.pipeline.stages.base import WHOLE, StreamFilter
from proxy.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from proxy.pipeline.connection import Pipeline

splice_log: Final = RateLimitedLog(logging.getLogger(__name__))  # out of descriptors: often
_SPLICING: Final = "splice"  # the broker side's reads pause while the kernel moves a response


class FrameStreams:
    """One connection's frames under way, each direction."""

    __slots__ = (
        "after_request",
        "can_splice",
        "conn",
        "filter",
        "held",
        "request_open",
        "response",
        "response_size",
        "transfer",
    )

    def __init__(self, conn: Pipeline) -> None:
        self.conn = conn
        self.request_open = False  # a request is being forwarded piece by piece
        self.after_request: list[bytes | bytearray] = []  # sent once that request has gone out
        self.response: InFlight | None = None  # whose response goes out piece by piece
        self.response_size = 0
        self.filter: StreamFilter | None = None  # a stage's view of the response streamed
        self.held = bytearray()  # its bytes the filter holds back until the end
        self.can_splice = SPLICE_SUPPORTED and conn.server.cfg.splice_responses  # until tried
        self.transfer: SpliceTransfer | None = None  # the response being spliced

    def request_head(self, head: FrameHead) -> None:
        """A large request began: a Produce whose stages read no more than its header (address
        rewriting wants its response) is streamed; anything else is gathered."""
        conn = self.conn
        upstream = conn.upstream
        if conn.holding or upstream is None:
            return
        try:
            header = parse_request_header(head.head)
            key, version = header.api_key, header.api_version
            if key != PRODUCE_KEY:
                return
            stages = conn.stages.for_request(key, version)
            if any(stage.reads_request_body(key, version) for stage in stages):
                return
            req = Request(header, bytearray(head.head))
            conn.read_client_id(req)
            expects_response = req.expects_response  # acks, from the first bytes
            for stage in stages:
                stage.on_request(req)
        except (FrameError, SchemaError, struct.error, IndexError):
            return  # gathered whole, and refused then if it is bad
        data = conn.requests.stream()
        conn.forwarding(req, expects_response, head.size + 4)
        self.request_open = True
        upstream.writelines((SIZE.pack(head.size), data))

    def request_piece(self, piece: Piece) -> None:
        conn = self.conn
        upstream = conn.upstream
        assert upstream is not None
        upstream.write(piece.data)
        if not upstream.get_write_buffer_size():
            conn.requests.reuse_chunk()  # the kernel has it all: no view of the buffer is kept
        elif piece.last:
            conn.requests.let_chunk_go()
        if piece.last:
            self.request_open = False
            for frame in self.after_request:
                conn.forward(frame)
            self.after_request.clear()

    def response_head(self, head: FrameHead) -> None:
        """A large response began: stream it if nothing needs it whole; else it is gathered."""
        conn = self.conn
        if not conn.in_flight or len(head.head) < 4:
            return
        entry = conn.in_flight[0]
        correlation_id = int.from_bytes(head.head[:4], "big", signed=True)
        if entry.throttle_ms or correlation_id != entry.correlation_id:
            return  # gathered whole (a wrong correlation id is refused then)
        chosen: StreamFilter | None = None
        for stage in entry.stages:
            found = stage.stream_filter(entry)
            if found is WHOLE or (found is not None and chosen is not None):
                return
            chosen = chosen or found
        data = conn.responses.stream()
        conn.in_flight.popleft()
        conn.last_response_at = conn.loop.time()
        self.response = entry
        self.response_size = head.size
        self.filter = chosen
        first = let_out(self.filter, self.held, data)
        if (
            self.can_splice
            and not conn.feeding_responses  # some of its bytes are read already
            and not conn.client.get_write_buffer_size()
            and self._splice(SIZE.pack(head.size) + first)
        ):
            return
        conn.client.writelines((SIZE.pack(head.size), first))

    def _splice(self, first: bytes) -> bool:
        """Hand the response over to the kernel (see the module docstring), its ``first`` bytes
        with it (one write to the client, not two); False when it cannot be."""
        conn = self.conn
        upstream = conn.upstream
        client_fd = socket_fd(conn.client)
        upstream_fd = socket_fd(upstream) if upstream is not None else None
        if client_fd is None or upstream_fd is None:
            self.can_splice = False  # TLS on a side: it stays so for the connection
            return False
        try:
            link = SpliceLink(conn.loop, upstream_fd, client_fd)
        except OSError as exc:  # out of descriptors or of pipe budget: copied this time
            conn.metrics.upstream_errors.labels("splice-unavailable").inc()
            splice_log.log(
                logging.WARNING,
                "no-splice",
                "conn %d: a response streams through the proxy: %s",
                conn.id,
                exc,
            )
            return False
        left = conn.responses.hand_over()
        held = bytes(self.held)
        self.held.clear()
        conn.pause_upstream(_SPLICING)
        self.transfer = SpliceTransfer(
            link, left, self.filter, self._spliced, self._splice_failed, held, first
        )
        self.transfer.start()
        return True

    def _spliced(self) -> None:
        """In an event loop callback: an error here must close the connection, not leave the
        broker side paused for good (``ConnectionFlow.failed``)."""
        conn = self.conn
        transfer = self.transfer
        assert transfer is not None
        self.transfer = None
        self.filter = None
        try:
            conn.resume_upstream(_SPLICING)
            conn.metrics.spliced_response_bytes.inc(transfer.spliced)
            self._response_out()
        except Exception:
            conn.failed("a spliced response's end")

    def _splice_failed(self, error: SpliceFailed) -> None:
        self.transfer = None
        conn = self.conn
        try:
            if error.sink_side:  # the client went mid-response, as a streamed one's may
                conn.close(f"client disconnected mid-response ({error})", level=logging.INFO)
                return
            conn.metrics.upstream_errors.labels("splice").inc()
            conn.close(f"a response could not be passed on whole: {error}")
        except Exception:
            conn.failed("a spliced response's error")

    def close(self) -> None:
        """The connection closes: a splice under way stops, its pipe and descriptors go."""
        if self.transfer is not None:
            self.transfer.cancel()
            self.transfer = None

    def response_piece(self, piece: Piece) -> None:
        conn = self.conn
        try:
            data = let_out(self.filter, self.held, piece.data)
        except SchemaError as exc:
            conn.metrics.upstream_errors.labels("undecodable-response").inc()
            conn.close(f"cannot follow a streamed response: {exc}")
            return
        if data:
            conn.client.write(data)
        if not conn.client.get_write_buffer_size():
            conn.responses.reuse_chunk()  # the kernel has it all: no view of the buffer is kept
        elif piece.last:
            conn.responses.let_chunk_go()
        if not piece.last:
            return
        if self.filter is not None:
            self.filter.finish(self.held)
            conn.client.write(bytes(self.held))
            self.held.clear()
            self.filter = None
        self._response_out()

    def _response_out(self) -> None:
        """The streamed response went out whole."""
        conn = self.conn
        entry = self.response
        assert entry is not None
        self.response = None
        conn.traffic(entry.api_key).response(self.response_size + 4, conn.loop.time() - entry.sent_at)
        conn.bytes_out += self.response_size + 4
        conn.sent(entry)
