"""What a Fetch costs: its response's bytes against the byte-rate quotas (KIP-13 per client,
KIP-1010 per partition) and, when request_percentage applies, the broker's time. A fetch in flight
holds its share of the entity's allowance (its max_bytes is lowered to it, as Kafka caps it);
the answer is delivered with its throttle (steady shaping) or, as Kafka does, replaced by an
empty throttled response."""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey
from proxy.pipeline.stages.base import Connection, Request, Response, Stage
from proxy.shared.throttling import (
    QuotaEnforcer,
    cap_fetch_max_bytes,
    fetch_request_info,
    throttled_fetch_response,
)

_KEYS = frozenset({ApiKey.FETCH})


class FetchStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer
        self._holds = conn.server.metrics.entity_holds.labels("Fetch")

    def request_keys(self) -> Collection[int]:
        enforcer = self.enforcer
        return _KEYS if enforcer.fetch.active or enforcer.request_time.active else ()

    def on_request(self, req: Request) -> bool:
        conn, enforcer = self.conn, self.enforcer
        header = req.header
        client_id = req.client_id
        if req.exempt:
            req.fetch = fetch_request_info(header.api_version, req.body)  # charged, never held
            req.want_response(self)
            return False
        wait = enforcer.hold_ms(False, conn.user, client_id)
        if wait:
            # Another connection of this entity is throttled, or its fetches in flight hold what
            # its bucket has: this one waits, unread, as a throttled connection does.
            self._holds.inc()
            conn.wait_before(req.frame, wait)
            return True
        body = req.body
        version = header.api_version
        requested = int(body["max_bytes"]) if version >= 3 and "max_bytes" in body else None
        grant = enforcer.fetch_grant(conn.user, client_id, requested)
        if grant is not None:
            capped = cap_fetch_max_bytes(version, req.frame, header.size, grant.allowed)
            if capped is not None:
                req.frame = capped
        req.fetch = fetch_request_info(version, body)
        req.fetch.grant = grant
        req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        entry, enforcer = resp.entry, self.enforcer
        assert entry.fetch is not None
        body = resp.body
        charge = enforcer.on_fetch_response(
            self.conn.user,
            entry.client_id,
            len(resp.frame),
            body,
            entry.busy if entry.charge_time else None,
            entry.fetch.grant,
            exempt := entry.exempt,
        )
        entry.fetch_charge = charge
        throttle_ms = 0 if enforcer.dry_run or exempt else charge.throttle_ms
        if throttle_ms and not charge.refuse:
            entry.throttle_ms = max(entry.throttle_ms, throttle_ms)  # delivered, then muted
        elif throttle_ms:
            entry.throttle_ms = throttle_ms
            broker_ms = int(body.get("throttle_time_ms", 0))
            out = bytearray(resp.frame[: resp.header_size])
            out += throttled_fetch_response(entry.api_version, max(broker_ms, throttle_ms), entry.fetch)
            resp.replacement = out
        return False

    def on_close(self) -> None:
        """Fetches that will never be answered give back their share."""
        for entry in self.conn.in_flight:
            if entry.fetch is not None and entry.fetch.grant is not None:
                self.enforcer.release_fetch(entry.fetch.grant)
