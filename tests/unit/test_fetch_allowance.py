"""Steady fetch: each Fetch's max_bytes is lowered to what the entity may take now (a token bucket
at the quota), and what comes back is delivered with the throttle it costs, so a greedy consumer
sees its quota as a steady rate instead of a burst followed by empty throttled answers
(ByteRateQuotas.fetch_allowance and record, simulated with a clock in ms)."""

from __future__ import annotations

import pytest

from quota.config import QuotaConfig
from quota.manager import ByteRateQuotas, PartitionUsage

QUOTA = 512 * 1024


def _quotas(num: int = 11, size_seconds: float = 1.0, shaping: str = "steady") -> ByteRateQuotas:
    cfg = QuotaConfig.model_validate(
        {
            "window": {"num": num, "size_seconds": size_seconds},
            "clients": {"c": {"consumer_byte_rate": QUOTA}},
            "fetch_shaping": shaping,
        }
    )
    return ByteRateQuotas(cfg, produce=False, now_ms=0.0)


def _consume(q: ByteRateQuotas, seconds: float, batch: int) -> tuple[list[tuple[float, int]], int]:
    """A consumer that always has data waiting (``batch``-byte record batches), fetches with
    fetch.max.bytes of 50 MB and fetches again as soon as an answer and its throttle are over; 2 ms
    round trips. Returns (time, bytes received) marks and how many answers came back empty."""
    now, got, empty = 0.0, 0, 0
    marks = [(0.0, 0)]
    while now < seconds * 1000:
        cap = q.fetch_allowance("u", "c", now)
        assert cap is not None
        max_bytes = min(50 * 1024 * 1024, cap)
        size = max(batch, max_bytes // batch * batch)  # whole batches, at least one (KIP-74)
        now += 2.0
        decision = q.record("u", "c", size, [], now)
        if decision.throttled and not decision.shaped:  # Kafka: answered empty
            q.unrecord(decision, size, [], now)
            empty += 1
        else:
            got += size
        now += decision.throttle_ms
        marks.append((now / 1000.0, got))
    return marks, empty


def _mean_rate(marks: list[tuple[float, int]], t_from: float, t_to: float) -> float:
    def at(t: float) -> int:
        return max(n for s, n in marks if s <= t)

    return (at(t_to) - at(t_from)) / (t_to - t_from)


@pytest.mark.parametrize("batch", [1024, 16 * 1024, 256 * 1024])
@pytest.mark.parametrize(("num", "size_seconds"), [(11, 1.0), (11, 0.5)])
def test_a_greedy_consumer_gets_its_quota_steadily(batch: int, num: int, size_seconds: float) -> None:
    marks, empty = _consume(_quotas(num, size_seconds), 45.0, batch)
    rate = _mean_rate(marks, 12.0, 45.0)
    assert abs(rate - QUOTA) / QUOTA < 0.01, f"{rate / 1024:.0f} KiB/s for a {QUOTA // 1024} KiB/s quota"
    assert empty == 0, "nothing fetched is thrown away"
    # Steady: every second of the span brings the quota, give or take 10%; no bursts, no silence.
    for t in range(12, 44):
        second = _mean_rate(marks, float(t), float(t + 1))
        assert abs(second - QUOTA) / QUOTA < 0.1, f"second {t}: {second / 1024:.0f} KiB"


def test_batches_larger_than_a_second_of_quota_average_out() -> None:
    """1 MiB batches at 512 KiB/s come a batch every two seconds: the mean still holds."""
    marks, _empty = _consume(_quotas(), 45.0, 1024 * 1024)
    rate = _mean_rate(marks, 12.0, 44.0)
    assert abs(rate - QUOTA) / QUOTA < 0.05, f"{rate / 1024:.0f} KiB/s"


def test_a_consumer_under_its_quota_gets_kafkas_burst() -> None:
    """Shaping holds Kafka's burst (quota x (num - 1) x size): an idle consumer's first fetch may
    take it whole, as from a broker."""
    q = _quotas()
    assert q.fetch_allowance("u", "c", 0.0) == QUOTA * 10


def test_kafka_cap_alone_bursts_then_goes_silent() -> None:
    """What the proxy improves on: Kafka's cap alone lets a window's worth through at once and then
    refuses fetches until the window has moved on."""
    marks, empty = _consume(_quotas(shaping="kafka"), 45.0, 16 * 1024)
    silent = sum(1 for t in range(12, 44) if _mean_rate(marks, float(t), float(t + 1)) == 0)
    assert silent >= 10 and empty > 0


def test_no_quota_no_cap() -> None:
    assert _quotas().fetch_allowance("u", "other", 0.0) is None


def _partition_quotas(shaping: str) -> ByteRateQuotas:
    cfg = QuotaConfig.model_validate(
        {"topics": {"t": {"consumer.byte.rate": QUOTA}}, "fetch_shaping": shaping}
    )
    return ByteRateQuotas(cfg, produce=False, now_ms=0.0)


def _consume_partition(q: ByteRateQuotas, seconds: float) -> tuple[list[tuple[float, int]], int]:
    """A consumer of one partition of topic t, with a KIP-1010 quota and no client quota: each
    fetch brings max.partition.fetch.bytes (1 MiB), as a broker would with data waiting."""
    now, got, empty = 0.0, 0, 0
    marks = [(0.0, 0)]
    size = 1024 * 1024
    while now < seconds * 1000:
        now += 2.0
        usage = [PartitionUsage("t", 0, size)]
        decision = q.record("u", "c", size, usage, now)
        if decision.throttled and not decision.deliverable:  # Kafka: answered empty
            q.unrecord(decision, size, usage, now)
            empty += 1
        else:
            got += size
        now += decision.throttle_ms
        marks.append((now / 1000.0, got))
    return marks, empty


def test_a_topic_partition_quota_is_paid_for_not_refused() -> None:
    """Steady: a fetch over its partition's quota goes out with the throttle its partition's token
    bucket needs to pay for it, so the consumer gets the topic's rate and nothing is thrown away;
    Kafka's windowed rate refuses it and lets the next burst through as samples expire."""
    marks, empty = _consume_partition(_partition_quotas("steady"), 100.0)
    assert empty == 0
    for span in ((12.0, 45.0), (12.0, 100.0)):
        rate = _mean_rate(marks, *span)
        assert abs(rate - QUOTA) / QUOTA < 0.05, f"{span}: {rate / 1024:.0f} KiB/s"
    _marks, empty = _consume_partition(_partition_quotas("kafka"), 100.0)
    assert empty > 0
