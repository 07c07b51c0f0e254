"""One pipeline per client connection: client socket <-> proxy <-> its own upstream broker socket.

Requests are forwarded as they arrive; responses come back in request order (Kafka guarantees
it per connection), so a FIFO of in-flight (api key, version, correlation id) tells how to read
each response. Frames the proxy does not change go through byte for byte. Reads on either side
pause while the other side's write buffer is full, so memory stays bounded per connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from protocol import messages
from protocol.api_keys import ApiKey, api_name
from protocol.errors import ErrorCode
from protocol.frames import (
    SIZE,
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    RequestHeader,
    encode_response_header,
    parse_request_header,
    response_header_size,
)
from protocol.mutations import MUTATION_APIS
from protocol.sasl import SaslTracker
from protocol.schema import SchemaError
from protocol.versions import DECODED_APIS, NODE_ENDPOINTS_FROM, codec_versions
from proxy import admission
from proxy.admission import MutationState
from proxy.capture_rows import CaptureDraft
from proxy.quota_api import (
    AUTHORIZATION_FAILED,
    QuotaAlterBoth,
    alter_response,
    alterations_of,
    components_of,
    describe_response,
    principal_of,
    refused_alter_response,
)
from proxy.ratelog import RateLimitedLog
from proxy.throttling import (
    FetchRequestInfo,
    ProduceCharge,
    cap_fetch_max_bytes,
    fetch_request_info,
    throttled_fetch_response,
)
from proxy.tls import server_name
from quota.keys import ANONYMOUS
from quota.principal_mapping import BadCertificate, NoMatchingRule
from quota.volume import VolumeState

if TYPE_CHECKING:
    from proxy.server import Listener, ProxyServer

log = logging.getLogger(__name__)
pause_log = RateLimitedLog(log)
_ids = itertools.count(1)

# Per-direction write buffer: large enough that a multi-hundred-KiB Produce or Fetch frame does not
# pause the other side on every frame, small enough to bound memory per connection.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024

# While a client's reads are paused the event loop cannot see it leave (EOF is only read with the
# data); its socket's TCP state is looked at this often instead, so a client that gave up on a hung
# upstream does not pin its pipeline and both sockets forever.
PAUSED_PEER_CHECK_SECONDS = 1.0
# A closed side's unsent bytes get this long to drain (a peer that reads nothing never takes
# them, and its socket would stay open for good); then the connection is reset.
CLOSE_FLUSH_SECONDS = 5.0
_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_PEER_GONE_STATES = frozenset({7, 8, 9})  # TCP_CLOSE (reset), TCP_CLOSE_WAIT (FIN), TCP_LAST_ACK

_THROTTLE = "throttle"  # muted for a throttle time
_THROTTLE_PENDING = "throttle-pending"  # a throttled request's response has not gone out yet
_ADMISSION = "admission"  # a mutation request is being priced: later requests wait behind it
_VOLUME_PAUSE = "volume-pause"  # a produce is parked while the cluster's volumes are paused
_QUOTA_API = "quota-api"  # a client-quota request is being answered: later requests wait behind it
_BYTE_RATE_APIS = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
_HOLD_REASONS = frozenset({_THROTTLE, _THROTTLE_PENDING, _ADMISSION, _VOLUME_PAUSE, _QUOTA_API})
_QUOTA_API_KEYS = frozenset({ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS})
PAUSED_MESSAGE = "kthrottle: cluster volume usage is at its hard limit (PAUSE); retry later"

# Responses decoded for the capture record when capture is on: a fetch's partitions are what a
# fetch quota charges. Other responses (Produce among them: decoding each one would cost more than
# the rest of the capture) give their errors and broker throttle only when decoded anyway.
_CAPTURE_DECODES = frozenset({ApiKey.FETCH})

# Requests the broker parks by design (a group waiting for its members): their time is waiting,
# not work, so request_percentage does not count it.
_PARKED_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})

# Responses that may carry broker addresses or capabilities the proxy must change.
_REWRITE_ALWAYS = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER}
)


@dataclass(slots=True)
class InFlight:
    api_key: int
    api_version: int
    correlation_id: int
    sent_at: float
    local_response: bytes | None = None  # answered by the proxy itself, sent in its turn
    client_id: str = ""
    throttle_ms: int = 0  # the proxy's throttle for this request, decided when it was read
    fetch: FetchRequestInfo | None = None  # set when the fetch quota needs the response
    mutation: MutationState | None = None  # set when the mutation quota needs the response
    charge_time: bool = False  # its upstream time counts against request_percentage
    holds_reads: bool = False  # a throttled produce: reads stay paused until its response
    busy: float = 0.0  # seconds the broker spent on it, as far as the proxy can tell
    capture: CaptureDraft | None = None  # what the capture record needs, while capture is on
    quota_alter: QuotaAlterBoth | None = None  # quota_api.mode both: the proxy's part of an alter


def peer_has_closed(transport: asyncio.BaseTransport) -> bool:
    """True when the peer of a TCP transport has sent its FIN or a reset, read or not (Linux's
    TCP_INFO; False where the state cannot be read)."""
    sock = transport.get_extra_info("socket")
    if _TCP_INFO is None or sock is None:
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 8)[0]
    except (OSError, ValueError, TypeError):
        return False
    return state in _PEER_GONE_STATES


def close_bounded(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
    """Close a transport, flushing what it still buffers for at most CLOSE_FLUSH_SECONDS."""
    transport.close()
    if transport.get_write_buffer_size():
        loop.call_later(CLOSE_FLUSH_SECONDS, transport.abort)


class _ClientProtocol(asyncio.BufferedProtocol):
    def __init__(self, server: ProxyServer, listener: Listener) -> None:
        self.server = server
        self.listener = listener
        self.pipeline: Pipeline | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.pipeline = Pipeline(self.server, self.listener, cast(asyncio.Transport, transport))

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self.pipeline is not None
        return self.pipeline.requests.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        assert self.pipeline is not None
        self.pipeline.client_written(nbytes)

    def eof_received(self) -> bool | None:
        return None  # close our side too; the upstream is closed in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pipeline is not None:
            self.pipeline.client_lost(exc)

    def pause_writing(self) -> None:
        if self.pipeline is not None:
            self.pipeline.pause_upstream("client-backpressure")

    def resume_writing(self) -> None:
        if self.pipeline is not None:
            self.pipeline.resume_upstream("client-backpressure")


class _UpstreamProtocol(asyncio.BufferedProtocol):
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pipeline.responses.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.pipeline.upstream_written(nbytes)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipeline.upstream_lost(exc)

    def pause_writing(self) -> None:
        self.pipeline.pause_client("upstream-backpressure")

    def resume_writing(self) -> None:
        self.pipeline.resume_client("upstream-backpressure")


class Pipeline:
    """State of one client connection and its upstream connection."""

    def __init__(self, server: ProxyServer, listener: Listener, client: asyncio.Transport) -> None:
        self.id = next(_ids)
        self.server = server
        self.listener = listener
        self.client = client
        client.set_write_buffer_limits(WRITE_BUFFER_HIGH, WRITE_BUFFER_LOW)
        self.upstream: asyncio.Transport | None = None
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
        self._pending_throttles = 0  # throttled produce requests whose response is still to come
        # A parked produce of this connection waited max_park_ms in vain: while PAUSE lasts, the
        # produce requests read after it are answered at once (each waiting a full park in turn
        # would take them past the client's request timeout).
        self._park_timed_out = False
        self._last_response_at = 0.0
        # Loop time the current incomplete request frame began arriving (reading time only: a
        # pause restarts it), or None between frames: the slowloris deadline.
        self.frame_started: float | None = None
        self.held: deque[bytearray] = deque()  # requests read while the connection was muted
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop = asyncio.get_running_loop()
        self.metrics = server.metrics
        server.pipeline_opened(self)
        self._connect_task: asyncio.Task[None] | None = None
        if not self._tls_identity(client.get_extra_info("ssl_object")):
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

    def _tls_identity(self, ssl_object: Any) -> bool:
        """Take the principal from the client certificate and, with SNI routing, the broker from
        the server name; False when the connection is refused (and closed) for either."""
        tls = self.server.tls
        if tls is None or ssl_object is None:
            return True
        tls.completed(ssl_object)
        try:
            self.user = tls.principal(ssl_object)
        except (NoMatchingRule, BadCertificate) as exc:
            self.reject(f"TLS client certificate: {exc}", "tls-principal")
            return False
        gateway = self.server.cfg.gateway
        if gateway is None or not gateway.sni.enabled or self.listener.node_id is not None:
            return True
        name = server_name(ssl_object)
        if name is None or name.lower().rstrip(".") == gateway.sni.bootstrap_host.lower():
            return True  # bootstrap (so is a client that sends no name, e.g. one using an address)
        node = gateway.sni.broker_node(name)
        if node is None:
            self.reject(
                f"TLS server name {name!r} names neither the bootstrap nor a broker", "tls-server-name"
            )
            return False
        self.node_id = node
        return True

    # --- lifecycle -----------------------------------------------------------------------------

    async def _connect(self) -> None:
        targets = self.server.brokers.upstream_for(self.node_id)
        if not targets:
            self.close(f"no known address for broker node {self.node_id}")
            return
        last: BaseException | None = None
        for host, port in targets:
            tls = self.server.upstream_ssl()
            try:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_connection(
                        lambda: _UpstreamProtocol(self),
                        host,
                        port,
                        ssl=tls,
                        server_hostname=host if tls else None,
                    ),
                    self.server.cfg.connect_timeout_seconds,
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
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self._mute_handle is not None:
            self._mute_handle.cancel()
        if self._watch_handle is not None:
            self._watch_handle.cancel()
        for task in self._tasks:
            task.cancel()
        for entry in self.in_flight:  # fetches that will never be answered give back their share
            if entry.fetch is not None and entry.fetch.grant is not None:
                self.server.enforcer.release_fetch(entry.fetch.grant)
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
        if not self.closed:
            where = getattr(self, "upstream_addr", "?")
            if self.in_flight:
                self.metrics.upstream_errors.labels("disconnect").inc()
                self.close(
                    f"upstream {where} closed the connection with {len(self.in_flight)} requests "
                    f"in flight ({exc!r})"
                )
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
                self._watch_handle = self.loop.call_later(PAUSED_PEER_CHECK_SECONDS, self._watch_client)
        self._client_pauses.add(reason)

    def _watch_client(self) -> None:
        """While reads are paused, close the connection once the client has left."""
        self._watch_handle = None
        if self.closed or not self._client_pauses:
            return
        if peer_has_closed(self.client):
            paused = ", ".join(sorted(self._client_pauses))
            self.close(f"client left while its reads were paused ({paused})", level=logging.INFO)
            return
        self._watch_handle = self.loop.call_later(PAUSED_PEER_CHECK_SECONDS, self._watch_client)

    def resume_client(self, reason: str) -> None:
        self._client_pauses.discard(reason)
        if self._client_pauses or self.closed:
            return
        if self.held:
            # Requests read while held go first; one of them may hold the connection again, and
            # then nothing newer may be read before it.
            self._release_held()
            return
        self.client.resume_reading()
        if self.frame_started is not None:
            self.frame_started = self.loop.time()  # the pause was ours, not the client's

    def frame_overdue(self, now: float, timeout: float) -> bool:
        """True when a request frame has been arriving for longer than ``timeout`` seconds of
        reading time (paused connections are never overdue: we are the ones not reading)."""
        return (
            self.frame_started is not None
            and not self._client_pauses
            and not self.closed
            and now - self.frame_started > timeout
        )

    def pause_upstream(self, reason: str) -> None:
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.pause_reading()
        self._upstream_pauses.add(reason)

    def resume_upstream(self, reason: str) -> None:
        self._upstream_pauses.discard(reason)
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.resume_reading()

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
            if self._holding:
                # A throttled connection is muted: Kafka would not have read these yet.
                self.held.append(frame)
            else:
                self._request(frame)

    def _request(self, frame: bytearray) -> None:
        try:
            header = parse_request_header(frame)
        except FrameError as exc:
            self.reject(str(exc), "bad-header")
            return
        key, version = header.api_key, header.api_version
        expects_response = True
        if key in DECODED_APIS:
            known = codec_versions(key)
            if known is None or not known[0] <= version <= known[1]:
                if key == ApiKey.API_VERSIONS:
                    self._answer_locally(header, messages.unsupported_api_versions_response())
                    return
                self.reject(
                    f"{api_name(key)} v{version} is not supported by the proxy", "unsupported-version"
                )
                return
        quota_api = self.server.quota_api
        if (
            key in _QUOTA_API_KEYS
            and quota_api is not None
            and (key == ApiKey.ALTER_CLIENT_QUOTAS or quota_api.mode == "proxy")
            and self._authenticated_as_the_broker_wants
        ):
            self._quota_api_request(frame, header)
            return
        throttle_ms = 0
        holds_reads = False
        acks: int | None = None
        draft: CaptureDraft | None = None
        fetch: FetchRequestInfo | None = None
        client_id = header.client_id or ""
        enforcer = self.server.enforcer
        if key in _BYTE_RATE_APIS:
            wait = enforcer.hold_ms(key == ApiKey.PRODUCE, self.user, client_id)
            if wait:
                # Another connection of this client is being throttled: this one waits too,
                # before its request is read, as the throttled connection does.
                self.metrics.entity_holds.labels(api_name(key) or str(key)).inc()
                self.held.appendleft(frame)
                self.mute(wait)
                return
        if key == ApiKey.PRODUCE and not self._produce_decoded():
            # Nothing charges or records it: its acks alone say whether a response comes.
            try:
                acks = messages.read_produce_acks(version, memoryview(frame)[header.size :])
            except (SchemaError, struct.error) as exc:
                self.reject(f"malformed Produce v{version} request: {exc}", "malformed")
                return
            expects_response = acks != 0
        elif key == ApiKey.PRODUCE:
            try:
                body = messages.decode_request(key, version, memoryview(frame)[header.size :])
            except SchemaError as exc:
                self.reject(f"malformed Produce v{version} request: {exc}", "malformed")
                return
            acks = messages.produce_acks(body)
            expects_response = acks != 0
            # Kafka charges header + body and appends first: the throttle comes after.
            charge = enforcer.on_produce(self.user, client_id, len(frame), body)
            decided = charge.throttle_ms
            volume = self.server.volume
            if volume is not None:
                verdict = volume.verdict()
                if verdict.state is VolumeState.PAUSE and not enforcer.dry_run:
                    self._park(frame, header, body, expects_response, charge)
                    return
                self._park_timed_out = False
                decided = max(decided, verdict.delay_ms)
            throttle_ms = 0 if enforcer.dry_run else decided
            if self.server.capture is not None:
                draft = CaptureDraft.of(header, len(frame))
                draft.on_produce(charge.partitions, charge.new_producer_ids, decided)
            if throttle_ms:
                if expects_response:
                    # Read nothing more until the response goes out and its mute ends, as the
                    # broker (which reads one request at a time per connection) would.
                    holds_reads = True
                else:
                    self.mute(throttle_ms)
        elif key in (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
            try:
                sasl = messages.decode_request(key, version, memoryview(frame)[header.size :])
            except SchemaError as exc:
                self.reject(f"malformed {api_name(key)} v{version} request: {exc}", "malformed")
                return
            if key == ApiKey.SASL_HANDSHAKE:
                self.sasl.on_handshake(str(sasl.get("mechanism", "")))
            else:
                self.sasl.on_authenticate_request(bytes(sasl.get("auth_bytes") or b""))
        elif key in MUTATION_APIS and (
            self.server.capture is not None or enforcer.mutation_quota_applies(self.user, client_id)
        ):
            try:
                body = messages.decode_request(key, version, memoryview(frame)[header.size :])
            except SchemaError as exc:
                self.reject(f"malformed {api_name(key)} v{version} request: {exc}", "malformed")
                return
            state = admission.parse(key, version, body, self.server.cfg.quotas.mutations.charge_validate_only)
            if state is not None:
                self._admit(frame, header, body, state)
                return
        elif key == ApiKey.FETCH and (enforcer.fetch.active or enforcer.request_time.active):
            try:
                fetch = self._prepare_fetch(frame, header, client_id)
            except SchemaError as exc:
                self.reject(f"malformed Fetch v{version} request: {exc}", "malformed")
                return
        req_counter, bytes_counter, _resp, _lat = self.metrics.api(key)
        req_counter.inc()
        bytes_counter.inc(len(frame) + 4)
        if expects_response:
            entry = InFlight(
                key, version, header.correlation_id, self.loop.time(), None, client_id, throttle_ms, fetch
            )
            if holds_reads:
                self._hold_until_answered(entry)
            entry.charge_time = key not in _PARKED_APIS and enforcer.request_time_charged(key, acks)
            if self.server.capture is not None:
                entry.capture = draft if draft is not None else CaptureDraft.of(header, len(frame))
            self.in_flight.append(entry)
        elif draft is not None:  # acks=0: no response to wait for
            self._emit(draft, key, version, client_id, throttle_ms, upstream_ms=-1.0)
        self._send(frame)

    def _produce_decoded(self) -> bool:
        """Whether a Produce request must be decoded: a byte-rate or producer-id quota charges it,
        the volume limits may park it, or capture records it."""
        server = self.server
        enforcer = server.enforcer
        return (
            enforcer.produce.active
            or enforcer.producer_ids.active
            or server.volume is not None
            or server.capture is not None
        )

    def _admit(
        self, frame: bytearray, header: RequestHeader, body: dict[str, Any], state: MutationState
    ) -> None:
        """Price and admit a mutation request; later requests wait until it is forwarded or answered."""
        entry = self._held_entry(header, frame)
        entry.mutation = state
        entry.charge_time = self.server.enforcer.request_time_charged(header.api_key)
        self.in_flight.append(entry)
        self.pause_client(_ADMISSION)
        self._spawn(self._admission(entry, frame, header, body, state))

    async def _admission(
        self,
        entry: InFlight,
        frame: bytearray,
        header: RequestHeader,
        body: dict[str, Any],
        state: MutationState,
    ) -> None:
        try:
            state.costs = await admission.resolve_costs(state, self.server.catalog)
            if self.closed:
                return
            decided = self.server.enforcer.on_mutation(self.user, entry.client_id, state, self.peer)
            entry.throttle_ms = state.throttle_ms
            if entry.throttle_ms:
                # As the broker: nothing more is read on this connection until the throttled
                # answer has gone out and its mute has passed.
                self._hold_until_answered(entry)
            if entry.capture is not None:
                entry.capture.on_mutation(state.costs, state.accepted, decided)
            if not any(state.accepted):
                entry.local_response = self._encoded_answer(header, admission.local_response(state))
                self._flush_local()
            else:
                rewritten = admission.upstream_request(state, body)
                if rewritten is not None:
                    frame = bytearray(frame[: header.size]) + admission.encode_request(state, rewritten)
                self._send(frame)
        except Exception:  # a bug here must not leave the connection held forever
            log.exception("conn %d: mutation admission failed", self.id)
            self.close("mutation admission failed")
            return
        self._client_pauses.discard(_ADMISSION)
        self._release_held()

    @property
    def _authenticated_as_the_broker_wants(self) -> bool:
        """False while a SASL exchange is under way, or before any on a listener that requires
        SASL (the proxy logs in upstream itself then): such a client's quota requests go to the
        broker, which refuses them as it refuses any request before authentication."""
        if self.sasl.in_progress:
            return False
        return self.server.cfg.upstream_sasl is None or self.sasl.authenticated is not None

    def _quota_api_request(self, frame: bytearray, header: RequestHeader) -> None:
        """KIP-546: answer DescribeClientQuotas/AlterClientQuotas in the proxy (and, mode both,
        forward an alteration too); later requests wait, so responses stay in order."""
        key, version = header.api_key, header.api_version
        try:
            body = messages.decode_request(key, version, memoryview(frame)[header.size :])
        except SchemaError as exc:
            self.reject(f"malformed {api_name(key)} v{version} request: {exc}", "malformed")
            return
        entry = self._held_entry(header, frame)
        self.in_flight.append(entry)
        self.pause_client(_QUOTA_API)
        self._spawn(self._quota_api(entry, frame, header, body))

    async def _quota_api(
        self, entry: InFlight, frame: bytearray, header: RequestHeader, body: dict[str, Any]
    ) -> None:
        service = self.server.quota_api
        assert service is not None
        principal = principal_of(self.user)
        try:
            if header.api_key == ApiKey.DESCRIBE_CLIENT_QUOTAS:
                if not service.may_describe(principal):
                    answer = describe_response(AUTHORIZATION_FAILED)
                else:
                    found = service.describe(components_of(body), bool(body.get("strict")))
                    answer = describe_response(found)
            elif not service.may_alter(principal):
                log.info("conn %d: %s may not alter client quotas (quota_api.admins)", self.id, principal)
                service.metrics.alterations.labels("kafka", AUTHORIZATION_FAILED.name).inc()
                answer = refused_alter_response(body, AUTHORIZATION_FAILED)
            elif service.mode == "both":
                # Validated here, forwarded as sent; stored once the broker's answer is in.
                entry.quota_alter = QuotaAlterBoth(await service.validate(alterations_of(body)), body)
                self._send(frame)
                return  # the hold ends in _quota_alter_answered
            else:
                result = await service.alter(
                    alterations_of(body), bool(body.get("validate_only")), who=f"{principal} ({self.peer})"
                )
                answer = alter_response(result.results)
            if self.closed:
                return
            entry.local_response = self._encoded_answer(header, answer)
            self._flush_local()
        except Exception:  # a bug here must not leave the connection held forever
            log.exception("conn %d: client-quota request failed", self.id)
            self.close("client-quota request failed")
            return
        self._client_pauses.discard(_QUOTA_API)
        self._release_held()

    def _quota_alter_answered(self, entry: InFlight, frame: bytearray) -> None:
        """Mode both: the broker answered an alteration; the entry goes back to the head of the
        FIFO (nothing was forwarded after it) until the proxy has stored its part."""
        self.in_flight.appendleft(entry)
        self._spawn(self._quota_alter_both(entry, frame))

    async def _quota_alter_both(self, entry: InFlight, frame: bytearray) -> None:
        service = self.server.quota_api
        state = entry.quota_alter
        assert service is not None and state is not None
        try:
            key, version = entry.api_key, entry.api_version
            hsize = response_header_size(key, version, frame)
            broker = messages.decode_response(key, version, memoryview(frame)[hsize:])
            answer = await state.complete(service, broker)
            if self.closed:
                return
            out = bytearray(frame[:hsize])
            out += messages.encode_response(key, version, answer)
            entry.local_response = bytes(out)
            self._flush_local()
        except Exception:
            log.exception("conn %d: client-quota alteration (mode both) failed", self.id)
            self.close("client-quota alteration failed")
            return
        self._client_pauses.discard(_QUOTA_API)
        self._release_held()

    def _park(
        self,
        frame: bytearray,
        header: RequestHeader,
        body: dict[str, Any],
        expects_response: bool,
        charge: ProduceCharge,
    ) -> None:
        """PAUSE: hold a produce request, unforwarded, until the volumes allow it; later requests
        on the connection wait behind it (responses stay in order). Past the memory bound or
        ``max_park_ms`` it is answered with a retriable error, never written."""
        volume = self.server.volume
        assert volume is not None
        held = self._held_entry(header, frame)
        if held.capture is not None:
            held.capture.on_produce(charge.partitions, charge.new_producer_ids, 0)
        entry: InFlight | None = None  # acks=0: nothing to answer
        if expects_response:
            entry = held
            self.in_flight.append(entry)
        if self._park_timed_out:
            volume.metrics.parked.labels("retriable" if entry else "dropped").inc()
            self._paused_answer(entry, header, body, "an earlier request waited its park out", mute=False)
            return
        if not volume.park(len(frame)):
            volume.metrics.parked.labels("retriable" if entry else "dropped").inc()
            self._paused_answer(entry, header, body, "the proxy's memory for parked requests is full")
            return
        self.pause_client(_VOLUME_PAUSE)
        outcome = ["closed"]  # set by _parked; the bytes are released however the task ends
        task = self._spawn(self._parked(entry, frame, header, body, charge.throttle_ms, outcome))
        task.add_done_callback(lambda _t: volume.unpark(len(frame), outcome[0]))

    def _held_entry(self, header: RequestHeader, frame: bytearray) -> InFlight:
        """Count a request the proxy holds before forwarding (or answers itself); its FIFO entry."""
        req_counter, bytes_counter, _resp, _lat = self.metrics.api(header.api_key)
        req_counter.inc()
        bytes_counter.inc(len(frame) + 4)
        entry = InFlight(
            header.api_key,
            header.api_version,
            header.correlation_id,
            self.loop.time(),
            None,
            header.client_id or "",
        )
        if self.server.capture is not None:
            entry.capture = CaptureDraft.of(header, len(frame))
        return entry

    async def _parked(
        self,
        entry: InFlight | None,
        frame: bytearray,
        header: RequestHeader,
        body: dict[str, Any],
        quota_throttle_ms: int,
        outcome: list[str],
    ) -> None:
        volume = self.server.volume
        assert volume is not None
        try:
            resumed = await volume.wait_unpaused(volume.vcfg.max_park_ms / 1000.0)
            if self.closed:
                return  # never forwarded: the client retries it on a new connection
            if resumed:
                outcome[0] = "forwarded"
                # Throttled as any produce now: its byte-rate charge, and the volumes' delay.
                throttle_ms = max(quota_throttle_ms, volume.verdict().delay_ms)
                if entry is not None:
                    entry.sent_at = self.loop.time()
                    if throttle_ms:
                        entry.throttle_ms = throttle_ms
                        self._hold_until_answered(entry)
                elif throttle_ms:
                    self.mute(throttle_ms)
                self._send(frame)
            else:
                outcome[0] = "retriable" if entry is not None else "dropped"
                self._park_timed_out = True
                self._paused_answer(entry, header, body, f"parked {volume.vcfg.max_park_ms} ms")
        except Exception:  # a bug here must not leave the connection held forever
            log.exception("conn %d: parked produce failed", self.id)
            self.close("parked produce failed")
            return
        self._client_pauses.discard(_VOLUME_PAUSE)
        self._release_held()

    def _paused_answer(
        self, entry: InFlight | None, header: RequestHeader, body: dict[str, Any], why: str, mute: bool = True
    ) -> None:
        """Answer a produce the proxy did not forward: retriable NOT_ENOUGH_REPLICAS for every
        partition and a throttle time, so the client backs off and retries; acks=0 gets nothing."""
        volume = self.server.volume
        assert volume is not None
        throttle_ms = volume.vcfg.max_throttle_delay_ms
        pause_log.log(
            logging.WARNING,
            "volume-paused",
            "conn %d (%s, %s): produce not forwarded, volumes paused (%s)",
            self.id,
            self.user,
            header.client_id,
            why,
        )
        if entry is None:
            return
        answer = messages.produce_error_response(
            body, ErrorCode.NOT_ENOUGH_REPLICAS, PAUSED_MESSAGE, throttle_ms
        )
        entry.local_response = self._encoded_answer(header, answer)
        entry.throttle_ms = throttle_ms if mute else 0  # the answer carries it either way
        self._flush_local()

    def _emit(
        self,
        draft: CaptureDraft,
        key: int,
        version: int,
        client_id: str,
        throttle_ms: int,
        upstream_ms: float,
        waited: bool = False,
    ) -> None:
        """Hand one finished capture record to the writer (it never blocks). A record with topics
        still named by id waits once for the lookup under way, so the capture shows names."""
        capture = self.server.capture
        if capture is None:
            return
        if draft.unnamed():
            lookup = self.server.topic_lookup
            if lookup.running and not waited:
                args = (draft, key, version, client_id, throttle_ms, upstream_ms, True)
                lookup.after(lambda: self._emit(*args))
                return
            self.server.topic_names.rename(draft.parts)  # what is left keeps its id (counted)
        capture.record(
            draft.row(
                capture.instance,
                self.node_id,
                self.id,
                self.peer,
                self.user,
                client_id,
                key,
                version,
                throttle_ms,
                upstream_ms,
                self.server.enforcer.dry_run,
            )
        )

    def _prepare_fetch(self, frame: bytearray, header: RequestHeader, client_id: str) -> FetchRequestInfo:
        """Note the fetch session (for a throttled answer) and cap max_bytes as Kafka does."""
        version = header.api_version
        body = messages.decode_request(ApiKey.FETCH, version, memoryview(frame)[header.size :])
        requested = int(body["max_bytes"]) if version >= 3 and "max_bytes" in body else None
        grant = self.server.enforcer.fetch_grant(self.user, client_id, requested)
        cap = grant.allowed if grant is not None else None
        if cap is not None:
            cap_fetch_max_bytes(version, frame, header.size, cap)
        info = fetch_request_info(version, body)
        info.grant = grant
        return info

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

    def _release_held(self) -> None:
        """Requests read while held go first, in order; one of them may hold the connection again."""
        while self.held and not self._holding and not self.closed:
            self._request(self.held.popleft())
        if not self._client_pauses and not self.closed:
            self.client.resume_reading()
            if self.frame_started is not None:
                self.frame_started = self.loop.time()

    @property
    def _holding(self) -> bool:
        return bool(self._client_pauses & _HOLD_REASONS)

    def _send(self, frame: bytes | bytearray) -> None:
        """Forward a request, or queue it until the upstream connection is up."""
        if self.upstream is None:
            self.pending.append(frame)
        else:
            self._forward(frame)

    def _forward(self, frame: bytes | bytearray) -> None:
        assert self.upstream is not None
        self.upstream.writelines((SIZE.pack(len(frame)), frame))

    @staticmethod
    def _encoded_answer(header: RequestHeader, body: dict[str, Any]) -> bytes:
        """The proxy's own response to a request: its header, then ``body``."""
        payload = encode_response_header(header.api_key, header.api_version, header.correlation_id)
        payload += messages.encode_response(header.api_key, header.api_version, body)
        return bytes(payload)

    def _answer_locally(self, header: RequestHeader, body: dict[str, Any]) -> None:
        entry = InFlight(
            header.api_key,
            header.api_version,
            header.correlation_id,
            self.loop.time(),
            self._encoded_answer(header, body),
        )
        self.in_flight.append(entry)
        self._flush_local()

    def _hold_until_answered(self, entry: InFlight) -> None:
        """Read nothing more until ``entry``'s response has gone out (its mute follows)."""
        entry.holds_reads = True
        self._pending_throttles += 1
        self.pause_client(_THROTTLE_PENDING)

    def _answered(self, entry: InFlight) -> None:
        """``entry``'s response went out (and its mute, if any, began): reads may go on."""
        if entry.holds_reads:
            entry.holds_reads = False
            self._pending_throttles -= 1
            if not self._pending_throttles:
                self.resume_client(_THROTTLE_PENDING)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of this connection: cancelled when it closes."""
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _flush_local(self) -> None:
        while self.in_flight and self.in_flight[0].local_response is not None:
            entry = self.in_flight.popleft()
            assert entry.local_response is not None
            self.client.writelines((SIZE.pack(len(entry.local_response)), entry.local_response))
            if entry.throttle_ms:
                self.mute(entry.throttle_ms)
            self._answered(entry)
            if entry.capture is not None:
                self._emit(
                    entry.capture, entry.api_key, entry.api_version, entry.client_id, entry.throttle_ms, -1.0
                )

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
        key = entry.api_key
        if entry.quota_alter is not None:
            self._quota_alter_answered(entry, frame)
            return
        if key == ApiKey.SASL_AUTHENTICATE:
            self._sasl_result(entry, frame)
        if entry.capture is not None:
            entry.capture.response_bytes = len(frame)
        now = self.loop.time()
        # The broker works on one request of a connection at a time: a pipelined request's time
        # starts when the one before it was answered.
        entry.busy = now - max(entry.sent_at, self._last_response_at)
        self._last_response_at = now
        if key == ApiKey.INIT_PRODUCER_ID:
            pid_ms = self.server.enforcer.on_init_producer_id(self.user, entry.client_id)
            entry.throttle_ms = max(entry.throttle_ms, pid_ms)
        if entry.charge_time and entry.fetch is None:  # a fetch is charged once its response is read
            enforcer = self.server.enforcer
            time_ms = enforcer.on_request_time(self.user, entry.client_id, key, entry.busy)
            if time_ms and not enforcer.dry_run:
                entry.throttle_ms = max(entry.throttle_ms, time_ms)
        addresses = key in _REWRITE_ALWAYS or (
            key in NODE_ENDPOINTS_FROM and entry.api_version >= NODE_ENDPOINTS_FROM[key]
        )
        captured = entry.capture is not None and key in _CAPTURE_DECODES
        if (
            addresses
            or entry.fetch is not None
            or entry.mutation is not None
            or entry.throttle_ms
            or captured
        ):
            try:
                frame = self._rewrite(entry, frame, addresses)
            except (SchemaError, FrameError, LookupError) as exc:
                self.metrics.upstream_errors.labels("undecodable-response").inc()
                self.close(f"cannot rewrite {api_name(key)} v{entry.api_version} response: {exc}")
                return
        _req, _bytes, resp_counter, latency = self.metrics.api(key)
        resp_counter.inc(len(frame) + 4)
        upstream = now - entry.sent_at
        latency.observe(upstream)
        if entry.capture is not None:
            self._emit(
                entry.capture, key, entry.api_version, entry.client_id, entry.throttle_ms, upstream * 1000
            )
        self.client.writelines((SIZE.pack(len(frame)), frame))
        if entry.throttle_ms:
            self.mute(entry.throttle_ms)
        self._answered(entry)
        self._flush_local()
        if self.server.draining and not self.in_flight:
            self.close("drained for shutdown", level=logging.INFO)

    def _sasl_result(self, entry: InFlight, frame: bytearray) -> None:
        """Take the claimed user as this connection's principal once the broker accepts it."""
        try:
            hsize = response_header_size(entry.api_key, entry.api_version, frame)
            body = messages.decode_response(entry.api_key, entry.api_version, memoryview(frame)[hsize:])
        except (SchemaError, FrameError) as exc:
            log.warning("conn %d: unreadable SaslAuthenticate response: %s", self.id, exc)
            return
        principal = self.sasl.on_authenticate_response(int(body.get("error_code", -1)))
        if principal is not None:
            self.user = principal
            log.debug("conn %d from %s authenticated as %s", self.id, self.peer, principal)

    def _rewrite(self, entry: InFlight, frame: bytearray, addresses: bool) -> bytearray:
        """Apply quotas and address rewriting to a response; re-encode only if something changed.

        A throttle is patched into throttle_time_ms in place; a throttled fetch is replaced by an
        empty response, as the broker would send.
        """
        key, version = entry.api_key, entry.api_version
        only_throttle = not addresses and entry.fetch is None and entry.mutation is None
        if only_throttle and not messages.can_read_response(key, version):
            # The codec cannot read this response (an API or version newer than the shipped
            # schemas): it goes out unchanged; the mute that follows still throttles the client.
            return frame
        hsize = response_header_size(key, version, frame)
        body = messages.decode_response(key, version, memoryview(frame)[hsize:])
        if entry.capture is not None:
            entry.capture.on_response(body)
            if key == ApiKey.FETCH and entry.fetch is None:  # no quota reads it: capture alone
                parts = messages.fetch_response_partitions(body)
                unknown = self.server.topic_names.rename(parts)
                if unknown:
                    self.metrics.topic_ids.labels("unresolved").inc(len(unknown))
                    self.server.topic_lookup.wanted()
                entry.capture.on_fetch(parts, 0)
        if entry.fetch is not None:
            enforcer = self.server.enforcer
            charge = enforcer.on_fetch_response(
                self.user,
                entry.client_id,
                len(frame),
                body,
                entry.busy if entry.charge_time else None,
                entry.fetch.grant,
            )
            if entry.capture is not None:
                entry.capture.on_fetch(charge.partitions, charge.throttle_ms)
            throttle_ms = 0 if enforcer.dry_run else charge.throttle_ms
            if throttle_ms and not charge.refuse:
                entry.throttle_ms = max(entry.throttle_ms, throttle_ms)  # delivered, then muted
            elif throttle_ms:
                entry.throttle_ms = throttle_ms
                broker_ms = int(body.get("throttle_time_ms", 0))
                out = bytearray(frame[:hsize])
                out += throttled_fetch_response(version, max(broker_ms, throttle_ms), entry.fetch)
                return out
        if entry.mutation is not None:
            state = entry.mutation
            refused = admission.broker_refusals(state, body)
            if refused:
                self.server.enforcer.refund_mutations(state, refused)
            if state.partial:
                out = bytearray(frame[:hsize])
                out += messages.encode_response(key, version, admission.merged(state, body))
                return out
        changed = 0
        if key == ApiKey.METADATA:
            self.server.topic_names.learn(messages.metadata_topic_ids(body))
        if addresses:
            if key == ApiKey.API_VERSIONS:
                messages.intersect_api_versions(body)
                changed = 1
            changed += messages.rewrite_addresses(key, version, body, self.server.brokers.advertised)
        if changed:
            self.metrics.rewritten_addresses.inc(changed)
            body["throttle_time_ms"] = messages.wire_throttle_ms(
                max(int(body.get("throttle_time_ms", 0)), entry.throttle_ms)
            )
            out = bytearray(frame[:hsize])
            out += messages.encode_response(key, version, body)
            return out
        if entry.throttle_ms:
            del body  # the record views into frame must go before it is patched
            messages.patch_throttle_time(key, version, memoryview(frame)[hsize:], entry.throttle_ms)
        return frame
