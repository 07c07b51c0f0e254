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


class SampledRate:
    """A byte rate measured the way Kafka measures it (values per second).

    Each sample is a start time and a value, held in two lists of floats rather than an object
    each: at 10,000 entities of 11 samples, objects the garbage collector walks on every full
    collection cost more than the rate's arithmetic."""

    __slots__ = ("_current", "_starts", "_values", "last_record_ms", "throttled_ms", "window")

    def __init__(self, window: QuotaWindow, now_ms: float) -> None:
        self.window = window
        self._starts: list[float] = [now_ms]
        self._values: list[float] = [0.0]
        self._current = 0
        self.last_record_ms = now_ms
        self.throttled_ms = 0.0  # throttle decided against this rate so far (for metrics)

    def record(self, value: float, now_ms: float) -> None:
        current = self._current
        if now_ms - self._starts[current] >= self.window.size_ms:
            current = self._advance(now_ms)
        self._values[current] += value
        self.last_record_ms = now_ms

    def unrecord(self, value: float, now_ms: float) -> None:
        """Take back a value just recorded (Kafka does this for a fetch it answers empty)."""
        self.record(-value, now_ms)

    @classmethod
    def merged(cls, rates: list[SampledRate], now_ms: float) -> SampledRate:
        """One rate measuring what ``rates`` (of one window) measured together: the first's
        samples, the others' added in (``absorb``)."""
        first = rates[0]
        out = cls(first.window, now_ms)
        out._starts, out._values = list(first._starts), list(first._values)
        out._current, out.last_record_ms = first._current, first.last_record_ms
        for other in rates[1:]:
            out.absorb(other, now_ms)
        return out

    def absorb(self, other: SampledRate, now_ms: float) -> None:
        """Add ``other``'s live samples to this rate, each into the sample that covers its start
        (or the oldest): a shared bucket made from its members' histories measures what they
        sent together."""
        self._purge(now_ms)
        starts = self._starts
        for start, value in other.samples(now_ms):
            covering = [i for i, s in enumerate(starts) if s <= start]
            i = max(covering, key=starts.__getitem__) if covering else starts.index(min(starts))
            self._values[i] += value
        self.last_record_ms = max(self.last_record_ms, other.last_record_ms)

    def _advance(self, now_ms: float) -> int:
        current = self._current = (self._current + 1) % self.window.num
        if current >= len(self._starts):
            self._starts.append(now_ms)
            self._values.append(0.0)
        else:
            self._starts[current], self._values[current] = now_ms, 0.0
        return current

    def _purge(self, now_ms: float) -> None:
        expire_ms = self.window.num * self.window.size_ms
        starts = self._starts
        if now_ms - min(starts) < expire_ms:
            return
        for i, start in enumerate(starts):
            if now_ms - start >= expire_ms:
                starts[i], self._values[i] = now_ms, 0.0

    def window_ms(self, now_ms: float) -> float:
        """The time the rate is measured over, as Kafka's Rate.windowSize computes it."""
        self._purge(now_ms)
        elapsed = now_ms - min(self._starts)
        full_windows = int(elapsed // self.window.size_ms)
        min_full = self.window.num - 1
        if full_windows < min_full:
            elapsed += (min_full - full_windows) * self.window.size_ms
        return max(elapsed, 1.0)

    def total(self, now_ms: float) -> float:
        self._purge(now_ms)
        return sum(self._values)

    def measure(self, now_ms: float) -> float:
        """Rate in values per second."""
        window = self.window_ms(now_ms)
        return sum(self._values) / (window / 1000.0)

    def samples(self, now_ms: float) -> list[tuple[float, float]]:
        """(start ms, value) of each live sample, oldest first: for the admin API."""
        self._purge(now_ms)
        return sorted(zip(self._starts, self._values, strict=True))


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
