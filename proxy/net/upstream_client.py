"""A minimal Kafka client for the proxy's own questions to the cluster (which brokers exist).

When the upstream listener requires TLS, the proxy connects with its own TLS context
(``upstream_tls``); when it requires SASL, the proxy logs in with its own PLAIN credentials
(``upstream_sasl``: PLAIN, or SCRAM with kafka-python's SCRAM client) before asking.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass, field
from typing import Any

from kafka.net.sasl.scram import ScramClient

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import SIZE, FrameError, RequestHeader, encode_request_header, response_header_size
from protocol.schema import SchemaError

METADATA_VERSION = 12
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSION = 2


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    mechanism: str = "PLAIN"  # or SCRAM-SHA-256, SCRAM-SHA-512


@dataclass(frozen=True)
class UpstreamLogin:
    """How the proxy itself reaches a broker: over TLS with this context, and logged in with
    SASL; either may be absent."""

    sasl: Credentials | None = None
    tls: ssl.SSLContext | None = None


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float) -> None:
        self.reader, self.writer, self.timeout = reader, writer, timeout
        self.correlation_id = 0

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.correlation_id += 1
        header = RequestHeader(api_key, version, self.correlation_id, "kthrottle", 0)
        payload = encode_request_header(header) + messages.encode(api_key, version, body, response=False)
        self.writer.write(SIZE.pack(len(payload)) + payload)
        await self.writer.drain()
        (size,) = SIZE.unpack(await asyncio.wait_for(self.reader.readexactly(4), self.timeout))
        frame = await asyncio.wait_for(self.reader.readexactly(size), self.timeout)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        if correlation_id != self.correlation_id:
            raise ConnectionError(f"unexpected correlation id {correlation_id}")
        hsize = response_header_size(api_key, version, frame)
        return messages.decode_response(api_key, version, memoryview(frame)[hsize:])

    async def login(self, creds: Credentials) -> None:
        mechanism = creds.mechanism
        shake = await self.call(ApiKey.SASL_HANDSHAKE, SASL_HANDSHAKE_VERSION, {"mechanism": mechanism})
        if shake["error_code"] != 0:
            offered = ", ".join(shake.get("mechanisms") or [])
            raise ConnectionError(
                f"upstream refused SASL {mechanism} (error {shake['error_code']}; it offers {offered})"
            )
        if mechanism == "PLAIN":
            await self._authenticate(
                creds, b"\x00" + creds.username.encode() + b"\x00" + creds.password.encode()
            )
            return
        scram = ScramClient(creds.username, creds.password, mechanism)
        server_first = await self._authenticate(creds, scram.first_message())
        try:
            scram.process_server_first_message(server_first)
            server_final = await self._authenticate(creds, scram.final_message())
            scram.process_server_final_message(server_final)
        except (ValueError, KeyError) as exc:  # a server that does not prove it knows the password
            raise ConnectionError(f"upstream SCRAM login as {creds.username}: {exc}") from exc

    async def _authenticate(self, creds: Credentials, token: bytes) -> bytes:
        auth = await self.call(ApiKey.SASL_AUTHENTICATE, SASL_AUTHENTICATE_VERSION, {"auth_bytes": token})
        if auth["error_code"] != 0:
            why = auth.get("error_message")
            raise ConnectionError(f"upstream SASL {creds.mechanism} login as {creds.username} failed: {why}")
        return bytes(auth.get("auth_bytes") or b"")


async def request(
    host: str,
    port: int,
    api_key: int,
    version: int,
    body: dict[str, Any],
    timeout: float,
    login: UpstreamLogin | None = None,
) -> dict[str, Any]:
    """Send one request on a fresh connection (logging in first if asked) and decode the response."""
    tls = login.tls if login is not None else None
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=tls), timeout)
    try:
        conn = _Connection(reader, writer, timeout)
        if login is not None and login.sasl is not None:
            await conn.login(login.sasl)
        return await conn.call(api_key, version, body)
    finally:
        writer.close()


async def fetch_brokers(
    addresses: list[tuple[str, int]],
    timeout: float,
    login: UpstreamLogin | None = None,
    answered: list[tuple[str, int]] | None = None,
) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every live broker, from the first address that answers (put
    into ``answered``, when given)."""
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
                login,
            )
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
            last = exc
            continue
        except (SchemaError, FrameError, struct.error) as exc:  # an answer that cannot be read
            last = exc
            continue
        if answered is not None:
            answered[:] = [(host, port)]
        return [(b["node_id"], b["host"], b["port"]) for b in resp.get("brokers") or []]
    raise ConnectionError(f"no bootstrap broker answered Metadata: {last!r}")
