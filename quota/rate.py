"""Kafka's windowed rate and throttle-time formula, sans-IO: every call takes the time in ms.

Semantics (Kafka's SampledStat + Rate + ClientQuotaManager):

- A rate is a sum over at most ``num`` samples, each ``size_ms`` long. A new sample starts at the
  first record that arrives once the current sample is ``size_ms`` old, so samples are not aligned
  to the clock. Samples that are ``num * size_ms`` old or older are reset before measuring.
- The measured window is now minus the start of the oldest sample, padded up to
  ``(num - 1) * size_ms`` while fewer full windows than that have passed, and at least 1 ms.
- A quota T is violated only when the rate O is strictly above it; the throttle time is then
  round((O - T) / T * window) ms, uncapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuotaWindow:
    """``quota.window.num`` samples of ``quota.window.size.seconds`` (Kafka: 11 of 1 s)."""

    num: int = 11
    size_ms: float = 1000.0

    @property
    def max_value_factor_ms(self) -> float:
        """(num - 1) * size: Kafka caps a fetch at quota * this many seconds of bytes."""
        return (self.num - 1) * self.size_ms


class _Sample:
    __slots__ = ("start_ms", "value")

    def __init__(self, start_ms: float) -> None:
        self.start_ms = start_ms
        self.value = 0.0


class SampledRate:
    """A byte rate measured the way Kafka measures it (values per second)."""

    __slots__ = ("_current", "_samples", "last_record_ms", "throttled_ms", "window")

    def __init__(self, window: QuotaWindow, now_ms: float) -> None:
        self.window = window
        self._samples: list[_Sample] = [_Sample(now_ms)]
        self._current = 0
        self.last_record_ms = now_ms
        self.throttled_ms = 0.0  # throttle decided against this rate so far (for metrics)

    def record(self, value: float, now_ms: float) -> None:
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window.size_ms:
            sample = self._advance(now_ms)
        sample.value += value
        self.last_record_ms = now_ms

    def unrecord(self, value: float, now_ms: float) -> None:
        """Take back a value just recorded (Kafka does this for a fetch it answers empty)."""
        self.record(-value, now_ms)

    def _advance(self, now_ms: float) -> _Sample:
        self._current = (self._current + 1) % self.window.num
        if self._current >= len(self._samples):
            sample = _Sample(now_ms)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.start_ms, sample.value = now_ms, 0.0
        return sample

    def _purge(self, now_ms: float) -> None:
        expire_ms = self.window.num * self.window.size_ms
        for sample in self._samples:
            if now_ms - sample.start_ms >= expire_ms:
                sample.start_ms, sample.value = now_ms, 0.0

    def window_ms(self, now_ms: float) -> float:
        """The time the rate is measured over, as Kafka's Rate.windowSize computes it."""
        self._purge(now_ms)
        oldest = min(s.start_ms for s in self._samples)
        elapsed = now_ms - oldest
        full_windows = int(elapsed // self.window.size_ms)
        min_full = self.window.num - 1
        if full_windows < min_full:
            elapsed += (min_full - full_windows) * self.window.size_ms
        return max(elapsed, 1.0)

    def total(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(s.value for s in self._samples)

    def measure(self, now_ms: float) -> float:
        """Rate in values per second."""
        window = self.window_ms(now_ms)
        return self.total(now_ms) / (window / 1000.0)

    def samples(self, now_ms: float) -> list[tuple[float, float]]:
        """(start ms, value) of each live sample, oldest first: for the admin API."""
        self._purge(now_ms)
        return sorted((s.start_ms, s.value) for s in self._samples)


def java_round(value: float) -> int:
    """Math.round as Java has it (half up), not Python's round (half to even)."""
    return math.floor(value + 0.5)


def throttle_time_ms(rate: float, quota: float, window_ms: float) -> int:
    """Kafka's throttle for a rate over a (positive) quota; 0 when the rate is at or under it."""
    if rate <= quota:
        return 0
    return java_round((rate - quota) / quota * window_ms)


def record_and_throttle(rate: SampledRate, value: float, quota: float, now_ms: float) -> int:
    """Record first, then check, as Kafka's sensors do; returns the throttle in ms."""
    rate.record(value, now_ms)
    measured = rate.measure(now_ms)
    return throttle_time_ms(measured, quota, rate.window_ms(now_ms))
