"""Kafka's rate and throttle formula in simulated time."""

from __future__ import annotations

import bisect
import statistics

import pytest

from quota.rate import QuotaWindow, SampledRate, java_round, record_and_throttle, throttle_time_ms

W = QuotaWindow(num=11, size_ms=1000)


def test_worked_example_gives_2100_ms() -> None:
    rate = SampledRate(W, 0)
    for second in range(10):
        assert record_and_throttle(rate, 400, 500, second * 1000.0) == 0
    # 6300 bytes over a window of 9.5 s padded to 10.5 s: 600 B/s against 500 B/s.
    assert rate.window_ms(9500) == pytest.approx(10_500)
    assert record_and_throttle(rate, 2300, 500, 9500) == 2100


def test_equal_to_quota_is_allowed() -> None:
    rate = SampledRate(W, 0)
    # 5000 bytes at once: window padded to 10 s, rate exactly 500 B/s.
    assert record_and_throttle(rate, 5000, 500, 0) == 0
    # One byte more is over: (500.1 - 500) / 500 x 10,000 ms = 2 ms.
    assert record_and_throttle(rate, 1, 500, 0) == 2


def test_window_padding_and_floor() -> None:
    rate = SampledRate(QuotaWindow(num=2, size_ms=1000), 0)
    assert rate.window_ms(0) == 1000  # padded to (num - 1) windows
    assert SampledRate(QuotaWindow(num=1, size_ms=1000), 5).window_ms(5) == 1  # never below 1 ms


def test_samples_start_at_first_record_not_clock() -> None:
    rate = SampledRate(W, 300)
    rate.record(10, 300)
    rate.record(10, 1299)  # still the first sample (started at 300)
    rate.record(10, 1300)  # a new sample starts here
    assert [start for start, _ in rate.samples(1300)] == [300, 1300]


def test_old_samples_expire() -> None:
    rate = SampledRate(W, 0)
    rate.record(10_000, 0)
    assert rate.total(10_999) == 10_000
    assert rate.total(11_000) == 0  # num * size old: reset
    assert rate.measure(20_000) == 0


def test_oldest_sample_is_overwritten_after_num_samples() -> None:
    rate = SampledRate(W, 0)
    for second in range(12):
        rate.record(100, second * 1000.0)
    assert len(rate.samples(11_000)) == 11
    assert rate.total(11_000) == 1100


def test_unrecord() -> None:
    rate = SampledRate(W, 0)
    rate.record(700, 0)
    rate.unrecord(700, 0)
    assert rate.total(0) == 0


def test_throttle_formula_rounds_half_up_and_is_uncapped() -> None:
    assert throttle_time_ms(1000, 500, 10_000) == 10_000
    assert throttle_time_ms(10**9, 1, 10_000) == (10**9 - 1) * 10_000
    assert java_round(2.5) == 3 and java_round(3.5) == 4
    assert throttle_time_ms(500, 500, 10_000) == 0


@pytest.mark.parametrize(
    "window", [QuotaWindow(11, 1000), QuotaWindow(11, 500), QuotaWindow(5, 500), QuotaWindow(5, 1000)]
)
def test_greedy_client_held_to_the_quota_at_any_window(window: QuotaWindow) -> None:
    """A client that sends 16 KiB whenever it is not throttled (KIP-219: it waits out each
    throttle) is held to the quota over any cycle-long span (num x size), whatever the window's
    count and size: the window changes how the client bursts, not the rate it is held to. The
    integration tests rely on this when they use half-second windows to see several cycles in a
    short run, and measure as here: the median over every cycle-long span after the first burst."""
    quota, request = 1_000_000.0, 16_384
    rate = SampledRate(window, 0)
    now, sent, marks = 0.0, 0, []
    while now < 80_000:
        sent += request
        marks.append((now, sent))
        now += record_and_throttle(rate, request, quota, now) + 5  # 5 ms per round trip
    times = [t for t, _ in marks]

    def sent_by(t: float) -> int:
        return marks[bisect.bisect_right(times, t) - 1][1]

    cycle = window.num * window.size_ms
    spans = [20_000 + 250 * i for i in range(int((80_000 - cycle - 20_000) / 250))]
    held = statistics.median((sent_by(x + cycle) - sent_by(x)) / (cycle / 1000) for x in spans)
    assert held == pytest.approx(quota, rel=0.02)
