"""Per-entity and per-partition quota metrics, like Kafka's byte-rate and throttle-time sensors.

Collected at scrape time from the quota state, so the request path pays nothing for them. Label
cardinality is bounded: the ``max_series`` busiest entities (by current rate) and partitions get
their own series; the rest are summed into one series labelled ``__other__``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.shared.throttling import QuotaEnforcer

OTHER = "__other__"


class QuotaCollector(Collector):
    def __init__(self, enforcer: QuotaEnforcer, max_series: int = 500) -> None:
        self.enforcer = enforcer
        self.max_series = max_series

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.enforcer.now_ms()
        rate = GaugeMetricFamily(
            "kthrottle_client_byte_rate",
            "Bytes per second of each quota bucket (user, client-id), as the quota measures it: "
            "with quotas shared across gateway replicas, all replicas' traffic",
            labels=["direction", "user", "client_id"],
        )
        share = GaugeMetricFamily(
            "kthrottle_client_byte_rate_this_replica",
            "This replica's part of kthrottle_client_byte_rate (quotas shared across gateway replicas)",
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
        shared = self.enforcer.cluster is not None
        for quotas in (self.enforcer.produce, self.enforcer.fetch):
            direction = "produce" if quotas.produce else "fetch"
            if shared:
                rows = []
                for (a, b), r in list(quotas.clients.items()):
                    mine, total = quotas.shared_rates((a, b), now)
                    rows.append(((a, b), total, mine, r.throttled_ms))
                rows.sort(key=lambda row: -row[1])
                self._bounded((rate, share, throttle), rows, prefix=(direction,))
            else:
                clients = [((a, b), r.measure(now), r.throttled_ms) for (a, b), r in quotas.clients.items()]
                self._bounded((rate, throttle), sorted(clients, key=lambda row: -row[1]), prefix=(direction,))
            parts = [((t, str(p)), r.measure(now), r.throttled_ms) for (t, p), r in quotas.partitions.items()]
            self._bounded((prate, pthrottle), sorted(parts, key=lambda row: -row[1]), prefix=(direction,))
        yield from (rate, throttle, prate, pthrottle)
        if shared:
            yield share
        tracked = GaugeMetricFamily(
            "kthrottle_quota_tracked",
            "Byte-rate quota state held in memory: buckets (user, client-id) and topic-partitions; "
            "idle ones expire after quotas.idle_expiry_seconds",
            labels=["direction", "kind"],
        )
        for quotas in (self.enforcer.produce, self.enforcer.fetch):
            direction = "produce" if quotas.produce else "fetch"
            tracked.add_metric([direction, "buckets"], len(quotas.clients))
            tracked.add_metric([direction, "partitions"], len(quotas.partitions))
        yield tracked
        yield from self._mutations(now)
        yield from self._producer_ids(now)
        yield from self._request_time(now)
        yield from self._connections(now)

    def _bounded(
        self,
        families: Sequence[GaugeMetricFamily | CounterMetricFamily],
        rows: list[tuple[Any, ...]],
        combine: dict[int, Callable[[Iterable[float]], float]] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> None:
        """Add rows (label values, then one value per family), busiest first: the first
        ``max_series`` get their own series, the rest one ``__other__`` series (summed unless
        ``combine`` says otherwise for a family). ``prefix`` labels go before each row's."""
        for labels, *values in rows[: self.max_series]:
            for family, value in zip(families, values, strict=True):
                family.add_metric([*prefix, *labels], value)
        rest = rows[self.max_series :]
        if rest:
            other = [*prefix, *[OTHER] * len(rest[0][0])]
            for i, family in enumerate(families):
                aggregate = (combine or {}).get(i, sum)
                family.add_metric(other, aggregate(r[i + 1] for r in rest))

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
        rows = [((user,), *values) for user, *values in quotas.snapshot(now)]
        self._bounded((rate, throttle, memory), sorted(rows, key=lambda row: -row[1]))
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
        self._bounded((pct, throttle), rows)
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
        rows = [((ip,), *values) for ip, *values in self.enforcer.connections.snapshot(now)]
        self._bounded((rate, throttle), sorted(rows, key=lambda row: -row[1]))
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
        self._bounded((tokens, rate, throttle), rows, combine={0: min})
        yield from (tokens, rate, throttle)
