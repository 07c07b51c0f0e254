"""The reconnect backoff the proxy keeps per broker address (Kafka's clients' reconnect.backoff.ms
and reconnect.backoff.max.ms): doubling with jitter, capped, reset by a success; attempts made
together count once; the log line comes once per outage and then once per ten seconds."""

from __future__ import annotations

from typing import cast

import pytest

from proxy.config import parse_config
from proxy.net.upstream_backoff import LOG_EVERY_SECONDS, UpstreamBackoff

A = ("10.0.0.1", 9092)
B = ("10.0.0.2", 9092)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _backoff(clock: Clock, factor: float = 1.0) -> UpstreamBackoff:
    return UpstreamBackoff(0.05, 1.0, clock, uniform=lambda _lo, _hi: factor)


def test_the_wait_doubles_per_failure_up_to_the_ceiling_and_a_success_ends_it() -> None:
    clock = Clock()
    backoff = _backoff(clock)
    assert backoff.delay(A) == 0
    waits = []
    for _ in range(8):
        backoff.failed(A, clock.now)
        waits.append(round(backoff.delay(A), 3))
        clock.now += waits[-1]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    clock.now += 2
    assert backoff.succeeded(A) == (8, cast(object, pytest.approx(sum(waits) + 2)))
    assert backoff.delay(A) == 0 and backoff.succeeded(A) is None


def test_jitter_is_kafkas_twenty_percent_and_never_past_the_ceiling() -> None:
    clock = Clock()
    seen: list[tuple[float, float]] = []

    def uniform(lo: float, hi: float) -> float:
        seen.append((lo, hi))
        return hi

    backoff = UpstreamBackoff(0.05, 1.0, clock, uniform=uniform)
    backoff.failed(A, clock.now)
    assert seen == [(0.8, 1.2)] and backoff.delay(A) == pytest.approx(0.06)
    for _ in range(10):
        clock.now += 2
        backoff.failed(A, clock.now)
    assert backoff.delay(A) == pytest.approx(1.0)  # 1.2 x the ceiling is capped


def test_connects_begun_together_fail_as_one_round() -> None:
    """Fifty clients waited out the same backoff and tried at once: the wait doubles once."""
    clock = Clock()
    backoff = _backoff(clock)
    backoff.failed(A, clock.now)
    clock.now += 0.05
    started = clock.now
    clock.now += 0.001
    for _ in range(50):
        backoff.failed(A, started)
    assert backoff.delay(A) == pytest.approx(0.1)


def test_addresses_that_may_be_tried_now_come_first() -> None:
    clock = Clock()
    backoff = _backoff(clock)
    backoff.failed(A, clock.now)
    assert backoff.order([A, B]) == [B, A]
    assert backoff.order([B, A]) == [B, A]
    assert backoff.down == [A]


def test_one_log_line_per_outage_then_one_per_ten_seconds_with_the_count() -> None:
    clock = Clock()
    backoff = _backoff(clock)
    lines = []
    for _ in range(100):
        lines.append(backoff.failed(A, clock.now))
        clock.now += 0.25
    reported = [n for n in lines if n is not None]
    assert lines[0] == 1
    assert len(reported) == 1 + int(99 * 0.25 // LOG_EVERY_SECONDS)
    assert sum(reported) <= 100 and reported[1] == int(LOG_EVERY_SECONDS / 0.25)


def test_the_config_refuses_a_ceiling_below_the_start() -> None:
    text = (
        "mode: gateway\ngateway:\n  upstream_bootstrap: ['127.0.0.1:9092']\n"
        "upstream_reconnect_backoff_ms: 500\nupstream_reconnect_backoff_max_ms: 100\n"
    )
    with pytest.raises(Exception, match="upstream_reconnect_backoff_max_ms must be at least"):
        parse_config(text)


def test_connects_that_fail_slowly_still_double_the_wait() -> None:
    """A broker that swallows connects (each fails at its timeout, 10 s after it began) while
    clients keep coming: a round is the connects begun before its first failure, so the next
    round, begun once the wait was over, doubles it all the same."""
    clock = Clock()
    backoff = _backoff(clock)
    pending: list[float] = []  # start times of connects under way
    rounds = []
    for tick in range(500):  # a client every 0.1 s for 50 s
        clock.now = 100.0 + tick * 0.1
        while pending and pending[0] + 10 <= clock.now:
            backoff.failed(A, pending.pop(0))
        if backoff.delay(A) == 0:
            pending.append(clock.now)
        rounds.append(round(backoff.delay(A), 3))
    # A round lasts the 10 s a connect takes to fail: four rounds in 50 s, each wait double.
    assert max(rounds) == pytest.approx(0.4)


def test_a_reload_changes_the_bounds() -> None:
    clock = Clock()
    backoff = _backoff(clock)
    backoff.reconfigure(0.2, 5.0)
    backoff.failed(A, clock.now)
    assert backoff.delay(A) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        backoff.reconfigure(1.0, 0.5)
