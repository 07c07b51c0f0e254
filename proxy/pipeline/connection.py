"""One pipeline per client connection: client socket <-> proxy <-> its own upstream broker socket.

The pipeline owns the connection: sockets, frame boundaries, the FIFO of requests in flight
(responses come back in request order, Kafka guarantees it per connection), pausing and muting.
Everything else is a stage (``proxy.pipeline.stages``): for each request the stages that asked for its API
key run in order; a request none asked for is forwarded undecoded, byte for byte. Reads on either
side pause while the other side's write buffer is full, so memory stays bounded per connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections import deque
from typing import Any, Final

from protocol import messages
from protocol.api_keys import FETCH_KEY, api_name
from protocol.frames import (
    STREAM_CHUNK_BYTES,
    TLS_STREAM_CHUNK_BYTES,
    FrameDecoder,
    FrameError,
    FrameHead,
    FrameTooLarge,
    LastClientId,
    Piece,
    RequestHeader,
    encode_response_header,
    parse_request_header,
    size_prefix,
    unpack_size_from,
)
from protocol.sasl import SaslTracker
from protocol.schema import SchemaError, int32_at
from proxy.net.connection_identity import Refused, tls_identity
from proxy.net.transports import PlainUpstreamProtocol, close_bounded, read_into_buffers
from proxy.pipeline.flow import ConnectionFlow
from proxy.pipeline.frame_streams import FrameStreams
from proxy.pipeline.host import Host, Listener
from proxy.pipeline.stages import InFlight, Request, Response
from proxy.pipeline.tasks import connect_upstream
from proxy.traffic_metrics import ApiTraffic
from quota.client_id_policy import ClientIdPolicy
from quota.exemptions import Exemptions, parse_address
from quota.keys import ANONYMOUS

log = logging.getLogger(__name__)
_CONNECTION_RATE: Final = "connection-rate"  # the pause of a connection over its IP's creation rate
_ids: Final = itertools.count(1)

# Per-direction write buffer: large enough that a multi-hundred-KiB Produce or Fetch frame does not
# pause the other side on every frame, small enough to bound memory per connection.
WRITE_BUFFER_HIGH: Final = 4 * 1024 * 1024
WRITE_BUFFER_LOW: Final = 1024 * 1024

# A frame up to this size goes out as one bytes object, its size prefix and payload copied
# together: uvloop writes a lone bytes object straight to the socket, where a bytearray costs it
# a view and two buffers a write context with a buffer export each (more than a 16 KiB copy).
ONE_WRITE_BYTES: Final = 16 * 1024
# Two ``bytes`` objects, uvloop writes in one writev with no copy and no view: from this size that
# costs less than joining them (a 9 KiB Produce request: 920 fewer instructions a request,
# bench/request_instructions.py).
WRITEV_FROM_BYTES: Final = 4 * 1024
STREAM_FROM_BYTES: Final = 64 * 1024  # frames from this size go out as they arrive, when they may


def write_frame(transport: asyncio.Transport, payload: bytes | bytearray) -> None:
    """``payload`` and its size prefix: one ``bytes`` object, or for a larger frame the two in one
    ``writev`` (no copy)."""
    if isinstance(payload, bytes):  # as the decoder's frames are
        if len(payload) >= WRITEV_FROM_BYTES:
            transport.writelines((size_prefix(len(payload)), payload))
        else:
            transport.write(size_prefix(len(payload)) + payload)  # joined natively, compiled
    elif len(payload) <= ONE_WRITE_BYTES:
        transport.write(size_prefix(len(payload)) + payload)
    else:
        transport.writelines((size_prefix(len(payload)), payload))


def write_batch(transport: asyncio.Transport, batch: list[bytes | bytearray]) -> None:
    """The frames a read collected (sizes and payloads, each up to ONE_WRITE_BYTES) in one write:
    ``bytes`` objects of WRITEV_FROM_BYTES on average in one writev, not copied; else joined into
    one ``bytes`` object, uvloop's plain write (``writelines`` of ``bytearray``s costs a view and
    a buffer export a frame)."""
    total = 0
    for item in batch:
        if not isinstance(item, bytes):
            transport.write(b"".join(batch))
            return
        total += len(item)
    if total >= WRITEV_FROM_BYTES * (len(batch) // 2):
        transport.writelines(batch)
    else:
        transport.write(b"".join(batch))


def collect_frame(
    transport: asyncio.Transport, batch: list[bytes | bytearray], payload: bytes | bytearray
) -> None:
    """Add ``payload`` and its size prefix to the frames a read puts out in one write: a frame up
    to ONE_WRITE_BYTES is copied into that write (a read holds a scratch buffer's worth of them
    at most); a larger one goes out at once, after the batch so far, not copied."""
    if len(payload) <= ONE_WRITE_BYTES:
        batch.append(size_prefix(len(payload)))
        batch.append(payload)
        return
    if batch:
        write_batch(transport, batch)
        batch.clear()
    write_frame(transport, payload)


def _frames_of(batch: list[bytes | bytearray], frames: list[Any]) -> bool:
    """``batch`` is each of ``frames``, in order, after its size prefix (``collect_frame``'s),
    and nothing else: written, it is the read they came in."""
    if len(batch) != 2 * len(frames):
        return False
    i = 0
    for frame in frames:
        if batch[i + 1] is not frame:
            return False
        i += 2
    return True


class Pipeline(ConnectionFlow):
    """State of one client connection and its upstream connection."""

    def __init__(
        self,
        server: Host,
        listener: Listener,
        client: asyncio.Transport,
        origin: tuple[str, int] | None = None,
        stream_from: int = STREAM_FROM_BYTES,
    ) -> None:
        """``origin``: the client's address from a PROXY protocol header (proxy/net/proxy_protocol.py),
        which then stands for the socket's peer (the load balancer) everywhere. ``stream_from``:
        the frame size from which frames are streamed (the fuzz target's inputs are smaller)."""
        super().__init__()
        self.id = next(_ids)
        self.server = server
        self.listener = listener
        self.client = client
        client.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        # Declared by ConnectionFlow: annotated again here, mypyc would show it to the garbage
        # collector twice, and every connection would stay in memory for good.
        self.upstream = None
        self.upstream_addr = "?"
        peer = origin or client.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = parse_address(peer[0] if isinstance(peer, tuple) else None)
        # Large frames are offered for streaming: forwarded as their bytes arrive when no stage
        # needs more of them than their first bytes.
        # Smaller buffers when either link is TLS (decrypted into, encrypted from: see frames.py).
        tls = client.get_extra_info("ssl_object") is not None or server.upstream_ssl() is not None
        chunk = TLS_STREAM_CHUNK_BYTES if tls else STREAM_CHUNK_BYTES
        limit = server.cfg.max_frame_bytes
        self.requests = FrameDecoder(limit, stream_from=stream_from, stream_chunk_bytes=chunk)
        self.responses = FrameDecoder(limit, stream_from=stream_from, stream_chunk_bytes=chunk)
        self.streams = FrameStreams(self)
        self.in_flight: deque[InFlight] = deque()
        self._unread = 0  # bytes the client sent before the upstream connection was asked for
        self._early = bytearray()  # bytes handed over (``feed``) while the upstream connects
        self._last_client_id = LastClientId()  # read again without a decode while it repeats
        # Frames decoded from one read go out in one write (one syscall, not one per frame):
        # collected here while a read's frames are handled, written once at its end.
        self._upstream_batch: list[bytes | bytearray] | None = None
        self._client_batch: list[bytes | bytearray] | None = None
        # A frame that was all of a plain read (``client_data``, ``upstream_data``), and that
        # read: while the frame is handled, the read goes on as it came if the frame is unchanged.
        self._read_request: bytes | None = None
        self._read_request_wire = b""
        self._read_response: bytes | None = None
        self._read_response_wire = b""
        # A plain read's bytes past its whole frames are being put into the response decoder:
        # a response streamed meanwhile is not spliced (some of its bytes are not in the socket).
        self.feeding_responses = False
        self._plain_upstream = False  # the upstream socket is read as bytes (upstream_data)
        self._client_into_buffers = False  # plain client reads switched to buffered ones
        self.closed = False
        self.user = ANONYMOUS  # the authenticated principal, once the proxy knows it
        self.node_id = listener.node_id  # the broker this connection stands for (None: bootstrap)
        self.sasl = SaslTracker(naming=server.sasl_naming())
        self.last_response_at = 0.0
        self.loop = asyncio.get_running_loop()
        # Bound once, for the calls every request makes: compiled, ``self.loop.time()`` and
        # ``self.in_flight.append(...)`` look the method up on the object's type at each call.
        self._now = self.loop.time
        self._queue = self.in_flight.append
        self._dequeue = self.in_flight.popleft
        self.metrics = server.metrics
        self._shutdown = server.shutdown
        # Per api key, resolved once per connection: a list as long as the largest key seen (a
        # dict's lookup boxes and hashes the key, twice a request).
        self._api_traffic: list[ApiTraffic | None] = []
        # This connection's own traffic, for GET /connections and `kthrottle top`.
        self.opened_at = self._now()
        self.client_id = ""  # of its latest request
        self._source_exempt: tuple[object, bool] | None = None  # (exemptions, listener/address exempt)
        # The exemptions and client id policy in force, as of the enforcer's generation read.
        self._enforcer = server.enforcer
        self._rules = server.enforcer.rules
        self._rules_generation = -1
        self._exemptions: Exemptions | None = None
        self._any_exempt = False
        self._policy: ClientIdPolicy | None = None
        self._policy_rewrites = False
        self._quota_id: tuple[object, str, str, str] | None = None  # (policy, sent, user, quota id)
        self.requests_in = self.bytes_in = self.bytes_out = 0
        self.stages = server.stages.for_connection(self)
        server.pipeline_opened(self)
        self._connect_task: asyncio.Task[None] | None = None
        self._silent_handle: asyncio.TimerHandle | None = None
        try:
            self.user, self.node_id = tls_identity(
                server.tls, server.cfg, client.get_extra_info("ssl_object"), self.user, self.node_id
            )
        except Refused as exc:
            self.reject(str(exc), exc.label)
            return
        exempt = server.enforcer.exemptions.source(listener.name, self.address)
        hold_ms = server.enforcer.on_connection(peer[0], exempt) if isinstance(peer, tuple) else 0
        if hold_ms:
            # KIP-612: an IP over its connection rate is accepted but never read from, and closed
            # once the throttle time has passed; other IPs are not affected.
            self.pause_client(_CONNECTION_RATE)
            self._mute_handle = self.loop.call_later(
                hold_ms / 1000.0,
                lambda: self.close(f"over connection_creation_rate, held {hold_ms} ms", level=logging.INFO),
            )
            return
        # The upstream connection is opened when the client first sends something: a connection
        # that never speaks (a load balancer's health check, an idle pool) costs the broker none.
        silent = server.cfg.silent_connection_close_seconds
        if silent is not None:
            self._silent_handle = self.loop.call_later(silent, self._close_if_silent, silent)

    # --- lifecycle -----------------------------------------------------------------------------

    def _close_if_silent(self, seconds: float) -> None:
        self._silent_handle = None
        if self._connect_task is None and self.upstream is None:
            why = f"sent nothing for {seconds:g} s (silent_connection_close_seconds)"
            self.close(why, level=logging.INFO)

    def upstream_connected(self, transport: asyncio.Transport, address: str) -> None:
        """The upstream connection is up (``tasks.connect_upstream``): what the client sent
        meanwhile is read, then reading resumes."""
        self.upstream = transport
        transport.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.upstream_addr = address
        self._plain_upstream = isinstance(transport.get_protocol(), PlainUpstreamProtocol)
        if self._upstream_pauses:
            transport.pause_reading()
        unread, self._unread = self._unread, 0
        early, self._early = self._early, bytearray()
        if unread:  # before reading resumes: the decoder's buffer still holds them
            self.client_written(unread)
        if early:  # then what was handed over meanwhile, in the order it came
            self.feed(early)
        if not self.closed:
            self.resume_client("connecting")

    @property
    def listener_name(self) -> str:
        return self.listener.name

    def _read_rules(self) -> None:
        """The exemptions and client id policy in force, read from the enforcer again only when
        its generation has moved (a reload): one attribute read a request, not six."""
        generation = self._rules.value
        if generation != self._rules_generation:
            enforcer = self._enforcer
            self._exemptions = enforcer.exemptions
            self._any_exempt = self._exemptions.any
            self._policy = enforcer.client_id_policy
            self._policy_rewrites = self._policy.rewrites
            self._rules_generation = generation

    def exempt(self, client_id: str) -> bool:
        """No quota holds this request back (``quotas.exempt``): its user, client id, listener or
        source address is listed. Asked per request: the user changes at a SASL login and the
        exemptions at a reload (the listener and address part is kept until one)."""
        self._read_rules()
        if not self._any_exempt:
            return False
        exemptions = self._exemptions
        assert exemptions is not None
        known = self._source_exempt
        if known is None or known[0] is not exemptions:
            known = self._source_exempt = (exemptions, exemptions.source(self.listener.name, self.address))
        return exemptions.request(known[1], self.user, client_id)

    def read_client_id(self, req: Request) -> None:
        """Whether ``req`` is exempt (by the id it sent), and the client id its quotas see
        (``quotas.client_id_policy``): decided once, when the request is read. A connection's
        id seldom changes, so its last answer is kept (until a reload, or a login)."""
        sent = req.header.client_id or ""
        req.exempt = self.exempt(sent)  # reads the rules in force
        if self._policy_rewrites:
            policy = self._policy
            assert policy is not None
            last = self._quota_id
            if last is not None and last[0] is policy and last[1] == sent and last[2] == self.user:
                sent = last[3]
            else:
                source = str(self.address) if self.address is not None else self.peer
                quota_id = policy.quota_client_id(sent, self.user, source, self.listener.name)
                self._quota_id = (policy, sent, self.user, quota_id)
                sent = quota_id
        req.client_id = self.client_id = sent

    def close(self, reason: str | None = None, *, level: int = logging.WARNING) -> None:
        """Close both sides once; ``reason`` is logged with the client's address."""
        if self.closed:
            return
        self.closed = True
        self._early = bytearray()
        if reason:
            log.log(level, "conn %d from %s on %s closed: %s", self.id, self.peer, self.listener.name, reason)
        # What was handled before the close still goes out, as it would have unbatched.
        self._flush_upstream_batch()
        self._flush_client_batch()
        self.streams.close()
        close_bounded(self.client, self.loop)
        if self.upstream is not None:
            close_bounded(self.upstream, self.loop)
        handles = (self._connect_task, self._mute_handle, self._watch_handle, self._silent_handle)
        for handle in (*handles, *self._tasks):
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
        if not self.idle:
            self.metrics.upstream_errors.labels("disconnect").inc()
            n = len(self.in_flight)
            self.close(f"upstream {where} closed the connection with {n} requests in flight ({exc!r})")
        else:
            self.metrics.upstream_errors.labels("idle_close").inc()
            self.close(f"upstream {where} closed the connection while idle ({exc!r})", level=logging.INFO)

    @property
    def idle(self) -> bool:
        """Nothing in flight, and no frame half through either way."""
        return not self.in_flight and self.streams.response is None and not self.streams.request_open

    # --- requests ------------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Bytes already read from the client, handed over as the socket would have read them
        (a PROXY header's tail, or what TLS decrypted before the pipeline existed). While the
        upstream connects the decoder takes nothing past the first bytes (they wait in its
        buffer, undecoded), so the rest waits here until it is up. A connection over its IP's
        connection rate is never read from (KIP-612), and what was read for it is not used."""
        if _CONNECTION_RATE in self._client_pauses:
            return
        view = memoryview(data)
        while view and not self.closed:
            if self.upstream is None and self._connect_task is not None:
                limit = self.server.cfg.max_frame_bytes
                if len(self._early) + len(view) > limit:
                    self.reject(f"over {limit} bytes sent before its upstream was up", "oversize")
                    return
                self._early += view
                return
            buffer = self.requests.get_buffer()
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            view = view[n:]
            self.client_written(n)

    def client_written(self, nbytes: int) -> None:
        """The client socket wrote ``nbytes`` into the request decoder's buffer."""
        if self.closed:
            return
        if self.upstream is None:
            # The first bytes: connect upstream, reading nothing more meanwhile; these are
            # decoded once it is up (the decoder's buffer keeps them).
            self._unread += nbytes
            if self._connect_task is None:
                self.pause_client("connecting")
                self._connect_task = self.loop.create_task(connect_upstream(self))
                if self._silent_handle is not None:
                    self._silent_handle.cancel()
                    self._silent_handle = None
            return
        try:
            frames = self.requests.written(nbytes)
        except FrameError as exc:
            self.reject(str(exc), "oversize" if isinstance(exc, FrameTooLarge) else "bad-size")
            return
        if not self.requests.mid_frame:
            self.frame_started = None
        elif self.frame_started is None or (frames and type(frames[-1]) is not Piece):
            self.frame_started = self.loop.time()  # a new frame began in these bytes
        if len(frames) == 1:
            self._take_request(frames[0])
            return
        self._take_requests(frames)

    def _take_requests(self, frames: list[Any], read: bytes | None = None) -> None:
        """The frames of one read, their writes collected into one each way. ``read``: the plain
        read they were all of, written upstream as it came when every one of them went on
        unchanged and in order, and nothing else did (a pipelining client's requests)."""
        batch: list[bytes | bytearray] = []
        # The answers the proxy makes itself to these are collected too, for one write.
        self._collect_writes(batch, [])
        try:
            for frame in frames:
                if self.closed:
                    return
                self._take_request(frame)
        finally:
            if read is not None and self._upstream_batch is batch and _frames_of(batch, frames):
                self._upstream_batch = None
                assert self.upstream is not None
                self.upstream.write(read)
            self._flush_upstream_batch()
            self._flush_client_batch()

    def client_data(self, data: bytes) -> None:
        """A read of the client's socket handed over as ``bytes`` (plain reads:
        ``proxy/net/transports.py``). The frames it holds whole are sliced straight out of it,
        and a request that was all of the read goes upstream as it came, the same object (no
        prefix made, no copy) unless a stage changed it. The bytes of a frame not whole go into
        the decoder's buffer; once a large frame begins there, the connection is read into the
        decoder's buffers for good, as TLS connections are (a large frame's bytes copied once)."""
        if self.closed:
            return
        if self.upstream is None:
            self.feed(data)  # the first bytes, or what comes while the upstream connects
            return
        frames: list[Any] = []
        try:
            taken = self.requests.take_whole(data, frames)
        except FrameError as exc:
            self.reject(str(exc), "oversize" if isinstance(exc, FrameTooLarge) else "bad-size")
            return
        if taken == len(data):
            self.frame_started = None
            if len(frames) == 1:
                frame = frames[0]
                self._read_request, self._read_request_wire = frame, data
                try:
                    self._take_request(frame)
                finally:
                    self._read_request, self._read_request_wire = None, b""
            else:
                self._take_requests(frames, data)
        else:
            if frames:
                self._take_requests(frames)
            if not self.closed:
                self.feed(memoryview(data)[taken:])
        if self.requests.large_frames and not self.closed and not self._client_into_buffers:
            self._client_into_buffers = True
            read_into_buffers(self, self.client, upstream=False)

    def _take_request(self, frame: Any) -> None:
        kind = type(frame)
        if kind is Piece:
            # A streamed frame is written as it comes: what was collected goes first, and the
            # batch ends (a Piece comes alone, a FrameHead last, in a read's frames).
            self._flush_upstream_batch()
            self.streams.request_piece(frame)
        elif kind is FrameHead:
            self._flush_upstream_batch()
            self.streams.request_head(frame)
        elif self.holding:  # a throttled connection is muted: Kafka would not have read these yet
            self.held.append(frame)
        else:
            self._request(frame)

    def _collect_writes(
        self, upstream: list[bytes | bytearray] | None, client: list[bytes | bytearray]
    ) -> None:
        """Collect the frames of a read into these, for one write each way (``upstream`` None:
        a read of responses, whose writes all go to the client). Assigned here, not
        where the read's frames are taken: mypyc would trust the type mypy narrows the attribute
        to there (a list), and a close while they are taken (it flushes: None) then raised
        ``TypeError`` where the batch is looked at again."""
        if upstream is not None:
            self._upstream_batch = upstream
        self._client_batch = client

    def _flush_upstream_batch(self) -> None:
        """Write the frames collected for the upstream and stop collecting (before anything is
        written directly, and at the end of the read)."""
        batch, self._upstream_batch = self._upstream_batch, None
        if batch and self.upstream is not None:
            write_batch(self.upstream, batch)

    def _flush_client_batch(self) -> None:
        """Write the frames collected for the client and stop collecting."""
        batch, self._client_batch = self._client_batch, None
        if batch:
            write_batch(self.client, batch)

    def _write_client(self, payload: bytes | bytearray) -> None:
        batch = self._client_batch
        if batch is None:
            if payload is self._read_response:
                self.client.write(self._read_response_wire)  # all of a plain read, as it came
            else:
                write_frame(self.client, payload)
        else:
            collect_frame(self.client, batch, payload)

    def _write_client_parts(self, head: bytes | bytearray, tail: memoryview) -> None:
        """A response changed at its start only (a Metadata answer's brokers): its size, the
        changed start and the broker's bytes after it in one writev, none of them copied."""
        batch = self._client_batch
        if batch:
            write_batch(self.client, batch)
            batch.clear()
        self.client.writelines((size_prefix(len(head) + len(tail)), head, tail))

    def _request(self, frame: bytes | bytearray) -> None:
        try:
            header = parse_request_header(frame, self._last_client_id)
        except FrameError as exc:
            self.reject(str(exc), "bad-header")
            return
        req = Request(header, frame)
        self.read_client_id(req)
        try:
            for stage in self.stages.for_request(header.api_key, header.api_version):
                if stage.on_request(req):
                    return
            expects_response = req.expects_response
        except (SchemaError, struct.error) as malformed:  # not `exc`: compiled, a name has one type
            name = api_name(header.api_key)
            self.reject(f"malformed {name} v{header.api_version} request: {malformed}", "malformed")
            return
        frame = req.frame  # a stage may have sent a changed copy on (a Fetch's max_bytes capped)
        self.forwarding(req, expects_response, len(frame) + 4)
        self.send(frame)

    def forwarding(self, req: Request, expects_response: bool, nbytes: int) -> None:
        """``req`` (``nbytes`` on the wire) goes upstream now: count it, queue its entry if a
        response comes, and apply the throttle its stages decided."""
        api_key = req.header.api_key
        if api_key == FETCH_KEY and self._plain_upstream:
            self.read_upstream_into_buffers()
        self.traffic(api_key).request(nbytes)
        self.requests_in += 1
        self.bytes_in += nbytes
        if expects_response:
            entry = self.entry_for(req, counted=False)
            if req.throttle_ms:
                # Read nothing more until the response goes out and its mute ends, as the broker
                # (which reads one request at a time per connection) would.
                self.hold_until_answered(entry)
            self._queue(entry)
            return
        # acks=0: no response to wait for
        if req.throttle_ms:
            self.mute(req.throttle_ms)
        if req.watchers:
            entry = self.entry_for(req, counted=False)
            for watcher in entry.watchers:
                watcher.on_done(entry, -1.0)

    def traffic(self, api_key: int) -> ApiTraffic:
        table = self._api_traffic
        if 0 <= api_key < len(table):
            found = table[api_key]
            if found is not None:
                return found
        found = self.metrics.traffic.api(api_key)
        if api_key >= 0:  # a header's api key is known before its traffic is counted
            table.extend([None] * (api_key + 1 - len(table)))
            table[api_key] = found
        return found

    def entry_for(self, req: Request, counted: bool = True) -> InFlight:
        """The FIFO entry of a request (not queued yet); counted in the request metrics."""
        header = req.header
        if counted:
            self.traffic(header.api_key).request(len(req.frame) + 4)
            self.requests_in += 1
            self.bytes_in += len(req.frame) + 4
        entry = InFlight(
            header.api_key,
            header.api_version,
            header.correlation_id,
            self._now(),
            None,
            req.client_id,
        )
        entry.throttle_ms = req.throttle_ms
        if req.stages or req.watchers:
            entry.stages = req.stages + req.watchers
            entry.watchers = req.watchers
        entry.charge_time = req.charge_time
        entry.exempt = req.exempt
        entry.fetch = req.fetch
        entry.capture = req.capture
        return entry

    def send(self, frame: bytes | bytearray) -> None:
        """Forward a request, or queue it until a request being streamed has gone out (nothing is
        read before the upstream connection is up, so no request waits for it)."""
        if self.streams.request_open:
            self.streams.after_request.append(frame)
        else:
            self.forward(frame)

    def forward(self, frame: bytes | bytearray) -> None:
        batch = self._upstream_batch
        assert self.upstream is not None
        if batch is None:
            if frame is self._read_request:
                self.upstream.write(self._read_request_wire)  # all of a plain read, as it came
            else:
                write_frame(self.upstream, frame)
        else:
            collect_frame(self.upstream, batch, frame)

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
        if self.streams.response is not None:
            return  # in its turn, once the response being streamed has gone out
        while self.in_flight and self.in_flight[0].local_response is not None:
            entry = self.in_flight.popleft()
            assert entry.local_response is not None
            self._write_client(entry.local_response)
            self.bytes_out += len(entry.local_response) + 4
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
        if len(frames) == 1:
            self._take_response(frames[0])
            return
        self._take_responses(frames)

    def _take_responses(self, frames: list[Any], read: bytes | None = None) -> None:
        """The frames of one read, their writes to the client collected into one; ``read`` as
        for ``_take_requests``."""
        batch: list[bytes | bytearray] = []
        self._collect_writes(None, batch)
        try:
            for frame in frames:
                if self.closed:
                    return
                self._take_response(frame)
        finally:
            if read is not None and self._client_batch is batch and _frames_of(batch, frames):
                self._client_batch = None
                self.client.write(read)
            self._flush_client_batch()

    def upstream_data(self, data: bytes) -> None:
        """A read of the upstream socket handed over as ``bytes`` (plain reads), as
        ``client_data``: a response that was all of the read goes to the client as it came,
        unless a stage changed it. A response streamed from the bytes past the whole frames is
        not spliced (some of its bytes were read already), and the connection is then read into
        the decoder's buffers for good."""
        if self.closed:
            return
        frames: list[Any] = []
        try:
            taken = self.responses.take_whole(data, frames)
        except FrameError as exc:
            self.metrics.upstream_errors.labels("bad-frame").inc()
            self.close(f"upstream sent a bad frame: {exc}")
            return
        if taken == len(data) and len(frames) == 1:
            frame = frames[0]
            self._read_response, self._read_response_wire = frame, data
            try:
                self._take_response(frame)
            finally:
                self._read_response, self._read_response_wire = None, b""
        elif taken == len(data):
            self._take_responses(frames, data)
        else:
            if frames:
                self._take_responses(frames)
            if not self.closed:
                self._feed_responses(memoryview(data)[taken:])
        if self.responses.large_frames and not self.closed:
            self.read_upstream_into_buffers()

    def _feed_responses(self, view: memoryview) -> None:
        """Bytes of a plain read past its whole frames, into the response decoder's buffer."""
        self.feeding_responses = True
        try:
            while view and not self.closed:
                buffer = self.responses.get_buffer()
                n = min(len(buffer), len(view))
                buffer[:n] = view[:n]
                view = view[n:]
                self.upstream_written(n)
        finally:
            self.feeding_responses = False

    def read_upstream_into_buffers(self) -> None:
        """The upstream socket is read into the response decoder's buffers from now on: large
        responses come (or a Fetch went up: its answer may be spliced from its first byte)."""
        if self._plain_upstream and self.upstream is not None:
            self._plain_upstream = False
            read_into_buffers(self, self.upstream, upstream=True)

    def _take_response(self, frame: Any) -> None:
        kind = type(frame)
        if kind is Piece:
            self._flush_client_batch()  # as for requests (_take_request)
            self.streams.response_piece(frame)
        elif kind is FrameHead:
            self._flush_client_batch()
            self.streams.response_head(frame)
        else:
            self._response(frame)

    def sent(self, entry: InFlight) -> None:
        """``entry``'s response went out: its mute begins, reads may go on, local answers follow."""
        if entry.throttle_ms:
            self.mute(entry.throttle_ms)
        self._answered(entry)
        self.flush_local()
        if self._shutdown.draining and self.idle:
            self.close("drained for shutdown", level=logging.INFO)

    def _response(self, frame: bytes | bytearray) -> None:
        if not self.in_flight or len(frame) < 4:
            self.metrics.upstream_errors.labels("unexpected-response").inc()
            self.close("upstream sent a response nobody asked for")
            return
        entry = self._dequeue()
        # An int32, as the size prefix is; read natively, compiled, from bytes (the decoder's frames).
        correlation_id: int = (
            int32_at(frame, 0) if isinstance(frame, bytes) else unpack_size_from(frame, 0)[0]
        )
        if correlation_id != entry.correlation_id:
            self.metrics.upstream_errors.labels("correlation").inc()
            self.close(f"response correlation id {correlation_id} != expected {entry.correlation_id}")
            return
        now = self._now()
        # The broker works on one request of a connection at a time: a pipelined request's time
        # starts when the one before it was answered.
        entry.busy = now - max(entry.sent_at, self.last_response_at)
        self.last_response_at = now
        tail: memoryview | None = None
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
            tail = resp.tail
        size = len(frame) if tail is None else len(frame) + len(tail)
        upstream = now - entry.sent_at
        self.traffic(entry.api_key).response(size + 4, upstream)
        self.bytes_out += size + 4
        for watcher in entry.watchers:
            watcher.on_done(entry, upstream * 1000)
        if tail is None:
            self._write_client(frame)
        else:
            self._write_client_parts(frame, tail)
        self.sent(entry)
