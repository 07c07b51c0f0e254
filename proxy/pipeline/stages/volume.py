"""Cluster-wide disk volume limits (the Strimzi proposal) at the produce path: a delay while
usage is over the soft limit; over the hard limit (PAUSE) a produce is parked, unforwarded, until
the volumes allow it, and later requests of the connection wait behind it (responses stay in
order). Past the memory bound or ``max_park_ms`` it is answered with a retriable error instead."""

from __future__ import annotations

import logging

from protocol import messages
from protocol.errors import ErrorCode
from proxy.pipeline.stages.base import Connection, InFlight, Request
from proxy.ratelog import RateLimitedLog
from proxy.shared.throttling import ProduceCharge
from proxy.shared.volume_service import VolumeService
from quota.volume import VolumeState

log = logging.getLogger(__name__)
pause_log = RateLimitedLog(log)

HOLD = "volume-pause"  # a produce is parked while the cluster's volumes are paused
PAUSED_MESSAGE = "kthrottle: cluster volume usage is at its hard limit (PAUSE); retry later"


class VolumeParking:
    """One connection's produce requests against the volume limits."""

    def __init__(self, conn: Connection, volume: VolumeService) -> None:
        self.conn = conn
        self.volume = volume
        # A parked produce of this connection waited max_park_ms in vain: while PAUSE lasts, the
        # produce requests read after it are answered at once (each waiting a full park in turn
        # would take them past the client's request timeout).
        self._timed_out = False

    def admit(self, req: Request, charge: ProduceCharge, exempt: bool = False) -> int | None:
        """The delay the volumes add (ms), or None when the request was parked or answered
        (never for an exempt client: the delay is reported, not applied)."""
        verdict = self.volume.verdict()
        if verdict.state is VolumeState.PAUSE and not self.conn.server.enforcer.dry_run and not exempt:
            self._park(req, charge)
            return None
        self._timed_out = False
        return verdict.delay_ms

    def _park(self, req: Request, charge: ProduceCharge) -> None:
        conn, volume = self.conn, self.volume
        held = conn.entry_for(req)
        if held.capture is not None:
            held.capture.on_produce(charge.partitions, charge.new_producer_ids, 0)
        entry: InFlight | None = None  # acks=0: nothing to answer
        if req.expects_response:
            entry = held
            conn.in_flight.append(entry)
        if self._timed_out:
            volume.metrics.parked.labels("retriable" if entry else "dropped").inc()
            self._answer(entry, req, "an earlier request waited its park out", mute=False)
            return
        size = len(req.frame)
        if not volume.park(size):
            volume.metrics.parked.labels("retriable" if entry else "dropped").inc()
            self._answer(entry, req, "the proxy's memory for parked requests is full")
            return
        outcome = ["closed"]  # set by _parked; the bytes are released however the task ends
        task = conn.spawn_held(HOLD, self._parked(entry, req, charge.throttle_ms, outcome), "parked produce")
        task.add_done_callback(lambda _t: volume.unpark(size, outcome[0]))

    async def _parked(
        self, entry: InFlight | None, req: Request, quota_throttle_ms: int, outcome: list[str]
    ) -> None:
        conn, volume = self.conn, self.volume
        resumed = await volume.wait_unpaused(volume.vcfg.max_park_ms / 1000.0)
        if conn.closed:
            return  # never forwarded: the client retries it on a new connection
        if resumed:
            outcome[0] = "forwarded"
            # Throttled as any produce now: its byte-rate charge, and the volumes' delay.
            throttle_ms = max(quota_throttle_ms, volume.verdict().delay_ms)
            if entry is not None:
                entry.sent_at = conn.loop.time()
                if throttle_ms:
                    entry.throttle_ms = throttle_ms
                    conn.hold_until_answered(entry)
            elif throttle_ms:
                conn.mute(throttle_ms)
            conn.send(req.frame)
        else:
            outcome[0] = "retriable" if entry is not None else "dropped"
            self._timed_out = True
            self._answer(entry, req, f"parked {volume.vcfg.max_park_ms} ms")

    def _answer(self, entry: InFlight | None, req: Request, why: str, mute: bool = True) -> None:
        """Answer a produce the proxy did not forward: retriable NOT_ENOUGH_REPLICAS for every
        partition and a throttle time, so the client backs off and retries; acks=0 gets nothing."""
        conn = self.conn
        throttle_ms = self.volume.vcfg.max_throttle_delay_ms
        pause_log.log(
            logging.WARNING,
            "volume-paused",
            "conn %d (%s, %s): produce not forwarded, volumes paused (%s)",
            conn.id,
            conn.user,
            req.client_id,
            why,
        )
        if entry is None:
            return
        answer = messages.produce_error_response(
            req.body, ErrorCode.NOT_ENOUGH_REPLICAS, PAUSED_MESSAGE, throttle_ms
        )
        entry.throttle_ms = throttle_ms if mute else 0  # the answer carries it either way
        conn.answer(entry, conn.encoded_answer(req.header, answer))
