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
        # Until the request after the connection's first shows which listener it reached: the
        # correlation id of that first request when it is an ApiVersions (kept while it is in
        # flight, decided or not), and its time once answered (client id, seconds).
        self._deciding = True
        self._opening_id: int | None = None
        self._opening_time: tuple[str, float] | None = None
        self._logged_in = False  # the opening ended with a SaslHandshake

    def request_keys(self) -> Collection[int] | None:
        return EVERY_KEY if self.enforcer.request_time.active else ()

    def on_request(self, req: Request) -> bool:
        key = req.header.api_key
        if self._deciding:
            if key == ApiKey.API_VERSIONS and self._opening_id is None and self.conn.requests_in == 0:
                self._opening_id = req.header.correlation_id  # the connection's first request
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
        if entry.api_key == ApiKey.API_VERSIONS and entry.correlation_id == self._opening_id:
            self._opening_id = None
            if self._deciding:  # which listener is not known yet
                self._opening_time = (entry.client_id, entry.busy)
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

    def _end_opening(self, *, sasl: bool) -> None:
        """The opening is over: the ApiVersions time kept is dropped (a SASL login follows) or
        charged now; one still in flight is judged the same way when answered. Its throttle, if
        any, falls on the requests after it: the bucket holds its time."""
        if not self._deciding:
            return
        self._deciding = False
        self._logged_in = sasl
        answered, self._opening_time = self._opening_time, None
        if answered is not None and not sasl:
            self.enforcer.record_request_time(self.conn.user, *answered)
