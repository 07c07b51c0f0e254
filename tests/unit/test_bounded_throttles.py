"""quotas.max_throttle_ms: no byte-rate throttle is longer than the bound, and what the bound
leaves unpaid stays owed in the token bucket, so over time the quota still holds (ByteRateQuotas
simulated with a clock in ms, as the proxy drives it; tests/unit/test_produce_shaping.py's
producer)."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config
from quota.config import QuotaConfig
from quota.manager import ByteRateQuotas
from tests.unit.test_produce_shaping import QUOTA, _mean_rate, _produce

KiB = 1024
MiB = 1024 * KiB
BOUND = 1000


def _quotas(produce: bool, bound: int | None = BOUND) -> ByteRateQuotas:
    key = "producer_byte_rate" if produce else "consumer_byte_rate"
    cfg = QuotaConfig.model_validate({"clients": {"c": {key: QUOTA}}, "max_throttle_ms": bound})
    return ByteRateQuotas(cfg, produce=produce, now_ms=0.0)


def test_a_burst_is_answered_with_the_bound_and_the_rest_stays_owed() -> None:
    q = _quotas(produce=True)
    burst = 10 * QUOTA  # Kafka's burst: quota x (num - 1) x size
    first = q.record("u", "c", burst + 20 * QUOTA, [], 0.0)  # 20 s over
    assert (first.throttle_ms, first.unbounded_ms, first.bounded) == (BOUND, 20_000, True)
    # A second later the entity still owes 19 s: answered with the bound again.
    second = q.record("u", "c", 1, [], 1000.0)
    assert second.throttle_ms == BOUND and second.owed_ms == pytest.approx(19_000, abs=2)
    # Unbounded, the same burst is answered with all 20 s, as Kafka would.
    unbounded = _quotas(produce=True, bound=None).record("u", "c", burst + 20 * QUOTA, [], 0.0)
    assert (unbounded.throttle_ms, unbounded.bounded) == (20_000, False)


@pytest.mark.parametrize(("connections", "size"), [(1, 16 * KiB), (2, 16 * KiB), (1, 48 * KiB)])
def test_what_the_bound_leaves_unpaid_is_paid_by_the_next_requests(connections: int, size: int) -> None:
    """A producer that wrote a backlog of 30 s of its quota at once, then goes on at ten times
    its quota (five requests in flight per connection) for 60 s: it never waits more than the
    bound, and the backlog is paid for all the same: over the 60 s it gets the quota's burst and
    60 s of quota, not the backlog on top (with the debt forgiven it would be 40% more)."""
    q = _quotas(produce=True)
    throttles: list[int] = []
    backlog = 30 * QUOTA
    throttles.append(q.record("u", "c", backlog, [], 0.0).throttle_ms)
    marks = _produce(q, connections, size, 60.0, throttles=throttles)
    assert max(throttles) <= BOUND
    assert sum(1 for t in throttles if t == BOUND) > 10  # the bound was reached, and held
    allowed = 10 * QUOTA + 60 * QUOTA  # the burst, and 60 s of the quota
    assert (backlog + marks[-1][1]) / allowed == pytest.approx(1.0, rel=0.05)


def test_requests_in_flight_beyond_quota_times_the_bound_get_through() -> None:
    """What a bound gives up: three connections with five 1 MiB requests in flight each bring
    15 MiB every bound's time whatever they owe. Kafka answers a produce it has written, so no
    throttle can take it back; docs/quotas.md says to keep the bound above the in-flight bytes
    of the entity's clients divided by its quota."""
    marks = _produce(_quotas(produce=True), 3, MiB, 60.0)
    assert _mean_rate(marks, 12.0, 60.0) > 2 * QUOTA


def _consume(q: ByteRateQuotas, batch: int, seconds: float) -> tuple[int, int]:
    """A consumer fetching one ``batch`` per fetch (a record batch larger than the bound's worth
    of quota: KIP-74 returns it whole), coming back after each throttle, the proxy answering a
    fetch made while the entity owed empty (throttling.on_fetch_response). Returns the bytes
    delivered and the longest throttle."""
    now, delivered, longest = 0.0, 0, 0
    while now < seconds * 1000:
        decision = q.record("u", "c", batch, [], now)
        throttle = decision.throttle_ms
        if decision.bounded and decision.owed_ms > 0:
            q.unrecord(decision, batch, [], now)
            throttle = max(1, min(throttle, decision.owed_ms))
        else:
            delivered += batch
        longest = max(longest, throttle)
        now += 20 + throttle  # a round trip, then the throttle
    return delivered, longest


def test_a_consumer_of_batches_bigger_than_the_bound_is_held_by_empty_answers() -> None:
    delivered, longest = _consume(_quotas(produce=False), 4 * QUOTA, 120.0)
    assert longest <= BOUND
    burst = 10 * QUOTA
    assert (delivered - burst) / 120.0 == pytest.approx(QUOTA, rel=0.05)


def test_a_bound_with_kafka_shaping_is_refused_with_its_line() -> None:
    text = (
        "gateway: {upstream_bootstrap: [b:9092]}\nquotas:\n  fetch_shaping: kafka\n  max_throttle_ms: 1000\n"
    )
    with pytest.raises(
        ConfigError, match=r"kthrottle.yaml:4: quotas.max_throttle_ms: .*fetch_shaping is kafka"
    ):
        parse_config(text, "kthrottle.yaml")


def test_a_reload_sets_and_lifts_the_bound() -> None:
    q = _quotas(produce=True, bound=None)
    assert q.record("u", "c", 30 * QUOTA, [], 0.0).throttle_ms == 20_000
    q.reconfigure(
        QuotaConfig.model_validate({"clients": {"c": {"producer_byte_rate": QUOTA}}, "max_throttle_ms": 500})
    )
    assert q.record("u", "c", 1, [], 1.0).throttle_ms == 500
