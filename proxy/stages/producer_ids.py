"""The producer-id rate (KIP-936) at InitProducerId: the id the broker hands out is charged (under
steady shaping) and a user over its rate of new producer ids gets the throttle on the answer
(ids seen in Produce batches are charged by ``ProduceStage``)."""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey
from proxy.stages.base import Connection, Request, Response, Stage
from proxy.throttling import QuotaEnforcer

_KEYS = frozenset({ApiKey.INIT_PRODUCER_ID})


class InitProducerIdStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer

    def request_keys(self) -> Collection[int]:
        return _KEYS if self.enforcer.producer_ids.active else ()

    def on_request(self, req: Request) -> bool:
        req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        entry = resp.entry
        body = resp.body
        producer_id = int(body.get("producer_id", -1)) if int(body.get("error_code", 0)) == 0 else -1
        pid_ms = self.enforcer.on_init_producer_id(self.conn.user, entry.client_id, producer_id)
        entry.throttle_ms = max(entry.throttle_ms, pid_ms)
        return False
