"""A connection streams large frames through buffers of 1 MiB in plain text and of 256 KiB
where either of its links is TLS (decrypted into and encrypted from the same buffer: the smaller
one stays in the core's cache between the two). A real Pipeline on in-memory transports."""

from __future__ import annotations

import pytest

from fuzz.fakenet import FakeTransport, FuzzLoop
from fuzz.pipeline_target import _listener, in_memory_server
from protocol.frames import STREAM_CHUNK_BYTES, TLS_STREAM_CHUNK_BYTES
from proxy.config import parse_config
from proxy.net.transports import ClientProtocol
from proxy.pipeline.connection import Pipeline

SIDECAR = (
    "mode: sidecar\nsidecar: {listen_port: 19092, upstream: '127.0.0.1:9092'}\n"
    "admin: {enabled: false}\nmetadata_refresh_seconds: 3600\n"
)
UPSTREAM_TLS = "upstream_tls: {enabled: true}\n"


def _pipeline(config: str, client_tls: bool) -> Pipeline:
    loop = FuzzLoop()
    server = in_memory_server(parse_config(config), loop)
    protocol = ClientProtocol(lambda transport: Pipeline(server, _listener(server), transport))
    client = FakeTransport(loop, protocol, ("127.0.0.1", 40000))
    if client_tls:
        client.extra["ssl_object"] = object()  # what a TLS transport gives; the listener has no TLS config

    async def accept() -> None:
        protocol.connection_made(client)

    loop.run_until_complete(accept())
    assert protocol.pipeline is not None
    return protocol.pipeline


@pytest.mark.parametrize(
    ("config", "client_tls", "chunk"),
    [
        (SIDECAR, False, STREAM_CHUNK_BYTES),
        (SIDECAR, True, TLS_STREAM_CHUNK_BYTES),
        (SIDECAR + UPSTREAM_TLS, False, TLS_STREAM_CHUNK_BYTES),
    ],
    ids=["plain", "client-tls", "upstream-tls"],
)
def test_the_stream_buffer_is_smaller_where_a_link_is_tls(config: str, client_tls: bool, chunk: int) -> None:
    pipeline = _pipeline(config, client_tls)
    assert pipeline.requests.stream_chunk_bytes == chunk
    assert pipeline.responses.stream_chunk_bytes == chunk
