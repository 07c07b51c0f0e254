"""One pipeline per client connection: client socket <-> proxy <-> its own upstream broker socket.

The pipeline owns the connection: sockets, frame boundaries, the FIFO of requests in flight
(responses come back in request order, Kafka guarantees it per connection), pausing and muting.
Everything else is a stage (``proxy.stages``): for each request the stages that asked for its API
key run in order; a request none asked for is forwarded undecoded, byte for byte. Reads on either
side pause while the other side's write buffer is full, so memory stays bounded per connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections import deque
from collections.abc import Coroutine
from typing import Any

from protocol import messages
from protocol.api_keys import api_name
from protocol.frames import (
    SIZE,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    RequestHeader,
    encode_response_header,
    parse_request_header,
)
from protocol.sasl import SaslTracker
from protocol.schema import SchemaError
from proxy import transports
from proxy.connection_identity import Refused, tls_identity
from proxy.host import Host, Listener
from proxy.stages import InFlight, Request, Response
from proxy.transports import UpstreamProtocol, close_bounded, peer_has_closed
from quota.keys import ANONYMOUS

log = logging.getLogger(__name__)
_ids = itertools.count(1)

# Per-direction write buffer: large enough that a multi-hundred-KiB Produce or Fetch frame does not
# pause the other side on every frame, small enough to bound memory per connection.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024

# Reasons a connection reads nothing new until they pass (other pauses only stop the socket).
_THROTTLE = "throttle"  # muted for a throttle time
_THROTTLE_PENDING = "throttle-pending"  # a throttled request's response has not gone out yet
_HOLD_REASONS = frozenset({_THROTTLE, _THROTTLE_PENDING, "admission", "volume-pause", "quota-api"})


class Pipeline:
    """State of one client connection and its upstream connection."""

    def __init__(self, server: Host, listener: Listener, client: asyncio.Transport) -> None:
        self.id = next(_ids)
        self.server = server
        self.listener = listener
        self.client = client
        client.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.upstream: asyncio.Transport | None = None
        self.upstream_addr = "?"
        peer = client.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.requests = FrameDecoder(server.cfg.max_frame_bytes)
        self.responses = FrameDecoder(server.cfg.max_frame_bytes)
        self.in_flight: deque[InFlight] = deque()
        self.pending: list[bytes | bytearray] = []  # frames read before the upstream connected
        self._client_pauses: set[str] = set()
        self._upstream_pauses: set[str] = set()
        self.closed = False
        self.user = ANONYMOUS  # the authenticated principal, once the proxy knows it
        self.node_id = listener.node_id  # the broker this connection stands for (None: bootstrap)
        self.sasl = SaslTracker()
        self._mute_until = 0.0
        self._mute_handle: asyncio.TimerHandle | None = None
        self._watch_handle: asyncio.TimerHandle | None = None  # looks for the client leaving while paused
        self._pending_throttles = 0  # throttled requests whose response is still to come
        self._last_response_at = 0.0
        # Loop time the current incomplete request frame began arriving (reading time only: a
        # pause restarts it), or None between frames: the slowloris deadline.
        self.frame_started: float | None = None
        self.held: deque[bytearray] = deque()  # requests read while the connection was muted
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        self.metrics = server.metrics
        self._api_metrics: dict[int, Any] = {}  # per api key, resolved once per connection
        self.stages = server.stages.for_connection(self)
        server.pipeline_opened(self)
        self._connect_task: asyncio.Task[None] | None = None
        try:
            self.user, self.node_id = tls_identity(
                server.tls, server.cfg, client.get_extra_info("ssl_object"), self.user, self.node_id
            )
        except Refused as exc:
            self.reject(str(exc), exc.label)
            return
        hold_ms = server.enforcer.on_connection(peer[0]) if isinstance(peer, tuple) else 0
        if hold_ms:
            # KIP-612: an IP over its connection rate is accepted but never read from, and closed
            # once the throttle time has passed; other IPs are not affected.
            self.pause_client("connection-rate")
            self._mute_handle = self.loop.call_later(
                hold_ms / 1000.0,
                lambda: self.close(f"over connection_creation_rate, held {hold_ms} ms", level=logging.INFO),
            )
            return
        self.pause_client("connecting")
        self._connect_task = self.loop.create_task(self._connect())

    # --- lifecycle -----------------------------------------------------------------------------

    async def _connect(self) -> None:
        server = self.server
        targets = server.brokers.upstream_for(self.node_id)
        if not targets:
            self.close(f"no known address for broker node {self.node_id}")
            return
        last: BaseException | None = None
        for host, port in targets:
            tls = server.upstream_ssl()
            try:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_connection(
                        lambda: UpstreamProtocol(self),
                        host,
                        port,
                        ssl=tls,
                        server_hostname=host if tls else None,
                    ),
                    server.cfg.connect_timeout_seconds,
                )
            except (TimeoutError, OSError) as exc:
                last = exc
                self.metrics.upstream_errors.labels("connect").inc()
                log.warning("conn %d: upstream %s:%d unreachable: %r", self.id, host, port, exc)
                continue
            if self.closed:
                transport.close()
                return
            self.upstream = transport
            transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
            self.upstream_addr = f"{host}:{port}"
            for frame in self.pending:
                self._forward(frame)
            self.pending.clear()
            if self._upstream_pauses:
                transport.pause_reading()
            self.resume_client("connecting")
            return
        self.close(f"no upstream broker reachable (last error {last!r})")

    def close(self, reason: str | None = None, *, level: int = logging.WARNING) -> None:
        """Close both sides once; ``reason`` is logged with the client's address."""
        if self.closed:
            return
        self.closed = True
        if reason:
            log.log(level, "conn %d from %s on %s closed: %s", self.id, self.peer, self.listener.name, reason)
        close_bounded(self.client, self.loop)
        if self.upstream is not None:
            close_bounded(self.upstream, self.loop)
        for handle in (self._connect_task, self._mute_handle, self._watch_handle, *self._tasks):
            if handle is not None:
                handle.cancel()
        for stage in self.stages.stages:
            stage.on_close()
        self.server.pipeline_closed(self)

    def reject(self, reason: str, label: str) -> None:
        """Bad input from the client: count it, log it, close this connection only."""
        self.metrics.rejected_frames.labels(label).inc()
        self.close(f"rejected: {reason}")

    def client_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            why = None
            if self.requests.mid_frame:
                why = f"client disconnected mid-frame ({self.requests.buffered} payload bytes unused)"
            self.close(why, level=logging.INFO)

    def upstream_lost(self, exc: Exception | None) -> None:
        """With requests in flight this is a failure the client will see as one; with none it
        is most often the broker closing a connection idle for its connections.max.idle.ms,
        which the client sees exactly as it would without the proxy."""
        if self.closed:
            return
        where = self.upstream_addr
        if self.in_flight:
            self.metrics.upstream_errors.labels("disconnect").inc()
            n = len(self.in_flight)
            self.close(f"upstream {where} closed the connection with {n} requests in flight ({exc!r})")
        else:
            self.metrics.upstream_errors.labels("idle_close").inc()
            self.close(f"upstream {where} closed the connection while idle ({exc!r})", level=logging.INFO)

    @property
    def idle(self) -> bool:
        return not self.in_flight

    # --- flow control ------------------------------------------------------------------------

    def pause_client(self, reason: str) -> None:
        if not self._client_pauses and not self.closed:
            self.client.pause_reading()
            if self._watch_handle is None:
                self._watch_handle = self.loop.call_later(
                    transports.PAUSED_PEER_CHECK_SECONDS, self._watch_client
                )
        self._client_pauses.add(reason)

    def hold(self, reason: str) -> None:
        """A stage holds the connection: nothing new is read until it releases ``reason``."""
        self.pause_client(reason)

    def _watch_client(self) -> None:
        """While reads are paused, close the connection once the client has left."""
        self._watch_handle = None
        if self.closed or not self._client_pauses:
            return
        if peer_has_closed(self.client):
            paused = ", ".join(sorted(self._client_pauses))
            self.close(f"client left while its reads were paused ({paused})", level=logging.INFO)
            return
        self._watch_handle = self.loop.call_later(transports.PAUSED_PEER_CHECK_SECONDS, self._watch_client)

    def resume_client(self, reason: str) -> None:
        self._client_pauses.discard(reason)
        if self._client_pauses or self.closed:
            return
        self._release_held()

    def release(self, reason: str) -> None:
        """A stage's hold is over: requests read meanwhile go first, then reading resumes."""
        self._client_pauses.discard(reason)
        self._release_held()

    def _release_held(self) -> None:
        """Requests read while held go first, in order; one of them may hold the connection again."""
        while self.held and not self._holding and not self.closed:
            self._request(self.held.popleft())
        if not self._client_pauses and not self.closed:
            self.client.resume_reading()
            if self.frame_started is not None:
                self.frame_started = self.loop.time()  # the pause was ours, not the client's

    @property
    def _holding(self) -> bool:
        return bool(self._client_pauses & _HOLD_REASONS)

    def frame_overdue(self, now: float, timeout: float) -> bool:
        """True when a request frame has been arriving for longer than ``timeout`` seconds of
        reading time (paused connections are never overdue: we are the ones not reading)."""
        started = self.frame_started
        return started is not None and not self._client_pauses and not self.closed and now - started > timeout

    def pause_upstream(self, reason: str) -> None:
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.pause_reading()
        self._upstream_pauses.add(reason)

    def resume_upstream(self, reason: str) -> None:
        self._upstream_pauses.discard(reason)
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.resume_reading()

    def mute(self, throttle_ms: int) -> None:
        """Stop reading from the client for ``throttle_ms`` (KIP-219's channel mute)."""
        until = self.loop.time() + throttle_ms / 1000.0
        if until <= self._mute_until or self.closed:
            return
        self._mute_until = until
        self.pause_client(_THROTTLE)
        if self._mute_handle is not None:
            self._mute_handle.cancel()
        self._mute_handle = self.loop.call_at(until, self._unmute)

    def _unmute(self) -> None:
        self._mute_handle = None
        self._mute_until = 0.0
        self.resume_client(_THROTTLE)

    def wait_before(self, frame: bytearray, wait_ms: int) -> None:
        """Put a request back, unread, and mute the connection ``wait_ms``: it is read again then."""
        self.held.appendleft(frame)
        self.mute(wait_ms)

    def hold_until_answered(self, entry: InFlight) -> None:
        """Read nothing more until ``entry``'s response has gone out (its mute follows)."""
        entry.holds_reads = True
        self._pending_throttles += 1
        self.pause_client(_THROTTLE_PENDING)

    def _answered(self, entry: InFlight) -> None:
        if entry.holds_reads:
            entry.holds_reads = False
            self._pending_throttles -= 1
            if not self._pending_throttles:
                self.resume_client(_THROTTLE_PENDING)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of this connection: cancelled when it closes."""
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- requests ------------------------------------------------------------------------------

    def client_written(self, nbytes: int) -> None:
        """The client socket wrote ``nbytes`` into the request decoder's buffer."""
        if self.closed:
            return
        try:
            frames = self.requests.written(nbytes)
        except FrameError as exc:
            self.reject(str(exc), "oversize" if isinstance(exc, FrameTooLarge) else "bad-size")
            return
        if not self.requests.mid_frame:
            self.frame_started = None
        elif self.frame_started is None or frames:
            self.frame_started = self.loop.time()  # a new frame began in these bytes
        for frame in frames:
            if self.closed:
                return
            if self._holding:  # a throttled connection is muted: Kafka would not have read these yet
                self.held.append(frame)
            else:
                self._request(frame)

    def _request(self, frame: bytearray) -> None:
        try:
            header = parse_request_header(frame)
        except FrameError as exc:
            self.reject(str(exc), "bad-header")
            return
        req = Request(header, frame)
        try:
            for stage in self.stages.for_key(header.api_key):
                if stage.on_request(req):
                    return
            expects_response = req.expects_response
        except (SchemaError, struct.error) as exc:
            name = api_name(header.api_key)
            self.reject(f"malformed {name} v{header.api_version} request: {exc}", "malformed")
            return
        if expects_response:
            entry = self.entry_for(req)
            if req.throttle_ms:
                # Read nothing more until the response goes out and its mute ends, as the broker
                # (which reads one request at a time per connection) would.
                self.hold_until_answered(entry)
            self.in_flight.append(entry)
        else:  # acks=0: no response to wait for
            if req.throttle_ms:
                self.mute(req.throttle_ms)
            if req.watchers:
                entry = self.entry_for(req, counted=False)
                for watcher in entry.watchers:
                    watcher.on_done(entry, -1.0)
        self.send(frame)

    def _metrics_of(self, api_key: int) -> Any:
        found = self._api_metrics.get(api_key)
        if found is None:
            found = self._api_metrics[api_key] = self.metrics.api(api_key)
        return found

    def entry_for(self, req: Request, counted: bool = True) -> InFlight:
        """The FIFO entry of a request (not queued yet); counted in the request metrics."""
        header = req.header
        if counted:
            req_counter, bytes_counter, _resp, _lat = self._metrics_of(header.api_key)
            req_counter.inc()
            bytes_counter.inc(len(req.frame) + 4)
        entry = InFlight(
            header.api_key,
            header.api_version,
            header.correlation_id,
            self.loop.time(),
            None,
            header.client_id or "",
        )
        entry.throttle_ms = req.throttle_ms
        if req.stages or req.watchers:
            entry.stages = (*req.stages, *req.watchers)
            entry.watchers = tuple(req.watchers)
        entry.charge_time = req.charge_time
        entry.fetch = req.fetch
        entry.capture = req.capture
        return entry

    def send(self, frame: bytes | bytearray) -> None:
        """Forward a request, or queue it until the upstream connection is up."""
        if self.upstream is None:
            self.pending.append(frame)
        else:
            self._forward(frame)

    def _forward(self, frame: bytes | bytearray) -> None:
        assert self.upstream is not None
        self.upstream.writelines((SIZE.pack(len(frame)), frame))

    @staticmethod
    def encoded_answer(header: RequestHeader, body: dict[str, Any]) -> bytes:
        """The proxy's own response to a request: its header, then ``body``."""
        payload = encode_response_header(header.api_key, header.api_version, header.correlation_id)
        payload += messages.encode_response(header.api_key, header.api_version, body)
        return bytes(payload)

    def answer(self, entry: InFlight, payload: bytes) -> None:
        """Answer ``entry`` (already in the FIFO) with ``payload``, in its turn."""
        entry.local_response = payload
        self.flush_local()

    def flush_local(self) -> None:
        while self.in_flight and self.in_flight[0].local_response is not None:
            entry = self.in_flight.popleft()
            assert entry.local_response is not None
            self.client.writelines((SIZE.pack(len(entry.local_response)), entry.local_response))
            if entry.throttle_ms:
                self.mute(entry.throttle_ms)
            self._answered(entry)
            for watcher in entry.watchers:
                watcher.on_done(entry, -1.0)

    # --- responses -----------------------------------------------------------------------------

    def upstream_written(self, nbytes: int) -> None:
        """The upstream socket wrote ``nbytes`` into the response decoder's buffer."""
        if self.closed:
            return
        try:
            frames = self.responses.written(nbytes)
        except FrameError as exc:
            self.metrics.upstream_errors.labels("bad-frame").inc()
            self.close(f"upstream sent a bad frame: {exc}")
            return
        for frame in frames:
            if self.closed:
                return
            self._response(frame)

    def _response(self, frame: bytearray) -> None:
        if not self.in_flight or len(frame) < 4:
            self.metrics.upstream_errors.labels("unexpected-response").inc()
            self.close("upstream sent a response nobody asked for")
            return
        entry = self.in_flight.popleft()
        correlation_id = int.from_bytes(frame[:4], "big", signed=True)
        if correlation_id != entry.correlation_id:
            self.metrics.upstream_errors.labels("correlation").inc()
            self.close(f"response correlation id {correlation_id} != expected {entry.correlation_id}")
            return
        now = self.loop.time()
        # The broker works on one request of a connection at a time: a pipelined request's time
        # starts when the one before it was answered.
        entry.busy = now - max(entry.sent_at, self._last_response_at)
        self._last_response_at = now
        if entry.stages or entry.throttle_ms:
            resp = Response(entry, frame)
            try:
                for stage in entry.stages:
                    if stage.on_response(resp):
                        return
                frame = resp.finished()
            except (SchemaError, FrameError, LookupError) as exc:
                self.metrics.upstream_errors.labels("undecodable-response").inc()
                self.close(f"cannot rewrite {api_name(entry.api_key)} v{entry.api_version} response: {exc}")
                return
        _req, _bytes, resp_counter, latency = self._metrics_of(entry.api_key)
        resp_counter.inc(len(frame) + 4)
        upstream = now - entry.sent_at
        latency.observe(upstream)
        for watcher in entry.watchers:
            watcher.on_done(entry, upstream * 1000)
        self.client.writelines((SIZE.pack(len(frame)), frame))
        if entry.throttle_ms:
            self.mute(entry.throttle_ms)
        self._answered(entry)
        self.flush_local()
        if self.server.draining and not self.in_flight:
            self.close("drained for shutdown", level=logging.INFO)
