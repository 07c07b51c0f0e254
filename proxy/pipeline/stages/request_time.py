"""request_percentage (KIP-124): the broker's time on a client's requests, as the proxy sees it
(the time from forwarding to the answer, a pipelined request's starting when the one before it
was answered). A Fetch's time is charged with its bytes (``FetchStage``).

The ApiVersions a client opens its connection with is charged once the proxy knows what kind
of listener it went to. On a SASL listener Kafka's authenticator answers it before the login,
and no request quota counts it; on any other, KafkaApis charges it as any request. The
request after it tells which: a SaslHandshake, or anything else (clients wait for the
ApiVersions answer before they send it). Only the connection's first request can be that
ApiVersions: the authenticator takes one, and fails a connection that sends another."""

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
        # Until the request after the connection's first: the correlation id of that first
        # request when it is an ApiVersions, and its time once answered (client id, seconds).
        self._opening: set[int] | None = set()
        self._opening_times: list[tuple[str, float]] = []
        self._answered_late: set[int] = set()  # still in flight when the opening ended
        self._logged_in = False  # the opening ended with a SaslHandshake

    def request_keys(self) -> Collection[int] | None:
        return EVERY_KEY if self.enforcer.request_time.active else ()

    def on_request(self, req: Request) -> bool:
        key = req.header.api_key
        opening = self._opening
        if opening is not None:
            if key == ApiKey.API_VERSIONS and not opening and self.conn.requests_in == 0:
                opening.add(req.header.correlation_id)  # the connection's first request
            else:
                self._end_opening(sasl=key == ApiKey.SASL_HANDSHAKE)
        if key in _PARKED_APIS or not self.enforcer.request_time_charged(key, req.acks):
            return False
        req.charge_time = True
        if req.fetch is None:
            req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        entry, enforcer = resp.entry, self.enforcer
        exempt = entry.exempt
        if entry.api_key == ApiKey.API_VERSIONS and self._opening_request(entry.correlation_id):
            if self._opening is not None:  # which listener is not known yet
                self._opening_times.append((entry.client_id, entry.busy))
                return False
            if self._logged_in:
                return False
        time_ms = enforcer.on_request_time(self.conn.user, entry.client_id, entry.api_key, entry.busy, exempt)
        if time_ms and not enforcer.dry_run and not exempt:
            entry.throttle_ms = max(entry.throttle_ms, time_ms)
        return False

    def on_close(self) -> None:
        """A connection closed before it said which listener it reached: charged, as a listener
        without SASL would (a probe that only asks ApiVersions is still a request)."""
        self._end_opening(sasl=False)

    def _opening_request(self, correlation_id: int) -> bool:
        opening = self._opening if self._opening is not None else self._answered_late
        if correlation_id in opening:
            opening.discard(correlation_id)
            return True
        return False

    def _end_opening(self, *, sasl: bool) -> None:
        """The opening is over: the ApiVersions times kept are dropped (a SASL login follows) or
        charged now; those still in flight are judged the same way when answered. Their
        throttle, if any, falls on the requests after them: the bucket holds their time."""
        if self._opening is None:
            return
        self._answered_late, self._opening = self._opening, None
        self._logged_in = sasl
        times, self._opening_times = self._opening_times, []
        if sasl:
            return
        for client_id, seconds in times:
            self.enforcer.record_request_time(self.conn.user, client_id, seconds)
