"""Capture: one record per request (who, what, how many bytes per partition, the throttles
decided and the broker's), written for the analytics job. The draft is started when the request
is read; the other stages fill in what they decided; it is finished from the response."""

from __future__ import annotations

from protocol import messages
from protocol.api_keys import ApiKey
from proxy.capture.rows import CaptureDraft
from proxy.capture.writer import CaptureWriter
from proxy.pipeline.stages.base import EVERY_KEY, Connection, InFlight, Request, Response, Stage


class CaptureStage(Stage):
    def __init__(self, conn: Connection, writer: CaptureWriter) -> None:
        self.conn = conn
        self.writer = writer

    def request_keys(self) -> None:
        return EVERY_KEY

    def on_request(self, req: Request) -> bool:
        req.capture = CaptureDraft.of(req.header, len(req.frame))
        req.watch(self)
        return False

    def on_response(self, resp: Response) -> bool:
        entry = resp.entry
        draft = entry.capture
        assert draft is not None
        draft.response_bytes = resp.size
        key = entry.api_key
        # A fetch's partitions are what a fetch quota charges: decoded for the record. Other
        # responses (Produce among them: decoding each would cost more than the rest of the
        # capture) give their errors and broker throttle only when a stage decoded them anyway,
        # or when throttled (few are). Not a Metadata answer: its decode grows with the
        # cluster (half a second at 100,000 partitions), where passing it on does not.
        readable = resp.decoded or key == ApiKey.FETCH
        if not readable and entry.throttle_ms and resp.replacement is None and key != ApiKey.METADATA:
            readable = messages.can_read_response(key, entry.api_version)
        if not readable:
            return False
        draft.on_response(resp.body)
        if key == ApiKey.FETCH:
            if entry.fetch_charge is not None:
                draft.on_fetch(entry.fetch_charge.partitions, entry.fetch_charge.throttle_ms)
            else:  # no quota reads it: capture alone
                server = self.conn.server
                parts = messages.fetch_response_partitions(resp.body)
                unknown = server.topic_names.rename(parts)
                if unknown:
                    server.metrics.topic_ids.labels("unresolved").inc(len(unknown))
                    server.topic_lookup.wanted()
                draft.on_fetch(parts, 0)
        return False

    def on_done(self, entry: InFlight, upstream_ms: float) -> None:
        if entry.capture is not None:
            self._emit(entry.capture, entry, upstream_ms, waited=False)

    def _emit(self, draft: CaptureDraft, entry: InFlight, upstream_ms: float, waited: bool) -> None:
        """Hand one finished record to the writer (it never blocks). A record with topics still
        named by id waits once for the lookup under way, so the capture shows names."""
        conn = self.conn
        server = conn.server
        if draft.unnamed():
            lookup = server.topic_lookup
            if lookup.running and not waited:
                lookup.after(lambda: self._emit(draft, entry, upstream_ms, True))
                return
            server.topic_names.rename(draft.parts)  # what is left keeps its id (counted)
        self.writer.record(
            draft.row(
                self.writer.instance,
                conn.node_id,
                conn.id,
                conn.peer,
                conn.user,
                entry.client_id,
                entry.api_key,
                entry.api_version,
                entry.throttle_ms,
                upstream_ms,
                server.enforcer.dry_run or entry.exempt,
            )
        )
