"""KIP-546: DescribeClientQuotas and AlterClientQuotas answered by the proxy from its own quotas
(mode proxy), or an alteration validated here, forwarded, and stored once the broker agreed (mode
both). Later requests of the connection wait meanwhile, so responses stay in order."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from protocol.api_keys import ApiKey
from protocol.frames import RequestHeader
from proxy.pipeline.stages.base import Connection, InFlight, Request, Response, Stage
from proxy.shared.quota_api import (
    AUTHORIZATION_FAILED,
    QuotaAlterBoth,
    QuotaApiService,
    alter_response,
    alterations_of,
    components_of,
    describe_response,
    principal_of,
    refused_alter_response,
)

log = logging.getLogger(__name__)

HOLD = "quota-api"  # a client-quota request is being answered: later requests wait behind it


class QuotaApiStage(Stage):
    def __init__(self, conn: Connection, service: QuotaApiService) -> None:
        self.conn = conn
        self.service = service
        if service.mode == "proxy":
            self._keys: frozenset[int] = frozenset(
                {ApiKey.DESCRIBE_CLIENT_QUOTAS, ApiKey.ALTER_CLIENT_QUOTAS}
            )
        else:  # both: Describe goes to the broker
            self._keys = frozenset({ApiKey.ALTER_CLIENT_QUOTAS})

    def request_keys(self) -> Collection[int]:
        return self._keys

    def _authenticated_as_the_broker_wants(self) -> bool:
        """False while a SASL exchange is under way, or before any on a listener that requires
        SASL (the proxy logs in upstream itself then): such a client's quota requests go to the
        broker, which refuses them as it refuses any request before authentication."""
        conn = self.conn
        if conn.sasl.in_progress:
            return False
        return conn.server.cfg.upstream_sasl is None or conn.sasl.authenticated is not None

    def on_request(self, req: Request) -> bool:
        if not self._authenticated_as_the_broker_wants():
            return False
        body = req.body
        conn = self.conn
        entry = conn.entry_for(req)
        conn.in_flight.append(entry)
        conn.spawn_held(HOLD, self._answer(entry, req.frame, req.header, body), "client-quota request")
        return True

    async def _answer(
        self, entry: InFlight, frame: bytes | bytearray, header: RequestHeader, body: dict[str, Any]
    ) -> bool:
        """Answer it, or (mode both) forward it: True, its hold ends once the answer is stored."""
        conn, service = self.conn, self.service
        principal = principal_of(conn.user)
        if header.api_key == ApiKey.DESCRIBE_CLIENT_QUOTAS:
            if not service.may_describe(principal):
                answer = describe_response(AUTHORIZATION_FAILED)
            else:
                found = service.describe(components_of(body), bool(body.get("strict")))
                answer = describe_response(found)
        elif not service.may_alter(principal):
            log.info("conn %d: %s may not alter client quotas (quota_api.admins)", conn.id, principal)
            service.metrics.alterations.labels("kafka", AUTHORIZATION_FAILED.name).inc()
            answer = refused_alter_response(body, AUTHORIZATION_FAILED)
        elif service.mode == "both":
            # Validated here, forwarded as sent; stored once the broker's answer is in.
            entry.quota_alter = QuotaAlterBoth(await service.validate(alterations_of(body)), body)
            entry.stages = (self, *entry.stages)
            conn.send(frame)
            return True  # the hold ends in _stored
        else:
            result = await service.alter(
                alterations_of(body), bool(body.get("validate_only")), who=f"{principal} ({conn.peer})"
            )
            answer = alter_response(result.results)
        if not conn.closed:
            conn.answer(entry, conn.encoded_answer(header, answer))
        return False

    def on_response(self, resp: Response) -> bool:
        """Mode both: the broker answered an alteration; the entry goes back to the head of the
        FIFO (nothing was forwarded after it) until the proxy has stored its part."""
        self.conn.in_flight.appendleft(resp.entry)
        self.conn.spawn_held(HOLD, self._stored(resp), "client-quota alteration")
        return True

    async def _stored(self, resp: Response) -> None:
        conn, entry = self.conn, resp.entry
        state = entry.quota_alter
        assert state is not None
        answer = await state.complete(self.service, resp.body)
        if conn.closed:
            return
        resp.replace_body(answer)
        assert resp.replacement is not None
        entry.local_response = bytes(resp.replacement)
        conn.flush_local()
