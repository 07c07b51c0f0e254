"""The PROXY protocol on client listeners behind a load balancer (``proxy_protocol`` in the config).

On a listener that requires it, a connection first meets ``HeaderProtocol``: it is refused at once
when its peer is not one of ``trusted_sources``; otherwise the header is read, never a byte past
it (``ProxyHeaderParser.wanted``), within ``connect_timeout_seconds``. Then the connection is
handed to its pipeline with the client's address from the header: on a plain listener by
switching the transport's protocol to the usual ``PlainClientProtocol``, on a TLS listener after the
TLS handshake that follows the header (``loop.start_tls``, with the listener's context: SNI
routing and client certificates as on any TLS listener). A connection refused is counted
(``kthrottle_proxy_protocol_refused_total{reason}``), logged with its peer and the reason (rate
limited), and closed. Listeners without the PROXY protocol never come here.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from protocol.proxy_header import ProxyHeader, ProxyHeaderError, ProxyHeaderParser
from proxy.net.transports import ClientProtocol, PlainClientProtocol
from proxy.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from proxy.config import ProxyConfig
    from proxy.metrics import ProxyMetrics
    from proxy.net.tls import ListenerTlsContext
    from proxy.pipeline.connection import Pipeline

log = logging.getLogger(__name__)
refusal_log = RateLimitedLog(log)

Origin = tuple[str, int] | None  # the client's address from the header; None: the socket's peer
MakePipeline = Callable[[asyncio.Transport, Origin], "Pipeline"]
_READ_CHUNK = 512  # the header is read into a buffer this large, at most ``wanted()`` at a time


def _address(peer: object) -> tuple[str, str]:
    """(ip, "ip:port") of a socket peer as asyncio gives it."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(peer[0]), f"{peer[0]}:{peer[1]}"
    return str(peer), str(peer)


class ProxyProtocolGate:
    """Shared by a server's listeners that require the header: trust, timeout, counting, and the
    connections still reading their header or in their TLS handshake (closed at shutdown)."""

    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics, tls: ListenerTlsContext | None) -> None:
        self.config = cfg.proxy_protocol  # as at start: a reload does not change it (restart-only)
        self.networks = cfg.proxy_protocol.networks()
        self.timeout = cfg.connect_timeout_seconds
        self.metrics = metrics
        self.tls = tls
        self.opening: set[HeaderProtocol] = set()

    def applies_to(self, listener: str) -> bool:
        """Whether the listener of this name requires the header (a broker's listener may open
        long after the start, when its node appears)."""
        return self.config.applies_to(listener)

    def trusts(self, ip: str) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d
        return any(address in network for network in self.networks)

    def refused(
        self, peer: str, listener: str, reason: str, label: str, level: int = logging.WARNING
    ) -> None:
        self.metrics.proxy_protocol_refused.labels(label).inc()
        refusal_log.log(
            level,
            f"proxy-protocol-{label}",
            "connection from %s on %s refused: %s",
            peer,
            listener,
            reason,
        )

    def accepted(self, header: ProxyHeader, peer: str, listener: str) -> None:
        kind = "local" if header.local else ("client" if header.client is not None else "unknown")
        self.metrics.proxy_protocol_headers.labels(str(header.version), kind).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("connection from %s on %s: PROXY header %s", peer, listener, header.describe())

    def close_all(self) -> None:
        """Shutdown: connections not handed to a pipeline yet are closed."""
        for opening in list(self.opening):
            opening.abort("the proxy is shutting down")


class HeaderProtocol(asyncio.BufferedProtocol):
    """A new connection on a listener with the PROXY protocol, until its header has been read."""

    def __init__(self, gate: ProxyProtocolGate, listener: str, make_pipeline: MakePipeline) -> None:
        self.gate = gate
        self.listener = listener
        self.make_pipeline = make_pipeline
        self.parser = ProxyHeaderParser()
        self._buffer = memoryview(bytearray(_READ_CHUNK))
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.done = False  # refused, closed, or handed on
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        ip, self.peer = _address(transport.get_extra_info("peername"))
        if not self.gate.trusts(ip):
            self._refuse(
                f"{ip} is not in proxy_protocol.trusted_sources (only the load balancers may connect "
                "to a listener with the PROXY protocol)",
                "untrusted-source",
            )
            return
        self.gate.opening.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.gate.timeout, self._timed_out)

    # --- the header ------------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer[: max(1, min(self.parser.wanted(), _READ_CHUNK))]

    def buffer_updated(self, nbytes: int) -> None:
        if self.done:
            return
        try:
            header = self.parser.feed(self._buffer[:nbytes])
        except ProxyHeaderError as exc:
            self._refuse(str(exc), "malformed")
            return
        if header is not None:
            self._hand_on(header)

    def eof_received(self) -> bool | None:
        return None  # close; connection_lost says why

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done:
            return
        got = self.parser.buffered
        if got:
            self._refuse(f"closed after {got} bytes of a PROXY protocol header", "closed")
        else:  # a load balancer's TCP health check, most often
            self._refuse("closed before sending a PROXY protocol header", "closed", logging.DEBUG)

    def _timed_out(self) -> None:
        self._timer = None
        if not self.done:
            got = self.parser.buffered
            self._refuse(
                f"no complete PROXY protocol header within {self.gate.timeout:g} s ({got} bytes of one; "
                "connect_timeout_seconds)",
                "timeout",
            )

    def _refuse(self, reason: str, label: str, level: int = logging.WARNING) -> None:
        self.gate.refused(self.peer, self.listener, reason, label, level)
        self.abort(None)

    def abort(self, why: str | None) -> None:
        """Close this connection before it has a pipeline."""
        if why is not None and not self.done:
            log.info("connection from %s on %s closed: %s", self.peer, self.listener, why)
        self._finish()
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def _finish(self) -> None:
        self.done = True
        self.gate.opening.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # --- handing on ------------------------------------------------------------------------------

    def _hand_on(self, header: ProxyHeader) -> None:
        assert self.transport is not None
        self.gate.accepted(header, self.peer, self.listener)
        origin = header.client
        if self.gate.tls is None:
            self._finish()
            protocol = PlainClientProtocol(lambda transport: self.make_pipeline(transport, origin))
            self.transport.set_protocol(protocol)
            protocol.connection_made(self.transport)  # the pipeline pauses reads until its upstream is up
            if self.parser.rest and protocol.pipeline is not None:  # never, reading at most wanted()
                protocol.pipeline.feed(self.parser.rest)
            return
        # Nothing more is read here: the TLS handshake's bytes are the TLS protocol's.
        self.transport.pause_reading()
        if self._timer is not None:  # the handshake has its own timeout
            self._timer.cancel()
            self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._start_tls(origin))

    async def _start_tls(self, origin: Origin) -> None:
        assert self.transport is not None and self.gate.tls is not None
        protocol = TlsAfterHeader(lambda transport: self.make_pipeline(transport, origin))
        loop = asyncio.get_running_loop()
        try:
            tls_transport = await loop.start_tls(
                self.transport,
                protocol,
                self.gate.tls.listening,
                server_side=True,
                ssl_handshake_timeout=self.gate.timeout,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the handshake failed: ListenerTlsContext counts and logs it
            log.debug("connection from %s on %s: TLS handshake failed: %r", self.peer, self.listener, exc)
            self._finish()
            self.transport.abort()
            return
        self._finish()
        if tls_transport is None:  # the connection closed as the handshake ended
            self.transport.abort()
            return
        protocol.connection_made(tls_transport)


class TlsAfterHeader(ClientProtocol):
    """The client protocol ``start_tls`` is given. What the client sends right after its handshake
    may be decrypted before ``start_tls`` returns, that is before ``connection_made`` made the
    pipeline: those bytes are kept, and handed to the pipeline once it is there."""

    def __init__(self, make_pipeline: Callable[[asyncio.Transport], Pipeline]) -> None:
        super().__init__(make_pipeline)
        self._early = bytearray()
        self._scratch: memoryview | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._lost or transport.is_closing():  # gone between the handshake and now: no pipeline
            transport.close()
            return
        super().connection_made(transport)
        early, self._early, self._scratch = self._early, bytearray(), None
        if early and self.pipeline is not None and not self.pipeline.closed:
            self.pipeline.feed(early)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.pipeline is None:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(64 * 1024))
            return self._scratch
        return super().get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.pipeline is None:
            assert self._scratch is not None
            self._early += self._scratch[:nbytes]
            return
        super().buffer_updated(nbytes)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pipeline is None:
            self._lost = True
            return
        super().connection_lost(exc)
