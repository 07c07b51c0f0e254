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
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from protocol import messages
from protocol.api_keys import ApiKey, api_name
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
from protocol.schema import SchemaError
from protocol.versions import DECODED_APIS, NODE_ENDPOINTS_FROM, codec_versions

if TYPE_CHECKING:
    from proxy.server import Listener, ProxyServer

log = logging.getLogger(__name__)
_ids = itertools.count(1)

# Per-direction write buffer: large enough that a multi-hundred-KiB Produce or Fetch frame does not
# pause the other side on every frame, small enough to bound memory per connection.
WRITE_BUFFER_HIGH = 4 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024

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
        self.loop = asyncio.get_running_loop()
        self.metrics = server.metrics
        server.pipeline_opened(self)
        self.pause_client("connecting")
        self._connect_task = self.loop.create_task(self._connect())

    # --- lifecycle -----------------------------------------------------------------------------

    async def _connect(self) -> None:
        targets = self.server.brokers.upstream_for(self.listener.node_id)
        if not targets:
            self.close(f"no known address for broker node {self.listener.node_id}")
            return
        last: BaseException | None = None
        for host, port in targets:
            try:
                transport, _ = await asyncio.wait_for(
                    self.loop.create_connection(lambda: _UpstreamProtocol(self), host, port),
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
        self.client.close()
        if self.upstream is not None:
            self.upstream.close()
        if not self._connect_task.done():
            self._connect_task.cancel()
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
        if not self.closed:
            self.metrics.upstream_errors.labels("disconnect").inc()
            self.close(f"upstream {getattr(self, 'upstream_addr', '?')} closed the connection ({exc!r})")

    @property
    def idle(self) -> bool:
        return not self.in_flight

    # --- flow control ------------------------------------------------------------------------

    def pause_client(self, reason: str) -> None:
        if not self._client_pauses and not self.closed:
            self.client.pause_reading()
        self._client_pauses.add(reason)

    def resume_client(self, reason: str) -> None:
        self._client_pauses.discard(reason)
        if not self._client_pauses and not self.closed:
            self.client.resume_reading()

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
        for frame in frames:
            if self.closed:
                return
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
            if key == ApiKey.PRODUCE:
                try:
                    body = messages.decode_request(key, version, memoryview(frame)[header.size :])
                except SchemaError as exc:
                    self.reject(f"malformed Produce v{version} request: {exc}", "malformed")
                    return
                expects_response = messages.produce_acks(body) != 0
        req_counter, bytes_counter, _resp, _lat = self.metrics.api(key)
        req_counter.inc()
        bytes_counter.inc(len(frame) + 4)
        if expects_response:
            self.in_flight.append(InFlight(key, version, header.correlation_id, self.loop.time()))
        if self.upstream is None:
            self.pending.append(frame)
        else:
            self._forward(frame)

    def _forward(self, frame: bytes | bytearray) -> None:
        assert self.upstream is not None
        self.upstream.writelines((SIZE.pack(len(frame)), frame))

    def _answer_locally(self, header: RequestHeader, body: dict[str, Any]) -> None:
        payload = encode_response_header(header.api_key, header.api_version, header.correlation_id)
        payload += messages.encode_response(header.api_key, header.api_version, body)
        entry = InFlight(
            header.api_key, header.api_version, header.correlation_id, self.loop.time(), bytes(payload)
        )
        self.in_flight.append(entry)
        self._flush_local()

    def _flush_local(self) -> None:
        while self.in_flight and self.in_flight[0].local_response is not None:
            entry = self.in_flight.popleft()
            assert entry.local_response is not None
            self.client.writelines((SIZE.pack(len(entry.local_response)), entry.local_response))

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
        if key in _REWRITE_ALWAYS or (
            key in NODE_ENDPOINTS_FROM and entry.api_version >= NODE_ENDPOINTS_FROM[key]
        ):
            try:
                frame = self._rewrite(entry, frame)
            except (SchemaError, FrameError, LookupError) as exc:
                self.metrics.upstream_errors.labels("undecodable-response").inc()
                self.close(f"cannot rewrite {api_name(key)} v{entry.api_version} response: {exc}")
                return
        _req, _bytes, resp_counter, latency = self.metrics.api(key)
        resp_counter.inc(len(frame) + 4)
        latency.observe(self.loop.time() - entry.sent_at)
        self.client.writelines((SIZE.pack(len(frame)), frame))
        self._flush_local()
        if self.server.draining and not self.in_flight:
            self.close("drained for shutdown", level=logging.INFO)

    def _rewrite(self, entry: InFlight, frame: bytearray) -> bytearray:
        """Decode, change what must change, and re-encode only if something did."""
        key, version = entry.api_key, entry.api_version
        hsize = response_header_size(key, version, frame)
        body = messages.decode_response(key, version, memoryview(frame)[hsize:])
        changed = 0
        if key == ApiKey.API_VERSIONS:
            messages.intersect_api_versions(body)
            changed = 1
        changed += messages.rewrite_addresses(key, version, body, self.server.brokers.advertised)
        if not changed:
            return frame
        self.metrics.rewritten_addresses.inc(changed)
        out = bytearray(frame[:hsize])
        out += messages.encode_response(key, version, body)
        return out
