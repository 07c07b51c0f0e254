"""The asyncio side of a connection: the two socket protocols that feed a Pipeline, and the
helpers that close a transport without hanging on a peer that reads nothing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from proxy.net.pipeline_reads import ClientReads, UpstreamReads

if TYPE_CHECKING:
    from proxy.pipeline.connection import Pipeline

# While a client's reads are paused the event loop cannot see it leave (EOF is only read with the
# data); its socket's TCP state is looked at this often instead, so a client that gave up on a hung
# upstream does not pin its pipeline and both sockets forever.
PAUSED_PEER_CHECK_SECONDS = 1.0
# A closed side's unsent bytes get this long to drain (a peer that reads nothing never takes
# them, and its socket would stay open for good); then the connection is reset.
CLOSE_FLUSH_SECONDS = 5.0
_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_PEER_GONE_STATES = frozenset({7, 8, 9})  # TCP_CLOSE (reset), TCP_CLOSE_WAIT (FIN), TCP_LAST_ACK


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


class _MakesItsPipeline(ClientReads):
    """A client connection's protocol, which makes its pipeline once the connection is made
    (the server's factory has no transport to give it before)."""

    def __init__(self, make_pipeline: Callable[[asyncio.Transport], Pipeline]) -> None:
        super().__init__()
        self.make_pipeline = make_pipeline

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.pipeline = self.make_pipeline(cast(asyncio.Transport, transport))


class ClientProtocol(_MakesItsPipeline, asyncio.BufferedProtocol):
    """A client connection: the socket reads straight into the pipeline's request decoder (the
    per-read calls are ClientReads', compiled). TLS connections, and plaintext ones once a
    large frame came (``read_into_buffers``)."""


class PlainClientProtocol(_MakesItsPipeline, asyncio.Protocol):
    """A plaintext client connection, read as ``bytes`` (``Pipeline.client_data``): an
    ``asyncio.Protocol`` (never a ``BufferedProtocol``), so the event loop hands each read over
    whole instead of asking for a buffer first. For small frames that is one call a read, not
    two, and a request that was all of a read goes on as the very bytes read."""


class PlainUpstreamProtocol(UpstreamReads, asyncio.Protocol):
    """A plaintext broker connection, read as ``bytes`` (``Pipeline.upstream_data``), as
    ``PlainClientProtocol``."""


def read_into_buffers(pipeline: Pipeline, transport: asyncio.Transport, upstream: bool) -> None:
    """From plain reads to buffered ones for the rest of the connection (a large frame began:
    read as bytes, each of its bytes would be copied twice). The event loop takes the new
    protocol at once, the read under way included."""
    if upstream:
        transport.set_protocol(UpstreamProtocol(pipeline))
        return
    protocol = ClientProtocol(_made_already)
    protocol.pipeline = pipeline
    transport.set_protocol(protocol)


def _made_already(transport: asyncio.Transport) -> Pipeline:
    raise AssertionError("a protocol switched to has its pipeline already")


class UpstreamProtocol(UpstreamReads, asyncio.BufferedProtocol):
    """The pipeline's broker connection: the socket reads straight into its response decoder
    (the per-read calls are UpstreamReads', compiled). TLS connections, and plaintext ones once
    a large response came or a Fetch went up (``read_into_buffers``)."""
