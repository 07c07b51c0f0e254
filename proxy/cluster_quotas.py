"""``scope: cluster`` byte-rate quotas at run time: publish this instance's rates, read the others'.

The policy is quota/cluster.py. Every ``publish_interval_seconds`` this instance reports the rate
it measured for each cluster-scoped bucket (produce and fetch) to a topic keyed by instance id
(compacted, with a short retention: only the latest report of each instance matters), and reads
all reports, its own included: reading its own back is how it knows the exchange works. Metrics
say how many instances are live, whether the fallback (quota / instances) is in force, and how
old this instance's latest report was when it came back (the exchange's lag).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from proxy.config import ProxyConfig
from proxy.exchange import CompactedTopic, ExchangeSettings, exchange_metrics
from proxy.throttling import QuotaEnforcer
from quota.cluster import ClusterRates, ReportError, UsageReport, report

log = logging.getLogger(__name__)


class ClusterQuotaMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.instances = Gauge(
            "kthrottle_cluster_quota_instances",
            "Proxy instances sharing cluster-scoped quotas",
            registry=registry,
        )
        self.fallback = Gauge(
            "kthrottle_cluster_quota_fallback",
            "1 while the exchange is stale or down and each instance enforces quota / instances",
            registry=registry,
        )
        self.lag = Gauge(
            "kthrottle_cluster_quota_exchange_lag_seconds",
            "Time from publishing this instance's latest report to reading it back from the topic",
            registry=registry,
        )
        self.report_bytes = Gauge(
            "kthrottle_cluster_quota_report_bytes", "Size of this instance's latest report", registry=registry
        )
        self.buckets = Gauge(
            "kthrottle_cluster_quota_buckets",
            "Cluster-scoped buckets this instance reported",
            registry=registry,
        )


def default_instance() -> str:
    """Unique per process even where host names and pids repeat (containers run as pid 1)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


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
        # Reports carry wall-clock times; the quotas run on the enforcer's clock, so the rates
        # table is kept in wall time and asked in wall time through the adapter below.
        self.rates = ClusterRates(
            self.instance, ccfg.staleness_seconds * 1000.0, self.now_ms(), ccfg.assumed_instances
        )
        view = _WallClockView(self.rates, self.now_ms)
        enforcer.produce.cluster = view
        enforcer.fetch.cluster = view
        self.exchange = CompactedTopic(
            ExchangeSettings.of(cfg),
            ccfg.topic,
            self._on_record,
            exchange_metrics(registry),
            topic_configs={
                "cleanup.policy": "compact,delete",
                "retention.ms": str(int(ccfg.retention_seconds * 1000)),
                "segment.ms": str(int(ccfg.retention_seconds * 1000 / 4)),
            },
        )
        self._task: asyncio.Task[None] | None = None
        self._last_fallback: bool | None = None

    def now_ms(self) -> float:
        return self.wall_clock() * 1000.0

    def start(self) -> None:
        self.exchange.start()
        self._task = asyncio.get_running_loop().create_task(self._publish_loop(), name="cluster-quota")
        log.info("cluster quotas: instance %s, topic %s", self.instance, self.cfg.cluster_quotas.topic)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.exchange.stop()

    def reconfigure(self, cfg: ProxyConfig) -> list[str]:
        notes = []
        old, new = self.cfg.cluster_quotas, cfg.cluster_quotas
        if (old.topic, old.instance) != (new.topic, new.instance):
            notes.append("cluster_quotas.topic/instance changed: takes effect at restart")
        self.cfg = cfg.model_copy(
            update={"cluster_quotas": new.model_copy(update={"topic": old.topic, "instance": old.instance})}
        )
        self.rates.reconfigure(new.staleness_seconds * 1000.0)
        return notes

    def _on_record(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key:
                self.rates.forget(key.decode(errors="replace"))
            return
        try:
            got = UsageReport.decode(value)
        except ReportError as exc:
            log.warning("cluster quotas: report of %r skipped: %s", key, exc)
            return
        self.rates.update(got, self.now_ms())

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.cluster_quotas.publish_interval_seconds)
            try:
                await self._publish_once()
            except Exception:  # the loop must live on, or this instance falls back for good
                log.exception("cluster quotas: publishing failed")

    async def _publish_once(self) -> None:
        """Report this instance's rates; export the exchange's state; log fallback changes."""
        local = self.enforcer.now_ms()
        rates = self.enforcer.produce.cluster_rates(local) + self.enforcer.fetch.cluster_rates(local)
        mine = report(self.instance, self.now_ms(), rates)
        data = mine.encode()
        self.metrics.report_bytes.set(len(data))
        self.metrics.buckets.set(len(mine.rates))
        if self.exchange.connected:
            await self.exchange.publish(self.instance.encode(), data)
        status = self.rates.status(self.now_ms())
        self.metrics.instances.set(status.instances)
        self.metrics.fallback.set(1 if status.fallback else 0)
        if self.rates.round_trip_ms is not None:
            self.metrics.lag.set(max(0.0, self.rates.round_trip_ms / 1000.0))
        if status.fallback != self._last_fallback:
            if status.fallback:
                log.warning(
                    "cluster quotas: exchange stale or down, enforcing quota / %d instances", status.instances
                )
            elif self._last_fallback is not None:
                log.info("cluster quotas: exchange back, %d instances share the quotas", status.instances)
            self._last_fallback = status.fallback


class _WallClockView:
    """ClusterRates asked with the enforcer's (monotonic) times, answered in wall time."""

    def __init__(self, rates: ClusterRates, wall_ms: Callable[[], float]) -> None:
        self.rates = rates
        self.wall_ms = wall_ms

    def share(
        self, kind: str, bucket: tuple[str, str], quota: float, local_rate: float, _now_ms: float
    ) -> float:
        return self.rates.share(kind, bucket, quota, local_rate, self.wall_ms())
