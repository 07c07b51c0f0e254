"""One quota across gateway replicas: who shares the quotas, and how much of each applies here.

Every replica counts what its own clients use of each cluster-wide quota and reports it, a few
times a second, through a topic on the Kafka cluster the gateway fronts (quota/cluster_report.py).
Each replica adds the others' usage into the same token buckets its own clients draw from, so a
client's bucket drains at the rate of all its connections on all replicas together, and the
throttle every replica computes is the throttle one proxy seeing everything would compute. Nothing
is divided up in advance: when load moves between replicas (clients stop, or a replica dies and
its clients reconnect elsewhere), the usage left is all there is, and it meets the whole quota.

When the exchange cannot be trusted, every replica must hold its quotas so that together they
never exceed them:

- a replica that has not read its own latest report back within ``staleness`` (the topic is down,
  or this replica is cut off from it) holds each quota divided by the number of replicas last
  seen, on its own clients alone (``local_only``);
- the others notice that replica's reports stop. Silence alone cannot tell a replica that died
  from one cut off, so they ask it (a liveness probe of its admin endpoint, the address it
  reported): one that answers, or cannot be reached yet, is cut off and keeps its part (quota /
  replicas), and the rest share what is left (``multiplier`` = 1 - cut off / replicas); one whose
  port refuses, or where another process answers, is gone and its part is free at once. A replica
  that cannot be reached at all for ``peer_grace`` is taken as gone.

Sans-IO: every call takes the time (ms, the caller's monotonic clock); the caller publishes,
reads the topic and runs the probes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Final

from quota.cluster_report import UsageReport


class ProbeOutcome(Enum):
    ALIVE = "alive"  # it answered with its own instance id: cut off from the exchange, not dead
    GONE = "gone"  # refused, or another instance answered: its clients are elsewhere now
    UNREACHABLE = "unreachable"  # no answer in time: counted as cut off until peer_grace


@dataclass(frozen=True, slots=True)
class ClusterMode:
    """How this replica holds its cluster-wide quotas now."""

    multiplier: float  # each quota applies here at quota x multiplier
    local_only: bool  # the others' usage is not added: this replica holds its part alone
    instances: int  # replicas sharing the quotas (this one, those live, those cut off)
    reason: str  # why not the normal exchange ("" when normal)
    cut_off: tuple[str, ...] = ()  # replicas holding their part alone

    @property
    def fallback(self) -> bool:
        return bool(self.reason)


NORMAL: Final = ClusterMode(1.0, False, 1, "")


class ClusterLink:
    """What the quota tables read at each request while the exchange runs: the mode, refreshed
    by the exchange a few times a second (plain attributes: nothing is computed per request)."""

    __slots__ = ("alone_since_ms", "drip_ms", "instances", "local_only", "multiplier", "sharing_since_ms")

    def __init__(self, drip_ms: float = 250.0) -> None:
        self.multiplier = 1.0
        self.local_only = False
        self.instances = 1
        self.drip_ms = drip_ms  # the others' usage is added over this long (their report interval)
        # Since when this replica has read the others' usage (it joined, or rejoined after holding
        # its part alone): before then it does not know what they gave out.
        self.sharing_since_ms = -math.inf
        self.alone_since_ms = -math.inf  # since when it last began to hold its part alone

    def set_mode(self, mode: ClusterMode) -> None:
        self.multiplier, self.local_only, self.instances = mode.multiplier, mode.local_only, mode.instances


class _Peer:
    __slots__ = ("address", "at_ms", "fallback", "heard_ms", "incarnation", "probe", "probe_due_ms", "seq")

    def __init__(self, report: UsageReport, now_ms: float) -> None:
        self.incarnation = report.incarnation
        self.address = report.address
        self.seq = report.seq
        self.at_ms = report.at_ms
        self.heard_ms = now_ms
        self.fallback = report.fallback
        self.probe: ProbeOutcome | None = None
        self.probe_due_ms = 0.0


class ClusterMembership:
    """The replicas this one shares quotas with, and the mode that follows (sans-IO)."""

    def __init__(
        self,
        instance: str,
        replicas: int,
        staleness_ms: float,
        now_ms: float,
        peer_grace_ms: float = 30_000.0,
        probe_interval_ms: float = 1000.0,
        incarnation: str = "",
    ) -> None:
        self.instance = instance
        self.incarnation = incarnation
        self.replicas = max(1, replicas)  # assumed until the exchange has told
        self.staleness_ms = staleness_ms
        self.peer_grace_ms = peer_grace_ms
        self.probe_interval_ms = probe_interval_ms
        self.started_ms = now_ms
        self.peers: dict[str, _Peer] = {}
        self.caught_up = False  # the topic's recent history has been read since (re)connecting
        self._published: dict[int, float] = {}  # own seq -> when published (for the round trip)
        self.own_seen_ms: float | None = None  # when our latest report came back
        self.round_trip_ms: float | None = None
        self.last_instances: int | None = None  # the count last seen while the exchange worked
        self.skipped_legacy = 0

    def reconfigure(self, replicas: int, staleness_ms: float) -> None:
        self.replicas = max(1, replicas)
        self.staleness_ms = staleness_ms

    # --- what comes in ---------------------------------------------------------------------

    def published(self, seq: int, now_ms: float) -> None:
        """This replica sent report ``seq`` (acknowledged by the broker)."""
        self._published[seq] = now_ms
        if len(self._published) > 64:
            for old in sorted(self._published)[:-32]:
                del self._published[old]

    def disconnected(self) -> None:
        """The exchange client lost the topic: reading restarts from recent history."""
        self.caught_up = False

    def accept(self, report: UsageReport, now_ms: float, wall_ms: float | None = None) -> float | None:
        """Take a report read from the topic; the factor its values are to be added with, or
        None when they are not to be added.

        Usage is added only once the topic's recent history has been read (``caught_up``): what
        the replicas used before this one (re)joined is past. A report is added once (by its
        sequence number, so reading the topic again after a reconnection adds nothing twice),
        and not from a replica that holds its part alone (``fallback``): its part is set aside.
        A version 1 report holds rates: the factor is the seconds since that replica's previous
        one (at most the staleness), which turns them into usage.

        With ``wall_ms`` (this replica's wall clock), a report made more than the staleness ago
        (held up in a cut-off replica's buffer, or read again from the topic's history) counts
        as heard that long ago, and its usage is not added: while it was on its way, this
        replica held that replica's part apart, or it is past.
        """
        if report.instance == self.instance:
            if report.incarnation != self.incarnation:
                return None  # the process this one replaced
            sent = self._published.pop(report.seq, None)
            if sent is not None:
                self.round_trip_ms = now_ms - sent
                self.own_seen_ms = now_ms
            return None
        if report.leaving:
            self.peers.pop(report.instance, None)
            return None
        age = 0.0 if wall_ms is None else max(0.0, wall_ms - report.at_ms)
        late = age > self.staleness_ms
        heard = now_ms - age if late else now_ms
        peer = self.peers.get(report.instance)
        if peer is not None and peer.incarnation != report.incarnation:
            if late:
                return None  # the process it replaced, read late: nothing to learn from it
            peer = None  # restarted under the same name: its reports count from 1 again
        if peer is None:
            self.peers[report.instance] = _Peer(report, heard)
            usable = self.caught_up and not report.fallback and not report.legacy_rates and not late
            return 1.0 if usable else None
        if report.legacy_rates:
            elapsed = min(max(0.0, report.at_ms - peer.at_ms), self.staleness_ms) / 1000.0
            factor: float | None = elapsed if elapsed > 0 else None
        elif report.seq <= peer.seq:
            return None  # read again after a reconnection, or out of order
        else:
            factor = 1.0
        peer.address, peer.seq, peer.fallback = report.address, report.seq, report.fallback
        peer.at_ms = report.at_ms
        if heard >= peer.heard_ms:
            peer.heard_ms, peer.probe = heard, None
        return factor if self.caught_up and not report.fallback and not late else None

    def forget(self, instance: str) -> None:
        self.peers.pop(instance, None)

    # --- liveness probes ---------------------------------------------------------------------

    def _silent(self, peer: _Peer, now_ms: float) -> bool:
        return now_ms - peer.heard_ms > self.staleness_ms

    def probes_due(self, now_ms: float) -> list[tuple[str, str]]:
        """(instance, address) of the silent replicas to ask now whether they are alive."""
        due = []
        for name, peer in self.peers.items():
            if self._silent(peer, now_ms) and peer.address and now_ms >= peer.probe_due_ms:
                peer.probe_due_ms = now_ms + self.probe_interval_ms
                due.append((name, peer.address))
        return due

    def probe_result(self, instance: str, outcome: ProbeOutcome, now_ms: float) -> None:
        peer = self.peers.get(instance)
        if peer is None or not self._silent(peer, now_ms):
            return  # it spoke meanwhile
        if outcome is ProbeOutcome.GONE:
            del self.peers[instance]
        else:
            peer.probe = outcome

    def _expire(self, now_ms: float) -> None:
        """Forget silent replicas that cannot be asked, and those that have not answered a probe
        (unreachable) past the grace; one that answers keeps its part for as long as it does."""
        for name in list(self.peers):
            peer = self.peers[name]
            if not self._silent(peer, now_ms):
                continue
            answered = peer.probe is ProbeOutcome.ALIVE
            if not peer.address or (not answered and now_ms - peer.heard_ms > self.peer_grace_ms):
                del self.peers[name]

    # --- the mode ----------------------------------------------------------------------------

    def connected(self, now_ms: float) -> bool:
        """Our own latest reports come back: what we read of the others is current."""
        seen = self.own_seen_ms
        return self.caught_up and seen is not None and now_ms - seen <= self.staleness_ms

    def mode(self, now_ms: float) -> ClusterMode:
        self._expire(now_ms)
        if not self.connected(now_ms):
            n = self.last_instances or self.replicas
            if self.own_seen_ms is None:
                why = "the exchange has not answered yet (starting)"
            elif not self.caught_up:
                why = "reconnecting to the exchange"
            else:
                silent = (now_ms - self.own_seen_ms) / 1000
                why = f"this replica's reports have not come back for {silent:.1f} s"
            return ClusterMode(1.0 / n, True, n, why)
        live = cut = 0
        cut_names = []
        for name, peer in self.peers.items():
            if self._silent(peer, now_ms) or peer.fallback:
                cut += 1
                cut_names.append(name)
            else:
                live += 1
        n = 1 + live + cut
        self.last_instances = n
        if not cut:
            return ClusterMode(1.0, False, n, "")
        names = ", ".join(sorted(cut_names))
        why = f"{cut} of {n} replicas hold their part alone (cut off from the exchange): {names}"
        return ClusterMode(1.0 - cut / n, False, n, why, tuple(sorted(cut_names)))

    def describe(self, now_ms: float) -> dict[str, object]:
        """For the admin endpoint."""
        mode = self.mode(now_ms)
        return {
            "instance": self.instance,
            "instances": mode.instances,
            "fallback": mode.fallback,
            "reason": mode.reason,
            "multiplier": round(mode.multiplier, 4),
            "local_only": mode.local_only,
            "own_lag_ms": self.round_trip_ms,
            "staleness_ms": self.staleness_ms,
            "others": [
                {
                    "instance": name,
                    "address": peer.address,
                    "silent_ms": round(now_ms - peer.heard_ms),
                    "fallback": peer.fallback,
                    "probe": peer.probe.value if peer.probe else None,
                }
                for name, peer in sorted(self.peers.items())
            ],
        }
