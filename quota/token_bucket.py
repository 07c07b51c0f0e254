"""KIP-599's token bucket, sans-IO: every call takes the time in ms.

Semantics (Kafka's TokenBucket stat and Sensor.checkQuotas):

- Tokens refill at ``rate`` per second up to ``burst`` (Kafka: samples * window seconds * quota),
  lazily, whenever the bucket is read or recorded: tokens = min(burst, tokens + rate * dt).
- Recording n takes n tokens: tokens = min(burst, tokens - n). Tokens may go below zero, so one
  request can take any number of partitions; a negative n gives tokens back, never past the burst.
- The quota is violated only while tokens < 0 (exactly 0 is fine). The throttle is the time the
  refill needs to bring the bucket back to 0: round(-tokens / rate * 1000) ms, half up, uncapped.
"""

from __future__ import annotations

from quota.rate import java_round


class TokenBucket:
    """One bucket of controller mutations (partitions created or deleted)."""

    __slots__ = ("_tokens", "burst", "configured", "last_record_ms", "rate", "updated_ms")

    def __init__(self, rate: float, burst: float, now_ms: float) -> None:
        # Kafka starts at 0 tokens last updated at the epoch, so its first refill fills the bucket.
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self.updated_ms = now_ms  # time of the last refill
        self.last_record_ms = now_ms  # time of the last record, for idle expiry (Kafka's sensor)
        self.configured = rate  # the quota as configured (``rate`` may be a part of it)

    def _refill(self, now_ms: float) -> None:
        # A clock that steps back refills nothing (Kafka would take tokens away).
        if now_ms > self.updated_ms:
            self._tokens = min(self.burst, self._tokens + self.rate * (now_ms - self.updated_ms) / 1000.0)
            self.updated_ms = now_ms

    def tokens(self, now_ms: float) -> float:
        """Refill, then the tokens left (below zero while the quota is violated)."""
        self._refill(now_ms)
        return self._tokens

    def exceeded(self, now_ms: float) -> bool:
        """Whether the quota is violated now: strictly below zero, as Sensor.checkQuotas has it."""
        return self.tokens(now_ms) < 0

    def record(self, n: float, now_ms: float) -> None:
        """Take ``n`` tokens (give them back when negative), whatever is left."""
        self._refill(now_ms)
        self._tokens = min(self.burst, self._tokens - n)
        self.last_record_ms = now_ms

    def throttle_ms(self, now_ms: float) -> int:
        """The time until the bucket is back to 0 tokens; 0 unless tokens < 0."""
        tokens = self.tokens(now_ms)
        if tokens >= 0:
            return 0
        return java_round(-tokens / self.rate * 1000.0)

    def forgive(self, now_ms: float, down_to: float = 0.0) -> None:
        """Drop what the bucket owes beyond ``down_to`` (tokens below it go back to it)."""
        self._refill(now_ms)
        self._tokens = max(min(down_to, self.burst), self._tokens)

    def cap(self, tokens: float, now_ms: float) -> None:
        """Hold at most ``tokens`` (what the recent traffic leaves of a new or lowered quota)."""
        self._refill(now_ms)
        self._tokens = min(self._tokens, tokens)

    def reconfigure(self, rate: float, burst: float, now_ms: float) -> None:
        """Change rate and burst, keeping the tokens (clamped to the new burst).

        The time up to ``now_ms`` is refilled at the old rate, the time after at the new one. Kafka
        swaps the metric's config without measuring, so its next read refills all the time since
        the last update at the new rate: pass ``updated_ms`` as ``now_ms`` to get exactly that.
        """
        self._refill(now_ms)
        self.rate = rate
        self.burst = burst
        self._tokens = min(burst, self._tokens)
