"""A minimal Kafka client for the proxy's own questions to the cluster (which brokers exist)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import SIZE, RequestHeader, encode_request_header, response_header_size

METADATA_VERSION = 12


async def request(
    host: str, port: int, api_key: int, version: int, body: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """Send one request on a fresh connection and decode the response."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        header = RequestHeader(api_key, version, 1, "kthrottle", 0)
        payload = encode_request_header(header) + messages.encode(api_key, version, body, response=False)
        writer.write(SIZE.pack(len(payload)) + payload)
        await writer.drain()
        (size,) = SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), timeout))
        frame = await asyncio.wait_for(reader.readexactly(size), timeout)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        if correlation_id != 1:
            raise ConnectionError(f"unexpected correlation id {correlation_id}")
        hsize = response_header_size(api_key, version, frame)
        return messages.decode_response(api_key, version, memoryview(frame)[hsize:])
    finally:
        writer.close()


async def fetch_brokers(addresses: list[tuple[str, int]], timeout: float) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every live broker, from the first bootstrap address that answers."""
    last: BaseException | None = None
    for host, port in addresses:
        try:
            resp = await request(
                host,
                port,
                ApiKey.METADATA,
                METADATA_VERSION,
                {"topics": [], "allow_auto_topic_creation": False},
                timeout,
            )
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
            last = exc
            continue
        return [(b["node_id"], b["host"], b["port"]) for b in resp.get("brokers") or []]
    raise ConnectionError(f"no bootstrap broker answered Metadata: {last!r}")
