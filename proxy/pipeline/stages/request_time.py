"""request_percentage (KIP-124): the broker's time on a client's requests, as the proxy sees it
(the time from forwarding to the answer, a pipelined request's starting when the one before it
was answered). A Fetch's time is charged with its bytes (``FetchStage``)."""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey
from proxy.pipeline.stages.base import EVERY_KEY, Connection, Request, Response, Stage
from proxy.shared.throttling import QuotaEnforcer

# Requests the broker parks by design (a group waiting for its members): their time is waiting,
# not work, so request_percentage does not count it.
_PARKED_APIS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})


class RequestTimeStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer

    def request_keys(self) -> Collection[int] | None:
        return EVERY_KEY if self.enforcer.request_time.active else ()

    def on_request(self, req: Request) -> bool:
        key = req.header.api_key
        if key in _PARKED_APIS or not self.enforcer.request_time_charged(key, req.acks):
            return False
        req.charge_time = True
        if req.fetch is None:
            req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        entry, enforcer = resp.entry, self.enforcer
        exempt = entry.exempt
        time_ms = enforcer.on_request_time(self.conn.user, entry.client_id, entry.api_key, entry.busy, exempt)
        if time_ms and not enforcer.dry_run and not exempt:
            entry.throttle_ms = max(entry.throttle_ms, time_ms)
        return False
