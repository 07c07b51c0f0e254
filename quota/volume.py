"""Cluster-wide disk volume quotas (the Strimzi proposal): OPEN, THROTTLE or PAUSE for produce. Sans-IO.

Every broker's usage arrives as a ``VolumeSnapshot`` (quota/volume_message.py) read from a compacted
topic; the proxy feeds them in with ``update``, tells the live broker ids with
``set_live_brokers``, and asks ``state``/``produce_delay_ms`` per produce request. Times are Unix
epoch milliseconds (``now_ms``, wall clock): staleness compares them with each snapshot's
SnapshotAt, which the publisher stamped from its own wall clock.

Limits. A volume's soft and hard limits are those its snapshot carries: the volume's own override,
else the message's broker-wide one. The publisher writes them from its config (``LimitPolicy``), so
every proxy judges a broker's volumes by the same limits whatever its local config says. Each limit
is turned into the consumed bytes at which it is reached on that volume:

- ConsumedSpace L: L bytes consumed;
- MinFreeBytes L: capacity - L consumed (free space down to L);
- MinFreePercentage p: capacity * (100 - p) / 100 consumed (free space down to p % of capacity).

so soft and hard limits of different types compare on one scale. A volume is OPEN up to and at its
soft threshold, THROTTLE past it, and PAUSE at or past its hard threshold (the proposal: "pausing
publication when at or over the hard limit"). When a volume's hard threshold is at or below its
soft one (mixed types on a small volume), it goes straight from OPEN to PAUSE at the hard one.

The delay curve. ``pressure`` = (consumed - soft) / (hard - soft): 0 at the soft threshold, 1 at the
hard one. In THROTTLE a volume asks for ``max(1, round(max_delay_ms * pressure))`` ms: linear from
the soft limit to the hard one, at least 1 ms so that THROTTLE always delays. The cluster's delay is
the largest over all counted volumes, which, the curve being monotonic, is the worst volume's. In
PAUSE it is ``max_delay_ms``, the delay the curve reaches at the hard limit: the proxy holds produce
bytes back then and may use it as the throttle time it tells clients.

Fail-safe. A live broker whose state cannot be determined (no snapshot, the last one stale or from
too far in the future, or its last record undecodable) is undetermined. With fail_safe LAST_KNOWN
(the default) a stale broker's last snapshot still counts for ``last_known_ms`` past its staleness
(its volumes fill no faster than they did: the state it last said, throttle included, holds), and
then, like a broker never heard from, it counts as open while the others still decide: one
broker's silent publisher cannot stop every producer of the cluster. With OPEN the undetermined
brokers count as open at once; with PAUSE (the proposal's choice, the strictest) the cluster is
PAUSE while any is. Before the live brokers are known (or when told none are), it is undetermined
as a whole: PAUSE, or with OPEN and LAST_KNOWN every fresh snapshot counts. Snapshots of brokers
not live are kept (a broker may come back) but never counted while it is not live.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quota.volume_message import LimitDefinition, LimitType, VolumeDetails, VolumeSnapshot


class VolumeState(enum.StrEnum):
    """The proposal's three states for produce traffic, mildest first."""

    OPEN = "open"
    THROTTLE = "throttle"
    PAUSE = "pause"

    @property
    def severity(self) -> int:
        """0, 1, 2: for a gauge, and to take the worst of several states."""
        return _SEVERITY[self]


_SEVERITY = {VolumeState.OPEN: 0, VolumeState.THROTTLE: 1, VolumeState.PAUSE: 2}


class FailSafe(enum.StrEnum):
    """What to do while a live broker's state is unknown (the proposal's default is PAUSE)."""

    LAST_KNOWN = "last_known"  # its last state for a bounded time, then open
    PAUSE = "pause"
    OPEN = "open"


class BrokerStatus(enum.StrEnum):
    """What is known of one broker's volumes now."""

    FRESH = "fresh"  # a snapshot no older than the staleness
    MISSING = "missing"  # no snapshot at all (or its tombstone)
    STALE = "stale"  # the last snapshot is older than the staleness
    FUTURE = "future"  # the last snapshot is stamped further ahead than the staleness (clock skew)
    INVALID = "invalid"  # the last record could not be decoded


class Reason(enum.StrEnum):
    """Why the cluster state is what it is: a metric label and the start of a log line."""

    WITHIN_LIMITS = "within_limits"  # every counted volume at or below its soft limit
    SOFT_LIMIT = "soft_limit"  # a volume past its soft limit
    HARD_LIMIT = "hard_limit"  # a volume at or past its hard limit
    UNKNOWN_BROKER = "unknown_broker"  # fail-safe PAUSE: a live broker's state is unknown
    NO_LIVE_BROKERS = "no_live_brokers"  # fail-safe PAUSE: the live brokers are not known


def threshold_bytes(limit: LimitDefinition, capacity: int) -> float:
    """The consumed bytes at which ``limit`` is reached on a volume of ``capacity`` bytes."""
    if limit.type is LimitType.CONSUMED_SPACE:
        return float(limit.level)
    if limit.type is LimitType.MIN_FREE_BYTES:
        return float(capacity - limit.level)
    return capacity * (100.0 - limit.level) / 100.0


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


@dataclass(frozen=True, slots=True)
class VolumeEvaluation:
    """One volume judged against its limits: where it stands between soft and hard, and its state."""

    broker_id: int
    name: str
    capacity: int
    consumed: int
    soft: LimitDefinition
    hard: LimitDefinition
    soft_bytes: float  # consumed bytes at which the soft limit is reached
    hard_bytes: float
    pressure: float  # 0 at soft, 1 at hard, below 0 under soft, above 1 past hard
    state: VolumeState

    @property
    def free(self) -> int:
        return self.capacity - self.consumed

    @property
    def fraction(self) -> float:
        """How far from the soft limit toward the hard one, 0 to 1 (the metric)."""
        return min(1.0, max(0.0, self.pressure))

    def delay_ms(self, max_delay_ms: int) -> int:
        """The produce delay this volume asks for (see the module docstring for the curve)."""
        if self.state is VolumeState.OPEN:
            return 0
        if self.state is VolumeState.PAUSE:
            return max_delay_ms
        return max(1, min(max_delay_ms, _round_half_up(max_delay_ms * self.pressure)))


def evaluate_volume(
    broker_id: int, volume: VolumeDetails, soft: LimitDefinition, hard: LimitDefinition
) -> VolumeEvaluation:
    """Judge one volume; ``soft``/``hard`` are the broker-wide limits, its own override first."""
    soft = volume.soft_limit or soft
    hard = volume.hard_limit or hard
    capacity, consumed = volume.capacity, volume.consumed
    soft_bytes = threshold_bytes(soft, capacity)
    hard_bytes = threshold_bytes(hard, capacity)
    if consumed >= hard_bytes:
        state = VolumeState.PAUSE
    elif consumed > soft_bytes:
        state = VolumeState.THROTTLE
    else:
        state = VolumeState.OPEN
    if hard_bytes > soft_bytes:
        pressure = (consumed - soft_bytes) / (hard_bytes - soft_bytes)
    elif state is VolumeState.PAUSE:  # no throttle band: hard is reached first
        pressure = 1.0
    else:  # below both; negative, closer to 0 the nearer the hard threshold
        pressure = (consumed - hard_bytes) / capacity
    return VolumeEvaluation(
        broker_id, volume.name, capacity, consumed, soft, hard, soft_bytes, hard_bytes, pressure, state
    )


def evaluate_snapshot(broker_id: int, snapshot: VolumeSnapshot) -> tuple[VolumeEvaluation, ...]:
    """Every volume of one broker's snapshot, judged by the limits it carries."""
    return tuple(
        evaluate_volume(broker_id, v, snapshot.soft_limit, snapshot.hard_limit) for v in snapshot.volumes
    )


@dataclass(frozen=True, slots=True)
class VolumeOverride:
    """A volume's own limits; None keeps the broker-wide one."""

    soft: LimitDefinition | None = None
    hard: LimitDefinition | None = None


@dataclass(frozen=True, slots=True)
class LimitPolicy:
    """The publisher's limits: broker-wide soft and hard, overridden per volume name."""

    soft: LimitDefinition
    hard: LimitDefinition
    overrides: Mapping[str, VolumeOverride] = field(default_factory=dict, hash=False)

    def limits_for(self, volume_name: str) -> tuple[LimitDefinition, LimitDefinition]:
        """(soft, hard) as they apply to the named volume."""
        override = self.overrides.get(volume_name)
        if override is None:
            return self.soft, self.hard
        return override.soft or self.soft, override.hard or self.hard

    def snapshot(self, volumes: Iterable[tuple[str, int, int]], snapshot_at_ms: int) -> VolumeSnapshot:
        """The message for (name, capacity, consumed) volumes measured at ``snapshot_at_ms``.

        Overridden limits ride on their volume; the others inherit the message's, as the proposal's
        note 2 has it, so readers need no config of their own to judge the volumes.
        """
        details = []
        for name, capacity, consumed in volumes:
            override = self.overrides.get(name, _NO_OVERRIDE)
            details.append(VolumeDetails(name, capacity, consumed, override.soft, override.hard))
        return VolumeSnapshot(snapshot_at_ms, self.soft, self.hard, tuple(details))


_NO_OVERRIDE = VolumeOverride()


@dataclass(frozen=True, slots=True)
class VolumeOptions:
    """The consumer's settings (volume config: staleness, fail_safe, max_throttle_delay_ms)."""

    staleness_ms: float = 60_000.0
    fail_safe: FailSafe = FailSafe.LAST_KNOWN
    max_delay_ms: int = 5_000
    last_known_ms: float = 300_000.0  # LAST_KNOWN: how long past its staleness a snapshot counts

    def __post_init__(self) -> None:
        if not self.staleness_ms > 0:
            raise ValueError(f"staleness_ms must be > 0, got {self.staleness_ms}")
        if self.last_known_ms < 0:
            raise ValueError(f"last_known_ms must be >= 0, got {self.last_known_ms}")
        if self.max_delay_ms < 1:
            raise ValueError(f"max_delay_ms must be >= 1, got {self.max_delay_ms}")


@dataclass(frozen=True, slots=True)
class BrokerView:
    """One broker as the quotas see it, for metrics, the admin endpoint and log lines."""

    broker_id: int
    live: bool
    status: BrokerStatus
    snapshot_at_ms: int | None  # of the snapshot held, used or not
    received_ms: float | None  # when it was handed to ``update``
    error: str | None  # why the last record was refused (status INVALID)
    worst: VolumeEvaluation | None  # its volume of highest pressure (when FRESH)

    def age_ms(self, now_ms: float) -> float | None:
        """How old its snapshot is (negative when stamped ahead of ``now_ms``); None without one."""
        return None if self.snapshot_at_ms is None else now_ms - self.snapshot_at_ms


@dataclass(frozen=True, slots=True)
class VolumeVerdict:
    """The cluster's state at ``computed_ms`` and all that went into it; valid until ``valid_until_ms``."""

    state: VolumeState
    delay_ms: int  # for each produce request (see the module docstring)
    reason: Reason
    fail_safe: FailSafe | None  # the action taken for lack of data; None when every live broker is known
    undetermined: tuple[tuple[int, BrokerStatus], ...]  # live brokers of unknown state, by id
    worst: VolumeEvaluation | None  # the counted volume of highest pressure
    volumes: tuple[VolumeEvaluation, ...]  # every counted volume
    brokers: tuple[BrokerView, ...]  # every broker live or with a record, by id
    live_known: bool  # whether the live brokers were known (and not none)
    computed_ms: float
    valid_until_ms: float

    @property
    def fraction(self) -> float:
        """The worst counted volume's way from soft toward hard, 0 to 1."""
        return self.worst.fraction if self.worst is not None else 0.0

    def describe(self) -> str:
        """One log line: the state, why, and which brokers are unknown."""
        parts = [f"volume state {self.state.value} ({self.reason.value})"]
        if self.state is not VolumeState.OPEN:
            parts.append(f"delay {self.delay_ms} ms")
        w = self.worst
        if w is not None:
            parts.append(
                f"worst broker {w.broker_id} volume {w.name}: {w.consumed}/{w.capacity} bytes used, "
                f"{w.fraction:.1%} of the way from soft ({w.soft.type.value} {w.soft.level}) "
                f"to hard ({w.hard.type.value} {w.hard.level})"
            )
        if not self.live_known:
            parts.append("live brokers unknown")
        if self.undetermined:
            unknown = ", ".join(f"{b} {s.value}" for b, s in self.undetermined)
            parts.append(f"unknown brokers: {unknown}")
        if self.fail_safe is not None:
            parts.append(f"fail-safe {self.fail_safe.value}")
        return "; ".join(parts)


class _Broker:
    __slots__ = ("error", "evaluations", "received_ms", "snapshot")

    def __init__(self) -> None:
        self.snapshot: VolumeSnapshot | None = None
        self.evaluations: tuple[VolumeEvaluation, ...] = ()
        self.received_ms: float | None = None
        self.error: str | None = None


class VolumeQuotas:
    """The cluster's volume state from the brokers' snapshots and the live broker ids.

    ``evaluate`` is cached: it changes only when fed (update, set_live_brokers, reject, forget,
    reconfigure) or when a snapshot crosses its staleness, so asking per produce request is cheap.
    """

    def __init__(self, options: VolumeOptions, now_ms: float) -> None:
        self.options = options
        self.live: frozenset[int] | None = None  # None until told
        self.live_at_ms: float | None = None
        self.started_ms = now_ms
        self._brokers: dict[int, _Broker] = {}
        self._verdict: VolumeVerdict | None = None

    # --- feeding ---------------------------------------------------------------------------

    def reconfigure(self, options: VolumeOptions) -> None:
        """New staleness, fail-safe or max delay; the snapshots held are judged anew."""
        self.options = options
        self._verdict = None

    def update(self, broker_id: int, snapshot: VolumeSnapshot, now_ms: float) -> BrokerStatus:
        """Hold a broker's latest snapshot (the topic's order decides: the last one read wins).

        Returns the broker's status with it, so the caller can log a snapshot that is already stale.
        """
        broker = self._brokers.get(broker_id)
        if broker is None:
            broker = self._brokers[broker_id] = _Broker()
        broker.snapshot = snapshot
        broker.evaluations = evaluate_snapshot(broker_id, snapshot)
        broker.received_ms = now_ms
        broker.error = None
        self._verdict = None
        return self._status(broker, now_ms)

    def reject(self, broker_id: int, error: str, now_ms: float) -> None:
        """The broker's last record could not be decoded: its state is unknown until a good one.

        The snapshot held before is kept for display but no longer counted: the bad record
        superseded it on the compacted topic.
        """
        broker = self._brokers.get(broker_id)
        if broker is None:
            broker = self._brokers[broker_id] = _Broker()
        broker.error = error
        broker.received_ms = now_ms
        self._verdict = None

    def forget(self, broker_id: int) -> None:
        """A tombstone for the broker: drop what is held (a live broker is then MISSING)."""
        if self._brokers.pop(broker_id, None) is not None:
            self._verdict = None

    def set_live_brokers(self, broker_ids: Iterable[int], now_ms: float) -> None:
        """The brokers the cluster says are live now; each must have a fresh snapshot.

        What is held for a broker not live whose snapshot can no longer count (stale, invalid or
        none) is dropped, so records of brokers long gone do not pile up: should it come back it
        is MISSING rather than STALE, undetermined either way.
        """
        live = frozenset(broker_ids)
        self.live_at_ms = now_ms
        if live != self.live:
            self.live = live
            self._verdict = None
        unusable = (BrokerStatus.STALE, BrokerStatus.INVALID, BrokerStatus.MISSING)
        gone = [
            b
            for b, broker in self._brokers.items()
            if b not in live and self._status(broker, now_ms) in unusable
        ]
        for broker_id in gone:
            del self._brokers[broker_id]
        if gone:
            self._verdict = None

    # --- asking ----------------------------------------------------------------------------

    def state(self, now_ms: float) -> VolumeState:
        return self.evaluate(now_ms).state

    def produce_delay_ms(self, now_ms: float) -> int:
        """The delay for a produce request now: 0 when OPEN (see the module docstring)."""
        return self.evaluate(now_ms).delay_ms

    def evaluate(self, now_ms: float) -> VolumeVerdict:
        """The cluster's verdict now, from the cache while nothing it rests on has changed."""
        verdict = self._verdict
        if verdict is not None and verdict.computed_ms <= now_ms < verdict.valid_until_ms:
            return verdict
        verdict = self._verdict = self._compute(now_ms)
        return verdict

    def brokers(self, now_ms: float) -> tuple[BrokerView, ...]:
        """Every broker live or with a record, by id: per-broker freshness for metrics."""
        return self.evaluate(now_ms).brokers

    def _status(self, broker: _Broker | None, now_ms: float) -> BrokerStatus:
        if broker is None:
            return BrokerStatus.MISSING
        if broker.error is not None:
            return BrokerStatus.INVALID
        if broker.snapshot is None:
            return BrokerStatus.MISSING
        age = now_ms - broker.snapshot.snapshot_at_ms
        staleness = self.options.staleness_ms
        if age > staleness:
            return BrokerStatus.STALE
        if age < -staleness:
            return BrokerStatus.FUTURE
        return BrokerStatus.FRESH

    def _next_change_ms(self, now_ms: float) -> float:
        """When the first held snapshot changes status by time alone (inf when none will)."""
        staleness = self.options.staleness_ms
        soonest = math.inf
        for broker in self._brokers.values():
            if broker.snapshot is None or broker.error is not None:
                continue
            at = broker.snapshot.snapshot_at_ms
            if now_ms < at - staleness:  # FUTURE until at - staleness
                soonest = min(soonest, at - staleness)
            elif now_ms <= at + staleness:  # FRESH up to and at at + staleness
                soonest = min(soonest, math.nextafter(at + staleness, math.inf))
            elif now_ms <= at + staleness + self.options.last_known_ms:  # last known, then not
                soonest = min(soonest, math.nextafter(at + staleness + self.options.last_known_ms, math.inf))
        return soonest

    def _last_known(self, broker: _Broker | None, status: BrokerStatus, now_ms: float) -> bool:
        """Under LAST_KNOWN, a stale snapshot still counts: up to ``last_known_ms`` past its
        staleness."""
        if self.options.fail_safe is not FailSafe.LAST_KNOWN or status is not BrokerStatus.STALE:
            return False
        assert broker is not None and broker.snapshot is not None
        age = now_ms - broker.snapshot.snapshot_at_ms
        return age <= self.options.staleness_ms + self.options.last_known_ms

    def _compute(self, now_ms: float) -> VolumeVerdict:
        opts = self.options
        live = self.live
        live_known = bool(live)
        ids = sorted(set(self._brokers) | (live or frozenset()))
        views: list[BrokerView] = []
        counted: list[VolumeEvaluation] = []
        undetermined: list[tuple[int, BrokerStatus]] = []
        for broker_id in ids:
            broker = self._brokers.get(broker_id)
            status = self._status(broker, now_ms)
            is_live = live is not None and broker_id in live
            fresh = status is BrokerStatus.FRESH
            usable = fresh or self._last_known(broker, status, now_ms)
            evaluations = broker.evaluations if usable and broker is not None else ()
            if is_live or not live_known:
                counted.extend(evaluations)
            if is_live and not fresh:
                undetermined.append((broker_id, status))
            views.append(
                BrokerView(
                    broker_id,
                    is_live,
                    status,
                    broker.snapshot.snapshot_at_ms if broker and broker.snapshot else None,
                    broker.received_ms if broker else None,
                    broker.error if broker else None,
                    max(evaluations, key=_by_pressure, default=None),
                )
            )
        worst = max(counted, key=_by_pressure, default=None)
        data_state = max((v.state for v in counted), key=_severity, default=VolumeState.OPEN)
        delay = max((v.delay_ms(opts.max_delay_ms) for v in counted), default=0)
        reason = {
            VolumeState.OPEN: Reason.WITHIN_LIMITS,
            VolumeState.THROTTLE: Reason.SOFT_LIMIT,
            VolumeState.PAUSE: Reason.HARD_LIMIT,
        }[data_state]
        state = data_state
        fail_safe: FailSafe | None = None
        if not live_known or undetermined:
            fail_safe = opts.fail_safe
            if fail_safe is FailSafe.PAUSE and data_state is not VolumeState.PAUSE:
                state, delay = VolumeState.PAUSE, opts.max_delay_ms
                reason = Reason.NO_LIVE_BROKERS if not live_known else Reason.UNKNOWN_BROKER
        return VolumeVerdict(
            state=state,
            delay_ms=delay,
            reason=reason,
            fail_safe=fail_safe,
            undetermined=tuple(undetermined),
            worst=worst,
            volumes=tuple(counted),
            brokers=tuple(views),
            live_known=live_known,
            computed_ms=now_ms,
            valid_until_ms=self._next_change_ms(now_ms),
        )

    def describe(self, now_ms: float) -> dict[str, object]:
        """The state for the admin endpoint, JSON-serialisable."""
        v = self.evaluate(now_ms)
        return {
            "state": v.state.value,
            "reason": v.reason.value,
            "delay_ms": v.delay_ms,
            "fail_safe": v.fail_safe.value if v.fail_safe else None,
            "configured_fail_safe": self.options.fail_safe.value,
            "staleness_ms": self.options.staleness_ms,
            "max_delay_ms": self.options.max_delay_ms,
            "live_brokers": sorted(self.live) if self.live is not None else None,
            "undetermined": [{"broker_id": b, "status": s.value} for b, s in v.undetermined],
            "fraction": v.fraction,
            "worst": _volume_json(v.worst) if v.worst else None,
            "brokers": [
                {
                    "broker_id": b.broker_id,
                    "live": b.live,
                    "status": b.status.value,
                    "snapshot_at_ms": b.snapshot_at_ms,
                    "age_ms": b.age_ms(now_ms),
                    "received_ms": b.received_ms,
                    "error": b.error,
                    "worst": _volume_json(b.worst) if b.worst else None,
                }
                for b in v.brokers
            ],
            "message": v.describe(),
        }


def _by_pressure(v: VolumeEvaluation) -> float:
    return v.pressure


def _severity(s: VolumeState) -> int:
    return s.severity


def _volume_json(v: VolumeEvaluation) -> dict[str, object]:
    return {
        "broker_id": v.broker_id,
        "volume": v.name,
        "capacity": v.capacity,
        "consumed": v.consumed,
        "free": v.free,
        "soft": {"type": v.soft.type.value, "level": v.soft.level, "bytes": v.soft_bytes},
        "hard": {"type": v.hard.type.value, "level": v.hard.level, "bytes": v.hard_bytes},
        "pressure": v.pressure,
        "fraction": v.fraction,
        "state": v.state.value,
    }
