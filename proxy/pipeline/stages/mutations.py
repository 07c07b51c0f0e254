"""The controller mutation quota (KIP-599) for CreateTopics, CreatePartitions and DeleteTopics:
each topic is priced (asking the cluster where the request does not say) and admitted or refused
before anything is forwarded; later requests of the connection wait meanwhile. Topics the broker
refuses for its own reasons are refunded when its answer comes (see ``proxy.shared.admission``)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from protocol.frames import RequestHeader
from protocol.mutations import MUTATION_APIS
from proxy.pipeline.stages.base import Connection, InFlight, Request, Response, Stage
from proxy.shared import admission
from proxy.shared.admission import MutationState
from proxy.shared.throttling import QuotaEnforcer

HOLD = "admission"  # a mutation request is being priced: later requests wait behind it


class MutationStage(Stage):
    def __init__(self, conn: Connection, enforcer: QuotaEnforcer, capture: bool) -> None:
        self.conn = conn
        self.enforcer = enforcer
        self.capture = capture

    def request_keys(self) -> Collection[int]:
        return MUTATION_APIS if self.capture or self.enforcer.mutations.active else ()

    def on_request(self, req: Request) -> bool:
        conn, header = self.conn, req.header
        if not self.capture and not self.enforcer.mutation_quota_applies(conn.user, req.client_id):
            return False
        body = req.body
        charge_validate_only = conn.server.cfg.quotas.mutations.charge_validate_only
        state = admission.parse(header.api_key, header.api_version, body, charge_validate_only)
        if state is None:
            return False
        req.want_response(self)
        entry = conn.entry_for(req)
        entry.mutation = state
        entry.charge_time = self.enforcer.request_time_charged(header.api_key)
        conn.in_flight.append(entry)
        conn.spawn_held(HOLD, self._admit(entry, req.frame, header, body, state), "mutation admission")
        return True

    async def _admit(
        self,
        entry: InFlight,
        frame: bytes | bytearray,
        header: RequestHeader,
        body: dict[str, Any],
        state: MutationState,
    ) -> None:
        conn = self.conn
        state.costs = await admission.resolve_costs(state, conn.server.catalog)
        if conn.closed:
            return
        exempt = entry.exempt
        decided = await self.enforcer.on_mutation(conn.user, entry.client_id, state, conn.peer, exempt)
        if conn.closed:
            return
        entry.throttle_ms = state.throttle_ms
        if entry.throttle_ms:
            # As the broker: nothing more is read on this connection until the throttled
            # answer has gone out and its mute has passed.
            conn.hold_until_answered(entry)
        if entry.capture is not None:
            entry.capture.on_mutation(state.costs, state.accepted, decided)
        if not any(state.accepted):
            conn.answer(entry, conn.encoded_answer(header, admission.local_response(state)))
        else:
            rewritten = admission.upstream_request(state, body)
            if rewritten is not None:
                frame = bytearray(frame[: header.size]) + admission.encode_request(state, rewritten)
            conn.send(frame)

    def on_response(self, resp: Response) -> bool:
        state = resp.entry.mutation
        assert state is not None
        body = resp.body
        refused = admission.broker_refusals(state, body)
        if refused:
            self.enforcer.refund_mutations(state, refused)
        if state.partial:
            resp.replace_body(admission.merged(state, body))
        return False
