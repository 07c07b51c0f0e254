"""The per-API traffic counters read at scrape time as prometheus_client's own would."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from protocol.api_keys import ApiKey
from proxy.traffic_metrics import LATENCY_BUCKETS, TrafficCollector, latency_bucket


def test_counts_bytes_and_latency_buckets_are_exposed_by_api() -> None:
    registry = CollectorRegistry()
    traffic = TrafficCollector()
    registry.register(traffic)
    produce = traffic.api(ApiKey.PRODUCE)
    assert traffic.api(ApiKey.PRODUCE) is produce  # one object per api, resolved once
    for seconds in (0.0004, 0.0005, 0.002, 40.0):
        produce.request(100)
        produce.response(10, seconds)
    sample = registry.get_sample_value
    assert sample("kthrottle_requests_total", {"api": "Produce"}) == 4
    assert sample("kthrottle_request_bytes_total", {"api": "Produce"}) == 400
    assert sample("kthrottle_response_bytes_total", {"api": "Produce"}) == 40
    bucket = "kthrottle_upstream_latency_seconds_bucket"
    assert sample(bucket, {"api": "Produce", "le": "0.0005"}) == 2  # le is inclusive
    assert sample(bucket, {"api": "Produce", "le": "0.0025"}) == 3
    assert sample(bucket, {"api": "Produce", "le": "30.0"}) == 3
    assert sample(bucket, {"api": "Produce", "le": "+Inf"}) == 4
    assert sample("kthrottle_upstream_latency_seconds_count", {"api": "Produce"}) == 4
    latency_sum = sample("kthrottle_upstream_latency_seconds_sum", {"api": "Produce"})
    assert latency_sum is not None
    assert abs(latency_sum - 40.0029) < 1e-9
    assert b'kthrottle_requests_total{api="Produce"} 4.0' in generate_latest(registry)


@given(st.one_of(st.sampled_from(LATENCY_BUCKETS), st.floats(0.0, 100.0)))
def test_a_latency_falls_in_the_first_bucket_whose_bound_is_at_or_above_it(seconds: float) -> None:
    assert latency_bucket(seconds) == bisect_left(LATENCY_BUCKETS, seconds)
