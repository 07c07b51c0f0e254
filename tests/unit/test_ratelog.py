"""Throttle logging stays readable under thousands of events a second."""

from __future__ import annotations

import logging

import pytest

from proxy.ratelog import RateLimitedLog


def test_at_most_burst_lines_per_interval_then_the_suppressed_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("ratelog-test"), interval=10.0, burst=2, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="ratelog-test"):
        logged = [log.log(logging.INFO, "produce", "throttled %d", i) for i in range(5)]
        assert logged == [True, True, False, False, False]
        assert log.log(logging.INFO, "fetch", "other kind")  # each kind has its own budget
        now[0] = 10.0
        assert log.log(logging.INFO, "produce", "throttled %d", 5)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["throttled 0", "throttled 1", "other kind", "throttled 5 (3 similar lines suppressed)"]


def test_a_line_can_carry_the_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("ratelog-test"), burst=1)
    with caplog.at_level(logging.ERROR, logger="ratelog-test"):
        for _ in range(2):
            try:
                raise ValueError("boom")
            except ValueError:
                log.log(logging.ERROR, "failed", "reader failed", exc_info=True)
        log.log(logging.ERROR, "other", "no traceback")
    first, other = caplog.records
    assert first.exc_info is not None and str(first.exc_info[1]) == "boom"
    assert not other.exc_info
