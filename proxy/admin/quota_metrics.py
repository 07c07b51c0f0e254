"""Per-entity and per-partition quota metrics, like Kafka's byte-rate and throttle-time sensors.

Collected at scrape time from the quota state, so the request path pays nothing for them. Label
cardinality is bounded: at most ``max_series`` entities (and as many partitions) of each table
get their own series, the rest one series labelled ``__other__``; so at most
``max_series + 1`` series per metric and direction. Which entities are named is stable: one
enters while it is among the busiest and there is room, and leaves only after
``HOLD_SCRAPES`` scrapes out of them (or when its state expires), so a series does not come and
go between scrapes. ``__other__`` counters only go up: they add what the unnamed entities
throttled since the previous scrape, whoever is named now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.shared.throttling import QuotaEnforcer
from quota.entities import bucket_quota

OTHER = "__other__"
HOLD_SCRAPES = 10  # scrapes an entity stays named after it left the busiest


class SeriesSelector:
    """Which entities of one table have series of their own, with hysteresis, and the running
    totals of the counters of those that do not."""

    def __init__(self) -> None:
        self.named: dict[tuple[str, ...], int] = {}  # key -> scrapes since it was among the busiest
        self._last: dict[tuple[str, ...], tuple[float, ...]] = {}
        self.other_counters: dict[int, float] = {}
        self.width = 0  # label values per row, as last seen (for __other__ once the rows are gone)

    def select(
        self, rows: list[tuple[Any, ...]], limit: int, counters: Sequence[int]
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Split ``rows`` (labels, then values; busiest first) into the named and the rest, and
        add the rest's counter increments (value indices ``counters``) to ``other_counters``."""
        if rows:
            self.width = len(rows[0][0])
        present = {row[0]: row[1:] for row in rows}
        busiest = {row[0] for row in rows[:limit]}
        for key in list(self.named):
            if key not in present:
                del self.named[key]
            elif key in busiest:
                self.named[key] = 0
            else:
                self.named[key] += 1
                if self.named[key] >= HOLD_SCRAPES:
                    del self.named[key]
        for row in rows[:limit]:
            if len(self.named) >= limit:
                break
            self.named.setdefault(row[0], 0)
        named = [row for row in rows if row[0] in self.named]
        rest = [row for row in rows if row[0] not in self.named]
        for key, *values in rest:
            before = self._last.get(key)
            for i in counters:
                grown = values[i] - (before[i] if before is not None else 0.0)
                if grown > 0:
                    self.other_counters[i] = self.other_counters.get(i, 0.0) + grown
        self._last = {key: tuple(values) for key, *values in rows}
        return named, rest


class QuotaCollector(Collector):
    def __init__(self, enforcer: QuotaEnforcer, max_series: int = 500) -> None:
        self.enforcer = enforcer
        self.max_series = max_series
        self._selectors: dict[str, SeriesSelector] = {}

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
        quota = GaugeMetricFamily(
            "kthrottle_client_quota",
            "The byte-rate quota (bytes per second) of each quota bucket with a series of its own in "
            "kthrottle_client_byte_rate: usage against quota is the ratio of the two",
            labels=["direction", "user", "client_id"],
        )
        usage = GaugeMetricFamily(
            "kthrottle_client_quota_usage_ratio",
            "Usage against quota of each quota bucket with a series of its own: "
            "kthrottle_client_byte_rate / kthrottle_client_quota (1: at its quota; alert on it)",
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
                table = f"clients:{direction}:shared"
                named = self._bounded(table, (rate, share, throttle), rows, prefix=(direction,))
            else:
                clients = [((a, b), r.measure(now), r.throttled_ms) for (a, b), r in quotas.clients.items()]
                clients.sort(key=lambda row: -row[1])
                named = self._bounded(f"clients:{direction}", (rate, throttle), clients, prefix=(direction,))
            for (a, b), measured, *_values in named:
                match = bucket_quota(quotas.cfg, (a, b), quotas.key)
                if match is not None:
                    quota.add_metric([direction, a, b], match.quota)
                    if match.quota > 0:
                        usage.add_metric([direction, a, b], measured / match.quota)
            parts = [((t, str(p)), r.measure(now), r.throttled_ms) for (t, p), r in quotas.partitions.items()]
            parts.sort(key=lambda row: -row[1])
            self._bounded(f"partitions:{direction}", (prate, pthrottle), parts, prefix=(direction,))
        yield from (rate, throttle, quota, usage, prate, pthrottle)
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
        table: str,
        families: Sequence[GaugeMetricFamily | CounterMetricFamily],
        rows: list[tuple[Any, ...]],
        combine: dict[int, Callable[[Iterable[float]], float]] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> list[tuple[Any, ...]]:
        """Add rows (label values, then one value per family), busiest first: the named ones
        (``SeriesSelector``, one per ``table``) get their own series, the rest one ``__other__``
        series (gauges summed unless ``combine`` says otherwise; counters the running total).
        ``prefix`` labels go before each row's. Returns the named rows."""
        selector = self._selectors.get(table)
        if selector is None:
            selector = self._selectors[table] = SeriesSelector()
        counters = [i for i, family in enumerate(families) if isinstance(family, CounterMetricFamily)]
        named, rest = selector.select(rows, self.max_series, counters)
        for labels, *values in named:
            for family, value in zip(families, values, strict=True):
                family.add_metric([*prefix, *labels], value)
        if rest or selector.other_counters:
            other = [*prefix, *[OTHER] * selector.width]
            for i, family in enumerate(families):
                if i in counters:
                    family.add_metric(other, selector.other_counters.get(i, 0.0))
                else:
                    aggregate = (combine or {}).get(i, sum)
                    family.add_metric(other, aggregate(r[i + 1] for r in rest) if rest else 0.0)
        return named

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
        self._bounded("producer_ids", (rate, throttle, memory), sorted(rows, key=lambda row: -row[1]))
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
        self._bounded("request_time", (pct, throttle), rows)
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
        self._bounded("connections", (rate, throttle), sorted(rows, key=lambda row: -row[1]))
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
        self._bounded("mutations", (tokens, rate, throttle), rows, combine={0: min})
        yield from (tokens, rate, throttle)
