"""``quotas.client_id_policy.required``: a request a quota would charge, sent without a client id,
is answered POLICY_VIOLATION by the proxy and never forwarded, so no anonymous bucket is charged
(an acks=0 Produce, which has no answer, closes its connection instead: dropping it unseen would
lose data silently). Only looked at while the setting is on."""

from __future__ import annotations

import logging
from collections.abc import Collection

from protocol.api_keys import api_name
from protocol.errors import ErrorCode
from protocol.refusals import REFUSABLE_APIS, refusal_response
from proxy.pipeline.stages.base import Connection, Request, Stage
from proxy.ratelog import RateLimitedLog
from proxy.shared.throttling import QuotaEnforcer
from quota.client_id_policy import REQUIRED_MESSAGE

log = logging.getLogger("kthrottle.client_id")
refusal_log = RateLimitedLog(log)


class ClientIdRequired(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer) -> None:
        self.conn = conn
        self.enforcer = enforcer

    def request_keys(self) -> Collection[int]:
        return REFUSABLE_APIS if self.enforcer.client_id_policy.required else ()

    def on_request(self, req: Request) -> bool:
        header = req.header
        if not self.enforcer.client_id_policy.refuses(header.client_id):
            return False
        conn = self.conn
        name = api_name(header.api_key) or str(header.api_key)
        conn.server.metrics.client_id_refused.labels(name).inc()
        if not req.expects_response:
            conn.close("acks=0 Produce without a client id refused (client_id_policy.required)")
            return True
        refusal_log.log(
            logging.WARNING,
            "client-id-required",
            "conn %d from %s (%s): %s v%d without a client id refused (client_id_policy.required)",
            conn.id,
            conn.peer,
            conn.user,
            name,
            header.api_version,
        )
        entry = conn.entry_for(req)
        conn.in_flight.append(entry)
        answer = refusal_response(
            header.api_key, header.api_version, req.body, ErrorCode.POLICY_VIOLATION, REQUIRED_MESSAGE
        )
        conn.answer(entry, conn.encoded_answer(header, answer))
        return True
