"""Cluster-wide volume quotas at run time: publish this proxy's share of the usage, follow
everybody's, and tell the pipelines whether produce requests pass, wait or are parked.

The policy is quota/volume.py (sans-IO); this module does the I/O around it:

- publisher: on start and every ``publish_interval_seconds``, measures usage (DescribeLogDirs to
  each broker it publishes for, or statvfs of the mounted log dirs) and publishes the Strimzi
  message keyed by broker id to the compacted topic (proxy/shared/exchange.py);
- consumer: every proxy reads the topic from its start and follows it; the live brokers come from
  Metadata every interval; the verdict (OPEN, THROTTLE with a delay, PAUSE) is re-evaluated on
  every record and every half second, logged when it changes and exported as metrics; every
  record is counted by its outcome (``RECORD_OUTCOMES``), and a bad one is logged (rate-limited);
- parking: in PAUSE a produce request is held (never forwarded) until the state leaves PAUSE,
  within ``max_parked_bytes`` in all and ``max_park_ms`` each; past either it is answered with a
  retriable error, so a client retries and nothing is lost or written twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.config import ProxyConfig, upstream_addresses
from proxy.net.upstream_client import UpstreamLogin, fetch_brokers
from proxy.ratelog import RateLimitedLog
from proxy.shared.exchange import CompactedTopic, ExchangeSettings, exchange_metrics, shown_value
from proxy.shared.volume_usage import Usage, describe_log_dirs_usage, statvfs_usage
from quota.volume import BrokerStatus, VolumeQuotas, VolumeState, VolumeVerdict
from quota.volume_config import VolumeConfig
from quota.volume_message import VolumeMessageError, decode, decode_key, encode_key

log = logging.getLogger(__name__)
skip_log = RateLimitedLog(log)

# What became of each record read from the topic (kthrottle_volume_records_total{outcome}).
RECORD_OUTCOMES = ("applied", "cleared", "invalid", "unreadable", "no_key")

_STATE_VALUE = {VolumeState.OPEN: 0, VolumeState.THROTTLE: 1, VolumeState.PAUSE: 2}
_TICK_SECONDS = 0.5


class VolumeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.state = Gauge(
            "kthrottle_volume_state", "Cluster volume state: 0 OPEN, 1 THROTTLE, 2 PAUSE", registry=r
        )
        self.fail_safe = Gauge(
            "kthrottle_volume_fail_safe",
            "1 while the state is the configured fail-safe action, for lack of fresh data from a live broker",
            registry=r,
        )
        self.delay_ms = Gauge(
            "kthrottle_volume_produce_delay_ms", "Delay for each produce request", registry=r
        )
        self.fraction = Gauge(
            "kthrottle_volume_worst_fraction",
            "The worst volume's way from its soft toward its hard limit (0 to 1)",
            registry=r,
        )
        self.broker_age = Gauge(
            "kthrottle_volume_snapshot_age_seconds",
            "Age of each broker's latest usage snapshot",
            ["broker"],
            registry=r,
        )
        self.publications = Counter(
            "kthrottle_volume_publications", "Usage snapshots published, by broker", ["broker"], registry=r
        )
        self.measure_errors = Counter(
            "kthrottle_volume_measure_errors", "Failed usage measurements (nothing published)", registry=r
        )
        self.parked_bytes = Gauge(
            "kthrottle_volume_parked_bytes", "Produce request bytes held while PAUSE", registry=r
        )
        self.parked = Counter(
            "kthrottle_volume_parked_requests",
            "Produce requests held by PAUSE, by outcome (forwarded, retriable: answered with a "
            "retriable error, dropped: acks=0, closed: the client left)",
            ["outcome"],
            registry=r,
        )
        records = Counter(
            "kthrottle_volume_records",
            "Records read from the volume usage topic, by outcome: applied (a broker's usage "
            "snapshot held), cleared (a tombstone: the broker's snapshot forgotten), invalid (a "
            "value that is not a usage message: that broker's state is unknown until a good one), "
            "unreadable (a key that is not a broker id) and no_key (a record without a key); the "
            "last three are logged, the last two skipped",
            ["outcome"],
            registry=r,
        )
        # Every outcome resolved now, so a scrape shows each at 0 before its first record.
        self.records = {outcome: records.labels(outcome) for outcome in RECORD_OUTCOMES}


class VolumeService:
    """One per proxy process; the pipelines ask it about each produce request."""

    def __init__(
        self,
        cfg: ProxyConfig,
        registry: CollectorRegistry,
        credentials: Callable[[], UpstreamLogin],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.vcfg: VolumeConfig = cfg.volume
        self.credentials = credentials
        self.wall_clock = wall_clock
        self.quotas = VolumeQuotas(self.vcfg.options(), self.now_ms())
        self.metrics = VolumeMetrics(registry)
        self.exchange = CompactedTopic(
            ExchangeSettings.of(cfg),
            self.vcfg.topic,
            self._on_record,
            exchange_metrics(registry),
            # Roll segments hourly so compaction keeps the topic to about one snapshot per
            # broker, and a proxy starting reads little before it knows the state.
            topic_configs={"segment.ms": "3600000", "delete.retention.ms": "600000"},
        )
        self.parked_bytes = 0
        self._unpaused = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_line = ""
        self._ages: set[str] = set()
        self._refresh()

    def now_ms(self) -> float:
        """Wall-clock epoch ms: snapshots carry their SnapshotAt in wall time."""
        return self.wall_clock() * 1000.0

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self.exchange.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._tick_loop(), name="volume-tick"))
        self._tasks.append(loop.create_task(self._cluster_loop(), name="volume-cluster"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.exchange.stop()

    def reconfigure(self, cfg: ProxyConfig) -> list[str]:
        """Limits, staleness, fail-safe and delays apply at once; the topic, source and exchange
        connection need a restart (returned as notes)."""
        notes = []
        old = self.vcfg
        new = cfg.volume
        fixed = ("topic", "source", "enabled")
        for name in fixed:
            if getattr(old, name) != getattr(new, name):
                notes.append(f"volume.{name} changed: takes effect at restart")
        self.cfg = cfg
        self.vcfg = new.model_copy(update={name: getattr(old, name) for name in fixed})
        self.quotas.reconfigure(self.vcfg.options())
        self._refresh()
        return notes

    # --- asking (the pipelines) ----------------------------------------------------------------------

    def verdict(self) -> VolumeVerdict:
        return self.quotas.evaluate(self.now_ms())

    def park(self, nbytes: int) -> bool:
        """Hold ``nbytes`` of a produce request while paused; False when over the memory bound."""
        if self.parked_bytes + nbytes > self.vcfg.max_parked_bytes:
            return False
        self.parked_bytes += nbytes
        self.metrics.parked_bytes.set(self.parked_bytes)
        return True

    def unpark(self, nbytes: int, outcome: str) -> None:
        self.parked_bytes -= nbytes
        self.metrics.parked_bytes.set(self.parked_bytes)
        self.metrics.parked.labels(outcome).inc()

    async def wait_unpaused(self, timeout_s: float) -> bool:
        """True once the state is no longer PAUSE, False when ``timeout_s`` passed first."""
        if self.verdict().state is not VolumeState.PAUSE:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._unpaused.wait(), timeout_s)
        return self.verdict().state is not VolumeState.PAUSE

    # --- consuming -------------------------------------------------------------------------------

    def _on_record(self, key: bytes | None, value: bytes | None) -> None:
        """Take one record of the topic; every record is counted by its outcome
        (``RECORD_OUTCOMES``), and a bad one is logged."""
        outcome = self._apply_record(key, value)
        self.metrics.records[outcome].inc()

    def _apply_record(self, key: bytes | None, value: bytes | None) -> str:
        if key is None:
            # The exchange hands over key and value only: the topic is named, not the offset.
            skip_log.log(
                logging.WARNING,
                "no_key",
                "volume topic %s: a record without a key skipped (value %s)",
                self.vcfg.topic,
                shown_value(value),
            )
            return "no_key"
        try:
            broker_id = decode_key(key)
        except VolumeMessageError as exc:
            skip_log.log(
                logging.WARNING,
                "unreadable",
                "volume topic %s: record with a bad key skipped: %s",
                self.vcfg.topic,
                exc,
            )
            return "unreadable"
        now = self.now_ms()
        if value is None:
            self.quotas.forget(broker_id)
            outcome = "cleared"
        else:
            try:
                snapshot = decode(value)
                status = self.quotas.update(broker_id, snapshot, now)
                outcome = "applied"
                if status in (BrokerStatus.STALE, BrokerStatus.FUTURE) and self.exchange.caught_up.is_set():
                    # Held, yet not counted as fresh: the broker's reporter or the clocks are off
                    # (the history read at start is old by nature, and newer records follow).
                    skip_log.log(
                        logging.WARNING,
                        status.value,
                        "volume topic: broker %d's snapshot is %s on arrival (age %.1f s, staleness "
                        "%.1f s; a negative age is a clock ahead of this one): its state is unknown "
                        "until a fresh one",
                        broker_id,
                        status.value,
                        (now - snapshot.snapshot_at_ms) / 1000,
                        self.quotas.options.staleness_ms / 1000,
                    )
            except VolumeMessageError as exc:
                # Not skipped: it superseded the broker's last snapshot on the compacted topic.
                skip_log.log(
                    logging.WARNING,
                    "invalid",
                    "volume topic: broker %d's record is not a usage message: %s; its state is "
                    "unknown until a good one",
                    broker_id,
                    exc,
                )
                self.quotas.reject(broker_id, str(exc), now)
                outcome = "invalid"
        self._refresh()
        return outcome

    def _refresh(self) -> None:
        """Re-evaluate: metrics, a log line when the state changes, wake parked requests."""
        now = self.now_ms()
        verdict = self.quotas.evaluate(now)
        m = self.metrics
        m.state.set(_STATE_VALUE[verdict.state])
        m.fail_safe.set(1 if verdict.fail_safe is not None else 0)
        m.delay_ms.set(verdict.delay_ms)
        m.fraction.set(verdict.fraction)
        ages = set()
        for view in verdict.brokers:
            age = view.age_ms(now)
            if age is not None:
                label = str(view.broker_id)
                ages.add(label)
                m.broker_age.labels(label).set(max(0.0, age / 1000.0))
        for gone in self._ages - ages:
            with contextlib.suppress(KeyError):
                m.broker_age.remove(gone)
        self._ages = ages
        line = f"{verdict.state.value}/{verdict.reason.value}/{verdict.fail_safe}/{verdict.undetermined}"
        if line != self._last_line:
            level = logging.INFO if verdict.state is VolumeState.OPEN else logging.WARNING
            log.log(level, "%s", verdict.describe())
            self._last_line = line
        if verdict.state is VolumeState.PAUSE:
            self._unpaused.clear()
        else:
            self._unpaused.set()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_SECONDS)
            try:
                self._refresh()
            except Exception:  # never let the evaluation loop die: parked requests wait on it
                log.exception("volume: re-evaluation failed")

    # --- live brokers and publishing --------------------------------------------------------------

    async def _cluster_loop(self) -> None:
        """Every publish interval: the live brokers, then this proxy's publications."""
        while True:
            try:
                nodes = await fetch_brokers(
                    upstream_addresses(self.cfg), self.cfg.connect_timeout_seconds, self.credentials()
                )
            except Exception as exc:  # a broker mid-restart may answer anything
                log.warning("volume: live brokers unknown: %s", exc)
                nodes = None
            try:
                if nodes is not None:
                    self.quotas.set_live_brokers([n for n, _h, _p in nodes], self.now_ms())
                    self._refresh()
                    if self.vcfg.source.publish:
                        await self._publish(nodes)
            except Exception:  # the loop must live on: without it every proxy fails safe
                log.exception("volume: publishing failed")
            await asyncio.sleep(self.vcfg.publish_interval_seconds)

    async def _publish(self, nodes: list[tuple[int, str, int]]) -> None:
        source = self.vcfg.source
        policy = self.vcfg.policy()
        measured: list[tuple[int, list[Usage]]] = []
        if source.type == "statvfs":
            assert source.broker_id is not None
            try:
                measured.append((source.broker_id, statvfs_usage(source.log_dirs)))
            except OSError as exc:
                self.metrics.measure_errors.inc()
                log.warning("volume: cannot measure %s: %s", ", ".join(source.log_dirs), exc)
        else:
            wanted = set(source.brokers) if source.brokers is not None else None
            for node_id, host, port in nodes:
                if wanted is not None and node_id not in wanted:
                    continue
                try:
                    usage = await describe_log_dirs_usage(
                        host, port, self.cfg.connect_timeout_seconds, self.credentials()
                    )
                except Exception as exc:  # closed mid-answer, undecodable answer, ...
                    self.metrics.measure_errors.inc()
                    log.warning("volume: DescribeLogDirs of broker %d failed: %r", node_id, exc)
                    continue
                measured.append((node_id, usage))
        for broker_id, usage in measured:
            snapshot = policy.snapshot(usage, int(self.now_ms()))
            if await self.exchange.publish(encode_key(broker_id), snapshot.encode()):
                self.metrics.publications.labels(str(broker_id)).inc()
