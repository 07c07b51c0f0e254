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
        yield from self._producer_ids(now)
        yield from self._request_time(now)
        yield from self._connections(now)

    def _producer_ids(self, now: float) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """KIP-936: new producer ids per second per user, and what the bloom filters hold."""
        quotas = self.enforcer.producer_ids
        rate = GaugeMetricFamily(
            "kthrottle_producer_id_rate",
            "New producer ids per second of each user (KIP-936)",
            labels=["user"],
        )
        throttle = CounterMetricFamily(
            "kthrottle_producer_id_throttle_time_ms",
            "Throttle time decided for each user by producer_ids_rate",
            labels=["user"],
        )
        memory = GaugeMetricFamily(
            "kthrottle_producer_id_filter_bytes",
            "Bytes held by each user's producer-id bloom filters",
            labels=["user"],
        )
        rows = sorted(quotas.snapshot(now), key=lambda row: -row[1])
        for user, measured, throttled, nbytes in rows[: self.max_series]:
            rate.add_metric([user], measured)
            throttle.add_metric([user], throttled)
            memory.add_metric([user], nbytes)
        rest = rows[self.max_series :]
        if rest:
            rate.add_metric([OTHER], sum(r[1] for r in rest))
            throttle.add_metric([OTHER], sum(r[2] for r in rest))
            memory.add_metric([OTHER], sum(r[3] for r in rest))
        total = GaugeMetricFamily(
            "kthrottle_producer_id_filter_bytes_total", "Bytes held by all producer-id bloom filters"
        )
        total.add_metric([], quotas.memory_bytes())
        yield from (rate, throttle, memory, total)

    def _request_time(self, now: float) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["user", "client_id"]
        pct = GaugeMetricFamily(
            "kthrottle_request_time_percentage",
            "Upstream request time of each request_percentage bucket, in percent of one second",
            labels=labels,
        )
        throttle = CounterMetricFamily(
            "kthrottle_request_time_throttle_time_ms",
            "Throttle time decided for each bucket by request_percentage",
            labels=labels,
        )
        rows = sorted(self.enforcer.request_time.snapshot(now), key=lambda row: -row[1])
        for (user, client_id), measured, throttled in rows[: self.max_series]:
            pct.add_metric([user, client_id], measured)
            throttle.add_metric([user, client_id], throttled)
        rest = rows[self.max_series :]
        if rest:
            pct.add_metric([OTHER, OTHER], sum(r[1] for r in rest))
            throttle.add_metric([OTHER, OTHER], sum(r[2] for r in rest))
        yield from (pct, throttle)

    def _connections(self, now: float) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rate = GaugeMetricFamily(
            "kthrottle_connection_creation_rate",
            "New connections per second of each client IP",
            labels=["ip"],
        )
        throttle = CounterMetricFamily(
            "kthrottle_connection_throttle_time_ms",
            "Time connections of each IP were held before being closed (KIP-612)",
            labels=["ip"],
        )
        rows = sorted(self.enforcer.connections.snapshot(now), key=lambda row: -row[1])
        for ip, measured, throttled in rows[: self.max_series]:
            rate.add_metric([ip], measured)
            throttle.add_metric([ip], throttled)
        rest = rows[self.max_series :]
        if rest:
            rate.add_metric([OTHER], sum(r[1] for r in rest))
            throttle.add_metric([OTHER], sum(r[2] for r in rest))
        yield from (rate, throttle)

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
