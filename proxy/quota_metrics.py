"""Per-entity and per-partition quota metrics, like Kafka's byte-rate and throttle-time sensors.

Collected at scrape time from the quota state, so the request path pays nothing for them. Label
cardinality is bounded: the ``max_series`` busiest entities (by current rate) and partitions get
their own series; the rest are summed into one series labelled ``__other__``.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.throttling import QuotaEnforcer
from quota.rate import SampledRate

OTHER = "__other__"


class QuotaCollector(Collector):
    def __init__(self, enforcer: QuotaEnforcer, max_series: int = 500) -> None:
        self.enforcer = enforcer
        self.max_series = max_series

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.enforcer.now_ms()
        rate = GaugeMetricFamily(
            "kthrottle_client_byte_rate",
            "Bytes per second of each quota bucket (user, client-id), as the quota measures it",
            labels=["direction", "user", "client_id"],
        )
        throttle = CounterMetricFamily(
            "kthrottle_client_throttle_time_ms",
            "Throttle time decided for each quota bucket (user, client-id)",
            labels=["direction", "user", "client_id"],
        )
        prate = GaugeMetricFamily(
            "kthrottle_partition_byte_rate",
            "Bytes per second of each topic-partition with a topic quota (KIP-1010)",
            labels=["direction", "topic", "partition"],
        )
        pthrottle = CounterMetricFamily(
            "kthrottle_partition_throttle_time_ms",
            "Throttle time decided for each topic-partition with a topic quota",
            labels=["direction", "topic", "partition"],
        )
        for quotas in (self.enforcer.produce, self.enforcer.fetch):
            direction = "produce" if quotas.produce else "fetch"
            for (a, b), measured, throttled in self._bounded(quotas.clients, now):
                rate.add_metric([direction, str(a), str(b)], measured)
                throttle.add_metric([direction, str(a), str(b)], throttled)
            for (topic, part), measured, throttled in self._bounded(quotas.partitions, now):
                prate.add_metric([direction, topic, str(part)], measured)
                pthrottle.add_metric([direction, topic, str(part)], throttled)
        yield from (rate, throttle, prate, pthrottle)
        yield from self._mutations(now)

    def _mutations(self, now: float) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """KIP-599's ControllerMutation sensors: tokens, mutation-rate, throttle-time."""
        labels = ["user", "client_id"]
        tokens = GaugeMetricFamily(
            "kthrottle_mutation_tokens",
            "Tokens left in each controller mutation bucket; below 0 the bucket is throttled",
            labels=labels,
        )
        rate = GaugeMetricFamily(
            "kthrottle_mutation_rate", "Partition mutations per second of each bucket", labels=labels
        )
        throttle = CounterMetricFamily(
            "kthrottle_mutation_throttle_time_ms",
            "Throttle time decided for each controller mutation bucket",
            labels=labels,
        )
        rows = sorted(self.enforcer.mutations.snapshot(now), key=lambda row: row[1])  # most throttled first
        for (user, client_id), left, measured, throttled in rows[: self.max_series]:
            tokens.add_metric([user, client_id], left)
            rate.add_metric([user, client_id], measured)
            throttle.add_metric([user, client_id], throttled)
        rest = rows[self.max_series :]
        if rest:
            tokens.add_metric([OTHER, OTHER], min(r[1] for r in rest))
            rate.add_metric([OTHER, OTHER], sum(r[2] for r in rest))
            throttle.add_metric([OTHER, OTHER], sum(r[3] for r in rest))
        yield from (tokens, rate, throttle)

    def _bounded(
        self, table: dict[tuple[str, str], SampledRate] | dict[tuple[str, int], SampledRate], now: float
    ) -> Iterator[tuple[tuple[str, str] | tuple[str, int], float, float]]:
        rows = sorted(
            ((k, r.measure(now), r.throttled_ms) for k, r in table.items()), key=lambda row: -row[1]
        )
        yield from rows[: self.max_series]
        rest = rows[self.max_series :]
        if rest:
            yield (OTHER, OTHER), sum(r[1] for r in rest), sum(r[2] for r in rest)
