"""The producer-id rate (KIP-936) at InitProducerId. Under steady shaping the id a request will bring
is charged before it is forwarded, and a user over its rate has the request wait its turn (a new
producer cannot produce without its id); the answer settles the charge. Under kafka shaping a
user over its rate gets the throttle on the answer. (Ids seen in Produce batches are charged by
``ProduceStage``.)"""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey
from proxy.pipeline.stages.base import Connection, Request, Response, Stage
from proxy.shared.throttling import QuotaEnforcer

_KEYS = frozenset({ApiKey.INIT_PRODUCER_ID})


class InitProducerIdStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer
        self._waited: set[int] = set()  # requests put back to wait their turn (their frames' ids)

    def request_keys(self) -> Collection[int]:
        return _KEYS if self.enforcer.producer_ids.active else ()

    def on_request(self, req: Request) -> bool:
        waited = id(req.frame) in self._waited
        if waited:
            self._waited.discard(id(req.frame))
        else:
            client_id = req.client_id
            wait = self.enforcer.reserve_producer_id(self.conn.user, client_id, req.exempt)
            if wait:
                # Read again once its turn comes (the id it brings is charged already).
                self._waited.add(id(req.frame))
                self.conn.wait_before(req.frame, wait)
                return True
        req.want_response(self)  # the answer settles the reservation
        return False

    def on_response(self, resp: Response) -> bool:
        entry = resp.entry
        body = resp.body
        producer_id = int(body.get("producer_id", -1)) if int(body.get("error_code", 0)) == 0 else -1
        pid_ms = self.enforcer.on_init_producer_id(
            self.conn.user,
            entry.client_id,
            producer_id,
            reserved=True,
            exempt=entry.exempt,
        )
        entry.throttle_ms = max(entry.throttle_ms, pid_ms)
        return False
