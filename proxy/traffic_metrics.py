"""Per-API traffic counters kept as plain Python numbers and exposed to Prometheus at scrape time.

Every request and response updates them, so they cost what an integer addition costs: a
prometheus_client child takes a lock per update (about a microsecond per request for the four
of them). The event loop is the only writer, so no lock is needed; a scrape reads them whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.api_keys import api_name

LATENCY_BUCKETS: Final[tuple[float, ...]] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def latency_bucket(seconds: float) -> int:
    """The index of the first bound at or above ``seconds`` (``bisect_left``, as a compiled loop
    over unboxed floats: most latencies end it within the first few bounds)."""
    index = 0
    for bound in LATENCY_BUCKETS:
        if seconds <= bound:
            return index
        index += 1
    return index


class ApiTraffic:
    """One API's counters: requests, bytes each way, and the upstream latency histogram."""

    __slots__ = ("latency_counts", "latency_sum", "request_bytes", "requests", "response_bytes")

    def __init__(self) -> None:
        self.requests = 0
        self.request_bytes = 0
        self.response_bytes = 0
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.latency_sum = 0.0

    def request(self, nbytes: int) -> None:
        self.requests += 1
        self.request_bytes += nbytes

    def response(self, nbytes: int, seconds: float) -> None:
        self.response_bytes += nbytes
        # Read and written apart: compiled, ``counts[i] += 1`` is a generic in-place add.
        counts = self.latency_counts
        index = latency_bucket(seconds)
        count: int = counts[index]
        counts[index] = count + 1
        self.latency_sum += seconds


class TrafficCollector(Collector):
    """kthrottle_requests_total, kthrottle_request_bytes_total, kthrottle_response_bytes_total
    and kthrottle_upstream_latency_seconds, by api."""

    def __init__(self) -> None:
        self._by_api: dict[int, ApiTraffic] = {}

    def api(self, api_key: int) -> ApiTraffic:
        found = self._by_api.get(api_key)
        if found is None:
            found = self._by_api[api_key] = ApiTraffic()
        return found

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("kthrottle_requests", "Requests forwarded, by api", labels=["api"])
        sent = CounterMetricFamily(
            "kthrottle_request_bytes", "Request bytes from clients, by api", labels=["api"]
        )
        received = CounterMetricFamily(
            "kthrottle_response_bytes", "Response bytes to clients, by api", labels=["api"]
        )
        latency = HistogramMetricFamily(
            "kthrottle_upstream_latency_seconds",
            "Time from forwarding a request to its response arriving, by api",
            labels=["api"],
        )
        for key, t in sorted(self._by_api.items()):
            name = [api_name(key) or "unknown"]
            requests.add_metric(name, t.requests)
            sent.add_metric(name, t.request_bytes)
            received.add_metric(name, t.response_bytes)
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), t.latency_counts, strict=True):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            latency.add_metric(name, buckets, t.latency_sum)
        yield from (requests, sent, received, latency)


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
