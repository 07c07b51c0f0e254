"""SASL: follow a client's own authentication with the broker, and take the user it claimed as
the connection's principal once the broker accepts it (quotas are per user)."""

from __future__ import annotations

import logging
from collections.abc import Collection

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import FrameError, response_header_size
from protocol.schema import SchemaError
from proxy.pipeline.stages.base import Connection, Request, Response, Stage

log = logging.getLogger(__name__)

_KEYS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class SaslStage(Stage):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def request_keys(self) -> Collection[int]:
        return _KEYS

    def on_request(self, req: Request) -> bool:
        body = req.body
        if req.header.api_key == ApiKey.SASL_HANDSHAKE:
            self.conn.sasl.on_handshake(str(body.get("mechanism", "")))
        else:
            self.conn.sasl.on_authenticate_request(bytes(body.get("auth_bytes") or b""))
            req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        conn = self.conn
        entry = resp.entry
        try:  # read apart from resp.body: an unreadable answer is logged, not fatal
            hsize = response_header_size(entry.api_key, entry.api_version, resp.frame)
            body = messages.decode_response(entry.api_key, entry.api_version, memoryview(resp.frame)[hsize:])
        except (SchemaError, FrameError) as exc:
            log.warning("conn %d: unreadable SaslAuthenticate response: %s", conn.id, exc)
            return False
        principal = conn.sasl.on_authenticate_response(int(body.get("error_code", -1)))
        if principal is not None:
            conn.user = principal
            log.debug("conn %d from %s authenticated as %s", conn.id, conn.peer, principal)
        return False
