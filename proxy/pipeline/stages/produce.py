"""What a Produce request costs: the byte-rate quotas (KIP-13 per client, KIP-1010 per
partition) and new producer ids (KIP-936) in one charge, then the cluster's volume limits (which
may delay it, or park it while they say PAUSE). Kafka charges header and body and appends first;
the throttle comes after: the response goes out with it and the connection stays muted for it."""

from __future__ import annotations

from collections.abc import Collection

from protocol.api_keys import ApiKey
from protocol.produce_scan import produce_partitions
from proxy.pipeline.stages.base import Connection, Request, Stage
from proxy.pipeline.stages.volume import VolumeParking
from proxy.shared.throttling import QuotaEnforcer
from proxy.shared.volume_service import VolumeService

_KEYS = frozenset({ApiKey.PRODUCE})


class ProduceStage(Stage):
    def __init__(
        self, conn: Connection, enforcer: QuotaEnforcer, volume: VolumeService | None, capture: bool
    ) -> None:
        self.conn = conn
        self.enforcer = enforcer
        self.parking = VolumeParking(conn, volume) if volume is not None else None
        self.capture = capture
        self._holds = conn.server.metrics.entity_holds.labels("Produce")

    def request_keys(self) -> Collection[int]:
        enforcer = self.enforcer
        charged = enforcer.produce.active or enforcer.producer_ids.active
        return _KEYS if charged or self.parking is not None or self.capture else ()

    def on_request(self, req: Request) -> bool:
        conn, enforcer = self.conn, self.enforcer
        client_id = req.client_id
        exempt = req.exempt
        if enforcer.produce.active and not exempt:
            wait = enforcer.hold_ms(True, conn.user, client_id)
            if wait:
                # Another connection of this client is being throttled: this one waits too,
                # before its request is read, as the throttled connection does.
                self._holds.inc()
                conn.wait_before(req.frame, wait)
                return True
        header = req.header
        partitions = produce_partitions(header.api_version, memoryview(req.frame)[header.size :])
        charge = enforcer.on_produce(conn.user, client_id, len(req.frame), partitions, exempt)
        decided = charge.throttle_ms
        if self.parking is not None:
            delay = self.parking.admit(req, charge, exempt)
            if delay is None:
                return True  # parked, or answered
            decided = max(decided, delay)
        if req.capture is not None:
            req.capture.on_produce(charge.partitions, charge.new_producer_ids, decided)
        req.throttle_ms = 0 if enforcer.dry_run or exempt else decided
        return False
