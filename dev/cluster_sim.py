"""Gateway replicas sharing quotas through the exchange, in simulated time (sans-IO).

The real quota code (quota/manager.py, quota/cluster.py, the report's bytes from
quota/cluster_report.py) runs for each replica; what is simulated is time, the topic (every
report reaches every replica, its sender included, ``lag_ms`` after it is published) and the
clients: each connection of an entity sends a produce request of ``request_bytes`` as fast as its
share of the offered rate allows, and waits out the throttle it is answered with (KIP-219).

Used by tests/unit/test_cluster_quotas.py and bench/cluster_quota.py
(``simulated_error_50_replicas``).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quota.cluster import ClusterLink, ClusterMembership, ProbeOutcome
from quota.cluster_report import PRODUCE, PRODUCE_PARTITION, UsageReport, decode_record
from quota.config import QuotaConfig
from quota.manager import ByteRateQuotas


@dataclass
class SimReplica:
    name: str
    quotas: ByteRateQuotas
    membership: ClusterMembership
    link: ClusterLink
    seq: int = 0
    alive: bool = True
    cut_off: bool = False  # its reports reach nobody, and nothing reaches it


@dataclass
class SimConnection:
    entity: int
    replica: int
    offered_bps: float
    request_bytes: int
    stopped: bool = False


@dataclass
class Simulation:
    """``replicas`` replicas; ``entities`` client ids, each with a ``producer_byte_rate`` of
    ``quota``; the connections are given by ``connect``."""

    replicas: int
    quota: float
    request_bytes: int = 64 * 1024
    lag_ms: float = 50.0
    hot_ms: float = 250.0
    full_ms: float = 1000.0  # a report at least this often (the heartbeat)
    sweep_ms: float = 10_000.0  # every bucket's usage at least this often
    staleness_ms: float = 3000.0
    window: dict[str, float] = field(default_factory=lambda: {"num": 5, "size_seconds": 1})
    seed: int = 7
    nodes: list[SimReplica] = field(default_factory=list)
    connections: list[SimConnection] = field(default_factory=list)
    sent: dict[int, dict[int, float]] = field(default_factory=dict)  # entity -> 100 ms slot -> bytes
    sent_by_connection: dict[int, float] = field(default_factory=dict)  # connection -> bytes (all)
    _marks: dict[tuple[int, float], float] = field(default_factory=dict)
    _events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    now_ms: float = 0.0

    def __post_init__(self) -> None:
        cfg = QuotaConfig.model_validate(
            {"window": self.window, "clients": {"<default>": {"producer_byte_rate": self.quota}}}
        )
        rnd = random.Random(self.seed)
        for i in range(self.replicas):
            quotas = ByteRateQuotas(cfg, produce=True, now_ms=0.0)
            link = ClusterLink()
            quotas.cluster = link
            membership = ClusterMembership(
                f"r{i:03d}", self.replicas, self.staleness_ms, 0.0, incarnation=f"r{i:03d}"
            )
            membership.caught_up = True  # a running cluster: every replica has read the topic,
            membership.own_seen_ms = 0.0  # and its own reports come back
            self.nodes.append(SimReplica(f"r{i:03d}", quotas, membership, link))
            self._push(rnd.uniform(0, self.hot_ms), "publish", i)

    # --- set-up and changes -----------------------------------------------------------------

    def connect(
        self,
        entity: int,
        replica: int,
        offered_bps: float,
        at_ms: float | None = None,
        request_bytes: int | None = None,
    ) -> int:
        self.connections.append(
            SimConnection(entity, replica, offered_bps, request_bytes or self.request_bytes)
        )
        index = len(self.connections) - 1
        start = self.now_ms if at_ms is None else at_ms
        self._push(start + random.Random(index).uniform(0, 50), "send", index)
        return index

    def stop(self, connection: int) -> None:
        self.connections[connection].stopped = True

    def kill(self, replica: int) -> None:
        """SIGKILL: it reports nothing more, and its liveness probe is refused."""
        self.nodes[replica].alive = False

    def cut(self, replica: int, cut: bool = True) -> None:
        """Cut a replica off from the exchange (it still serves its clients), or heal it."""
        self.nodes[replica].cut_off = cut

    def at(self, at_ms: float, action: Callable[[], None]) -> None:
        self._push(at_ms, "call", action)

    # --- the run ---------------------------------------------------------------------------------

    def _push(self, at_ms: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._events, (at_ms, next(self._order), kind, payload))

    def run(self, until_ms: float) -> None:
        while self._events and self._events[0][0] <= until_ms:
            t, _o, kind, payload = heapq.heappop(self._events)
            self.now_ms = t
            if kind == "send":
                self._send(payload, t)
            elif kind == "publish":
                self._publish(payload, t)
            elif kind == "deliver":
                self._deliver(payload, t)
            elif kind == "call":
                payload()
        self.now_ms = until_ms

    def _send(self, index: int, t: float) -> None:
        conn = self.connections[index]
        node = self.nodes[conn.replica]
        if conn.stopped or not node.alive:
            return
        size = conn.request_bytes
        decision = node.quotas.record("", f"c{conn.entity}", size, [], t)
        slots = self.sent.setdefault(conn.entity, {})
        slot = int(t // 100)
        slots[slot] = slots.get(slot, 0.0) + size
        self.sent_by_connection[index] = self.sent_by_connection.get(index, 0.0) + size
        gap = size / conn.offered_bps * 1000.0
        self._push(t + max(gap, decision.throttle_ms), "send", index)

    def _publish(self, i: int, t: float) -> None:
        node = self.nodes[i]
        if not node.alive:
            return
        self._push(t + self.hot_ms, "publish", i)
        tick = int(t // self.hot_ms)
        sweep = tick % max(1, round(self.sweep_ms / self.hot_ms)) == 0
        beat = sweep or tick % max(1, round(self.full_ms / self.hot_ms)) == 0
        mode = node.membership.mode(t)
        if mode.local_only and not node.link.local_only:
            node.quotas.settle(t)
        changed = (mode.multiplier, mode.local_only) != (node.link.multiplier, node.link.local_only)
        rejoined = node.link.local_only and not mode.local_only
        node.link.set_mode(mode)
        if changed:
            node.quotas.mode_changed(rejoined, t)
        node.seq += 1
        report = UsageReport(node.name, node.seq, t, f"sim:{i}", mode.local_only, incarnation=node.name)
        buckets, parts = node.quotas.take_pending(not sweep, t)
        for (user, client), value, flags in buckets:
            report.add(PRODUCE, user, client, value, flags)
        for (topic, partition), value, flags in parts:
            report.add(PRODUCE_PARTITION, topic, str(partition), value, flags)
        if not beat and not len(report):
            node.seq -= 1
            return
        node.membership.published(node.seq, t)
        if not node.cut_off:
            self._push(t + self.lag_ms, "deliver", report.encode())
        for instance, address in node.membership.probes_due(t):
            target = self.nodes[int(address.split(":")[1])]
            outcome = ProbeOutcome.ALIVE if target.alive else ProbeOutcome.GONE
            node.membership.probe_result(instance, outcome, t)

    def _deliver(self, data: bytes, t: float) -> None:
        report = decode_record(data)
        assert isinstance(report, UsageReport)
        usage = [
            ((first, second), value)
            for kind, first, second, value in zip(
                report.kinds, report.firsts, report.seconds, report.values, strict=True
            )
            if kind == PRODUCE
        ]
        wanting = [
            ((first, second), value, flags)
            for kind, first, second, value, flags in zip(
                report.kinds, report.firsts, report.seconds, report.values, report.flags, strict=True
            )
            if kind == PRODUCE and flags
        ]
        for node in self.nodes:
            if not node.alive or node.cut_off:
                continue
            factor = node.membership.accept(report, t)
            if report.instance == node.name:
                continue  # its usage went into its buckets when it made the report
            if factor is not None:
                node.quotas.add_remote(usage, t)
                node.quotas.add_wanting(report.instance, wanting, [], t)

    # --- what came out ---------------------------------------------------------------------------

    def mark(self, at_ms: float) -> None:
        """Note every connection's bytes so far at ``at_ms`` (``connection_rate`` spans marks)."""

        def take() -> None:
            for index in range(len(self.connections)):
                self._marks[(index, at_ms)] = self.sent_by_connection.get(index, 0.0)

        self.at(at_ms, take)

    def connection_rate(self, index: int, from_ms: float, to_ms: float) -> float:
        """Bytes per second one connection got through between two marks."""
        sent = self._marks[(index, to_ms)] - self._marks[(index, from_ms)]
        return sent / ((to_ms - from_ms) / 1000.0)

    def rate(self, entity: int, from_ms: float, to_ms: float) -> float:
        """Bytes per second the entity got through between two times (100 ms resolution)."""
        slots = self.sent.get(entity, {})
        total = sum(v for s, v in slots.items() if from_ms <= s * 100 < to_ms)
        return total / ((to_ms - from_ms) / 1000.0)

    def reached_quota_after(
        self, entity: int, from_ms: float, to_ms: float, share: float = 0.9, span_ms: float = 2000.0
    ) -> float | None:
        """Seconds from ``from_ms`` until the entity's rate over the next ``span_ms`` is at least
        ``share`` of the quota and stays so to ``to_ms`` (None: never)."""
        first = None
        t = from_ms
        while t + span_ms <= to_ms:
            ok = self.rate(entity, t, t + span_ms) >= share * self.quota
            if ok and first is None:
                first = t
            elif not ok:
                first = None
            t += 100
        return None if first is None else (first - from_ms) / 1000.0
