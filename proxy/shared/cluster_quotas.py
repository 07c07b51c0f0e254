"""One quota across gateway replicas, at run time: report this replica's usage, add the others'.

The policy is quota/cluster.py (who shares, and the fallback) and quota/cluster_report.py (the
records). Every ``hot_interval_seconds`` this replica reports its usage of the buckets under
pressure (throttled, half their burst gone, or given out here faster than the others are told),
at least every ``publish_interval_seconds`` (a heartbeat, empty if need be), and every
``full_interval_seconds`` all the rest, to a topic on the Kafka cluster the gateway fronts; it
reads every replica's reports, its
own included (reading its own back is how it knows the exchange works), and adds the others'
usage into its buckets. A replica whose reports stop is asked over HTTP whether it is alive
(``/cluster/peer`` on its admin port). Mutation requests under a cluster-wide
``controller_mutation_rate`` go through the same topic (``ClusterMutations``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.config import ProxyConfig
from proxy.ratelog import RateLimitedLog
from proxy.shared.exchange import CompactedTopic, ExchangeSettings, exchange_metrics
from proxy.shared.throttling import QuotaEnforcer
from quota.cluster import ClusterLink, ClusterMembership, ClusterMode, ProbeOutcome
from quota.cluster_mutations import LogAdmission
from quota.cluster_report import (
    FETCH,
    FETCH_PARTITION,
    PRODUCE,
    PRODUCE_PARTITION,
    PRODUCER_ID,
    MutationRecord,
    ReportError,
    UsageReport,
    decode_record,
)

log = logging.getLogger(__name__)
skip_log = RateLimitedLog(log)
PROBE_TIMEOUT_SECONDS = 1.0
MAX_REPORTS_IN_FLIGHT = 16
MAX_REPORT_BYTES = 16 * 1024 * 1024
# kthrottle_cluster_quota_reports_total{direction}: published, unsent (this replica's reports), and
# what became of each record read from the topic, every one counted under one of the others.
REPORT_DIRECTIONS = ("published", "unsent", "applied", "skipped", "own", "mutation", "unreadable")


class ClusterQuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.instances = Gauge(
            "kthrottle_cluster_quota_instances",
            "Gateway replicas sharing the cluster-wide quotas (this one, those live, those cut off)",
            registry=registry,
        )
        self.fallback = Gauge(
            "kthrottle_cluster_quota_fallback",
            "1 while this replica cannot trust the exchange, or another replica is cut off from it, "
            "and the quotas are split (see kthrottle_cluster_quota_multiplier)",
            registry=registry,
        )
        self.multiplier = Gauge(
            "kthrottle_cluster_quota_multiplier",
            "The part of each cluster-wide quota enforced here: 1 normally; 1/replicas while this "
            "replica is cut off; 1 - cut off/replicas while others are",
            registry=registry,
        )
        self.lag = Gauge(
            "kthrottle_cluster_quota_exchange_lag_seconds",
            "Time from publishing this replica's latest report to reading it back from the topic",
            registry=registry,
        )
        self.report_bytes = Gauge(
            "kthrottle_cluster_quota_report_bytes",
            "Size of this replica's latest full report",
            registry=registry,
        )
        self.buckets = Gauge(
            "kthrottle_cluster_quota_buckets",
            "Buckets and partitions in this replica's latest full report",
            registry=registry,
        )
        reports = Counter(
            "kthrottle_cluster_quota_reports",
            "Usage reports, by direction: published; unsent (the exchange not connected, or too "
            "many in flight); and every record read: applied (another replica's usage added here), "
            "skipped (read but not added: history, a report read again, a replica in fallback), "
            "own (this replica's own report read back), mutation (a mutation record replayed), "
            "unreadable (a record that does not decode, or without a value: skipped and logged)",
            ["direction"],
            registry=registry,
        )
        # Every direction resolved now, so a scrape shows each at 0 before its first report.
        self.reports = {direction: reports.labels(direction) for direction in REPORT_DIRECTIONS}
        self.probes = Counter(
            "kthrottle_cluster_quota_probes",
            "Liveness probes of silent replicas, by outcome",
            ["outcome"],
            registry=registry,
        )


def _reason_kind(mode: ClusterMode) -> str | None:
    """What a change of mode is logged on: its kind and part, not the seconds in its reason."""
    if not mode.reason:
        return ""
    return f"{mode.local_only}:{mode.multiplier:.4f}:{','.join(mode.cut_off)}"


def default_instance() -> str:
    """Unique per process even where host names and pids repeat (containers run as pid 1)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def peer_host(cfg: ProxyConfig) -> str:
    """Where the other replicas reach this one: the config, else $KTHROTTLE_POD_IP (the chart
    sets it from the pod's IP), else the address the host name resolves to."""
    configured = cfg.cluster_quotas.peer_host or os.environ.get("KTHROTTLE_POD_IP")
    if configured:
        return configured
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return cfg.advertised_host


class ClusterQuotaService:
    def __init__(
        self,
        cfg: ProxyConfig,
        enforcer: QuotaEnforcer,
        registry: CollectorRegistry,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        ccfg = cfg.cluster_quotas
        self.instance = ccfg.instance or default_instance()
        self.enforcer = enforcer
        self.wall_clock = wall_clock
        self.metrics = ClusterQuotaMetrics(registry)
        self.incarnation = uuid.uuid4().hex[:12]
        self.membership = ClusterMembership(
            self.instance,
            ccfg.replicas,
            ccfg.staleness_seconds * 1000.0,
            enforcer.now_ms(),
            peer_grace_ms=ccfg.peer_grace_seconds * 1000.0,
            incarnation=self.incarnation,
        )
        self.link = ClusterLink()
        self.mode = self.membership.mode(enforcer.now_ms())
        self.link.set_mode(self.mode)
        self.link.alone_since_ms = enforcer.now_ms()  # starting: alone until it reads the exchange
        enforcer.attach_cluster(self.link, self)
        self.admin_port: int | None = cfg.admin.port if cfg.admin.enabled and cfg.admin.port else None
        self.host = peer_host(cfg)
        self.exchange = CompactedTopic(
            ExchangeSettings.of(cfg),
            ccfg.topic,
            lambda _k, _v: None,
            exchange_metrics(registry),
            retry_seconds=0.5,
            topic_configs={
                "cleanup.policy": "delete",
                "retention.ms": str(int(ccfg.retention_seconds * 1000)),
                "segment.ms": str(int(ccfg.retention_seconds * 1000 / 4)),
                "message.timestamp.type": "LogAppendTime",
                "max.message.bytes": str(MAX_REPORT_BYTES + 64 * 1024),
            },
            history_seconds=self._history_seconds(),
            on_timed_record=self._on_record,
            on_state=self._on_state,
            max_record_bytes=MAX_REPORT_BYTES,
            compression=None,  # reports compress themselves
        )
        self._seq = 0
        self._sending: set[asyncio.Task[None]] = set()
        self._probed: dict[str, ProbeOutcome] = {}
        self._waiting: dict[int, asyncio.Future[LogAdmission]] = {}  # our mutation requests
        self._tasks: list[asyncio.Task[None]] = []
        self._last_reason: str | None = None
        self._http: aiohttp.ClientSession | None = None

    def _history_seconds(self) -> float:
        """Records read at (re)connection: enough for the mutation replay (quota/cluster_mutations)."""
        window = self.cfg.quotas.controller_window
        return max(30.0, 3 * window.num * window.size_seconds, 3 * self.cfg.cluster_quotas.staleness_seconds)

    def now_ms(self) -> float:
        return self.enforcer.now_ms()

    @property
    def address(self) -> str | None:
        if self.admin_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.admin_port}"

    def start(self) -> None:
        self.exchange.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._publish_loop(), name="cluster-quota")]
        log.info(
            "cluster quotas: replica %s, topic %s, %d replica(s) assumed until the exchange tells",
            self.instance,
            self.cfg.cluster_quotas.topic,
            self.cfg.cluster_quotas.replicas,
        )

    async def stop(self) -> None:
        for task in [*self._tasks, *self._sending]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.exchange.connected:  # the others forget this replica at once, its part is free
            with contextlib.suppress(Exception):
                self._seq += 1
                leaving = UsageReport(
                    self.instance,
                    self._seq,
                    self.wall_clock() * 1000.0,
                    leaving=True,
                    incarnation=self.incarnation,
                )
                await asyncio.wait_for(self.exchange.publish(self.instance.encode(), leaving.encode()), 2.0)
        await self.exchange.stop()
        if self._http is not None:
            await self._http.close()

    def reconfigure(self, cfg: ProxyConfig) -> list[str]:
        notes = []
        old, new = self.cfg.cluster_quotas, cfg.cluster_quotas
        if (old.topic, old.instance) != (new.topic, new.instance):
            notes.append("cluster_quotas.topic/instance changed: takes effect at restart")
        self.cfg = cfg.model_copy(
            update={"cluster_quotas": new.model_copy(update={"topic": old.topic, "instance": old.instance})}
        )
        self.membership.reconfigure(new.replicas, new.staleness_seconds * 1000.0)
        return notes

    # --- reading -------------------------------------------------------------------------------

    def _on_state(self, caught_up: bool) -> None:
        if caught_up:
            self.membership.caught_up = True
        else:
            self.membership.disconnected()

    def _on_record(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> None:
        """Take one record of the topic; every record is counted under its direction
        (``REPORT_DIRECTIONS``), and one skipped as unreadable is logged."""
        direction = self._read_record(key, value, timestamp_ms)
        self.metrics.reports[direction].inc()

    def _read_record(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> str:
        if value is None:  # the replicas never write one: the topic is not compacted
            skip_log.log(logging.WARNING, "report", "cluster quotas: record %r without a value skipped", key)
            return "unreadable"
        try:
            record = decode_record(value)
        except ReportError as exc:
            skip_log.log(logging.WARNING, "report", "cluster quotas: record %r skipped: %s", key, exc)
            return "unreadable"
        if isinstance(record, MutationRecord):
            decided = self.enforcer.mutation_log.apply(record, float(timestamp_ms))
            waiting = self._waiting.pop(record.request, None) if record.instance == self.instance else None
            if waiting is not None and not waiting.done():
                waiting.set_result(decided)
            return "mutation"
        now = self.now_ms()
        factor = self.membership.accept(record, now, self.wall_clock() * 1000.0)
        if record.instance == self.instance:
            return "own"  # its usage went into the buckets when it was reported (and it came back)
        if factor is None:
            return "skipped"
        self._apply(record, factor, now)
        return "applied"

    def _apply(self, report: UsageReport, factor: float, now: float) -> None:
        """Add another replica's usage into this one's buckets."""
        for kind, (keys, values, flags) in report.grouped().items():
            if factor != 1.0:
                values = [v * factor for v in values]
            if kind == PRODUCER_ID:
                claims = [(user, int(pid)) for user, pid in keys]
                self.enforcer.producer_ids.add_remote_claims(report.instance, claims, now)
                continue
            table = self.enforcer.produce if kind in (PRODUCE, PRODUCE_PARTITION) else self.enforcer.fetch
            wanting = any(flags)
            if kind in (PRODUCE, FETCH):
                table.add_remote(zip(keys, values, strict=True), now)
                if wanting:
                    flagged = [(k, v, f) for k, v, f in zip(keys, values, flags, strict=True) if f]
                    table.add_wanting(report.instance, flagged, (), now)
            else:
                parts = [(topic, int(p)) for topic, p in keys]
                table.add_remote_partitions(zip(parts, values, strict=True), now)
                if wanting:
                    flagged_parts = [(k, v, f) for k, v, f in zip(parts, values, flags, strict=True) if f]
                    table.add_wanting(report.instance, (), flagged_parts, now)

    # --- publishing ----------------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        tick = 0
        while True:
            ccfg = self.cfg.cluster_quotas
            await asyncio.sleep(ccfg.hot_interval_seconds)
            tick += 1
            ticks_per_beat = max(1, round(ccfg.publish_interval_seconds / ccfg.hot_interval_seconds))
            ticks_per_full = max(1, round(ccfg.full_interval_seconds / ccfg.hot_interval_seconds))
            try:
                self._refresh_mode()
                full = tick % ticks_per_full == 0
                await self._publish_once(hot_only=not full, beat=full or tick % ticks_per_beat == 0)
                self._probe_silent()
            except Exception:  # the loop must live on, or this replica falls back for good
                log.exception("cluster quotas: publishing failed")

    def build_report(self, hot_only: bool) -> UsageReport:
        """This replica's usage since its last report (``hot_only``: of the buckets under pressure)."""
        self._seq += 1
        report = UsageReport(
            self.instance,
            self._seq,
            self.wall_clock() * 1000.0,
            self.address,
            self.mode.local_only,
            incarnation=self.incarnation,
        )
        for table, kind, part_kind in (
            (self.enforcer.produce, PRODUCE, PRODUCE_PARTITION),
            (self.enforcer.fetch, FETCH, FETCH_PARTITION),
        ):
            buckets, parts = table.take_pending(hot_only, self.now_ms())
            told = [(key, used, flags) for key, used, flags in buckets if used > 0 or flags]
            report.extend(
                kind, [k for k, _u, _f in told], [u for _k, u, _f in told], [f for _k, _u, f in told]
            )
            for (topic, partition), value, flags in parts:
                if value > 0 or flags:
                    report.add(part_kind, topic, str(partition), value, flags)
        # New producer ids go out in every report: each replica's storm of new producers is
        # held by its bucket, which counts the others' ids only once they are read.
        for user, pid in self.enforcer.producer_ids.take_claims():
            report.add(PRODUCER_ID, user, str(pid), 1.0)
        return report

    async def _publish_once(self, hot_only: bool, beat: bool = True) -> None:
        """Publish a report: of the buckets under pressure (``hot_only``) or of all usage not
        told yet; one with nothing to say only as a heartbeat (``beat``), which tells the
        others this replica lives and shows it that the exchange works."""
        report = self.build_report(hot_only)
        if not beat and not len(report):
            self._seq -= 1  # nothing to say: the next report takes this number
            return
        data = report.encode()
        if not hot_only:
            self.metrics.report_bytes.set(len(data))
            self.metrics.buckets.set(len(report))
        if not self.exchange.connected or len(self._sending) >= MAX_REPORTS_IN_FLIGHT:
            # Its usage is lost to the others: this replica's own reports stop coming back, and
            # after the staleness it holds its part alone.
            self.metrics.reports["unsent"].inc()
            return
        # Registered before it is sent: it may be read back before the acknowledgement comes.
        self.membership.published(report.seq, self.now_ms())
        # Not waited for: a topic that does not answer must not hold up the next tick, where
        # the mode is worked out.
        task = asyncio.get_running_loop().create_task(self._send(data))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, data: bytes) -> None:
        if await self.exchange.publish(self.instance.encode(), data):
            self.metrics.reports["published"].inc()

    def _refresh_mode(self) -> ClusterMode:
        now = self.now_ms()
        mode = self.membership.mode(now)
        if mode.local_only and not self.mode.local_only:
            # Own usage not reported yet goes into the buckets now; from now on, at once.
            self.enforcer.produce.settle(now)
            self.enforcer.fetch.settle(now)
            self.link.alone_since_ms = now
        previous, self.mode = self.mode, mode
        self.link.set_mode(mode)
        if (mode.multiplier, mode.local_only) != (previous.multiplier, previous.local_only):
            rejoined = previous.local_only and not mode.local_only
            if rejoined:
                self.link.sharing_since_ms = now
            self.enforcer.produce.mode_changed(rejoined, now)
            self.enforcer.fetch.mode_changed(rejoined, now)
        self.metrics.instances.set(mode.instances)
        self.metrics.fallback.set(1 if mode.fallback else 0)
        self.metrics.multiplier.set(mode.multiplier)
        if self.membership.round_trip_ms is not None:
            self.metrics.lag.set(max(0.0, self.membership.round_trip_ms / 1000.0))
        if _reason_kind(mode) != self._last_reason:
            if mode.reason:
                log.warning(
                    "cluster quotas: %s; enforcing %.3g of each quota here%s",
                    mode.reason,
                    mode.multiplier,
                    " on this replica's clients alone" if mode.local_only else "",
                )
            elif self._last_reason is not None:
                log.info("cluster quotas: exchange working, %d replica(s) share the quotas", mode.instances)
            self._last_reason = _reason_kind(mode)
        return mode

    # --- liveness of silent replicas ----------------------------------------------------------

    def _probe_silent(self) -> None:
        for instance, address in self.membership.probes_due(self.now_ms()):
            self._tasks.append(asyncio.get_running_loop().create_task(self._probe(instance, address)))
        self._tasks = [t for t in self._tasks if not t.done()]

    async def _probe(self, instance: str, address: str) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS))
        outcome = ProbeOutcome.UNREACHABLE
        try:
            async with self._http.get(f"http://{address}/cluster/peer") as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else {}
                answered = body.get("instance") if isinstance(body, dict) else None
                outcome = ProbeOutcome.ALIVE if answered == instance else ProbeOutcome.GONE
        except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
            # Refused: nothing listens there any more. Unreachable hosts time out instead.
            refused = isinstance(exc, ConnectionRefusedError) or isinstance(
                getattr(exc, "os_error", None), ConnectionRefusedError
            )
            outcome = ProbeOutcome.GONE if refused else ProbeOutcome.UNREACHABLE
        except (TimeoutError, aiohttp.ClientError, ValueError):
            outcome = ProbeOutcome.UNREACHABLE
        self.metrics.probes.labels(outcome.value).inc()
        self.membership.probe_result(instance, outcome, self.now_ms())
        if self._probed.get(instance) != outcome:  # said once per change, not every second
            self._probed[instance] = outcome
            log.info(
                "cluster quotas: replica %s at %s is silent; probe: %s", instance, address, outcome.value
            )

    # --- mutations (KIP-599) across replicas --------------------------------------------------

    async def admit_mutation(self, record: MutationRecord) -> LogAdmission | None:
        """Publish a mutation request and wait for the replay's answer to it (None: the
        exchange did not take it, or took longer than its request timeout)."""
        if not self.exchange.connected or self.mode.local_only:
            return None
        record = dataclasses.replace(record, instance=self.instance)
        future: asyncio.Future[LogAdmission] = asyncio.get_running_loop().create_future()
        self._waiting[record.request] = future
        try:
            if not await self.exchange.publish(f"m/{self.instance}".encode(), record.encode()):
                return None
            timeout = self.cfg.exchange.request_timeout_seconds
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            log.warning(
                "cluster quotas: mutation request %d not read back from the exchange in time; "
                "decided here on this replica's part of the quota",
                record.request,
            )
            return None
        finally:
            self._waiting.pop(record.request, None)

    def refund_mutation(self, record: MutationRecord) -> None:
        """Give back what the broker refused, in every replica's replay (not waited for)."""
        record = dataclasses.replace(record, instance=self.instance)

        async def send() -> None:
            if not await self.exchange.publish(f"m/{self.instance}".encode(), record.encode()):
                log.warning("cluster quotas: refund of %d partition mutations not published", record.refund)

        self._tasks.append(asyncio.get_running_loop().create_task(send()))

    def peer_answer(self) -> dict[str, object]:
        """What /cluster/peer says: who answers here, and whether it can trust the exchange."""
        return {"instance": self.instance, "fallback": self.mode.fallback, "reason": self.mode.reason}

    def describe(self) -> dict[str, object]:
        return self.membership.describe(self.now_ms())
