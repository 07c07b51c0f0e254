"""How soon the proxy may try a broker address again after a connect to it failed.

A broker that is down refuses connections at once. A client connecting to it straight gets that
refusal and waits out its own reconnect.backoff.ms before trying again, doubling the wait up to
reconnect.backoff.max.ms. Through the proxy the client's connect succeeds (the proxy accepts),
so a client that resets its backoff on a successful connect retries at once, and each retry
becomes another connect to the dead broker and another log line: thousands a second in a
restart. So the proxy keeps Kafka's clients' backoff itself, per broker address: after a failed
connect the next one waits ``base`` seconds, doubled on each failure up to ``ceiling``, with
Kafka's 20% jitter, and a success resets it. A client whose broker is backing off is held
(not read) meanwhile, as if the connect were slow, then answered or closed.

Attempts made together (many clients waiting out the same backoff) count as one failure, so
the wait grows per round of attempts, not per client. Sans-IO: the clock and the random source
are given.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Address = tuple[str, int]
JITTER = 0.2  # Kafka's clients: CommonClientConfigs.RECONNECT_BACKOFF_JITTER
LOG_EVERY_SECONDS = 10.0  # one line per address this often while it stays unreachable


@dataclass
class _Down:
    """An address whose last connect failed."""

    since: float
    failures: int = 0  # rounds of attempts that failed: the exponent
    attempts: int = 0  # every failed connect, for the log
    retry_at: float = 0.0
    round_opened_at: float = -math.inf  # the failure that began the current round
    unlogged: int = 0
    logged_at: float = -math.inf


class UpstreamBackoff:
    """Per broker address: when the next connect may start, and what to log."""

    def __init__(
        self,
        base: float,
        ceiling: float,
        clock: Callable[[], float],
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self.reconfigure(base, ceiling)
        self.clock = clock
        self.uniform = uniform
        self._down: dict[Address, _Down] = {}

    def reconfigure(self, base: float, ceiling: float) -> None:
        """The bounds (again at a reload: waits already set run out as they were)."""
        if base <= 0 or ceiling < base:
            raise ValueError(f"backoff needs 0 < base <= ceiling, got {base}, {ceiling}")
        self.base, self.ceiling = base, ceiling

    def delay(self, address: Address) -> float:
        """Seconds until a connect to ``address`` may start (0: now)."""
        down = self._down.get(address)
        return max(0.0, down.retry_at - self.clock()) if down is not None else 0.0

    def order(self, addresses: Iterable[Address]) -> list[Address]:
        """``addresses`` with those that may be tried now first (otherwise in their order)."""
        return sorted(addresses, key=self.delay)

    def failed(self, address: Address, started_at: float) -> int | None:
        """A connect to ``address`` begun at ``started_at`` failed. Returns the failed connects
        to report when a log line is due (the first of an outage, then one per
        LOG_EVERY_SECONDS), else None."""
        now = self.clock()
        down = self._down.get(address)
        if down is None:
            down = self._down[address] = _Down(since=now)
        down.attempts += 1
        down.unlogged += 1
        # A connect begun before the round's first failure was made alongside it (however long
        # it took to fail); one begun after it, once its wait was over, opens the next round.
        if started_at >= down.round_opened_at:
            down.failures += 1
            down.round_opened_at = now
            wait = self.base * 2 ** min(down.failures - 1, 62)
            down.retry_at = now + min(self.ceiling, wait * self.uniform(1 - JITTER, 1 + JITTER))
        if now - down.logged_at < LOG_EVERY_SECONDS:
            return None
        reported, down.unlogged, down.logged_at = down.unlogged, 0, now
        return reported

    def succeeded(self, address: Address) -> tuple[int, float] | None:
        """A connect to ``address`` succeeded: its backoff ends. Returns (failed connects, seconds
        down) when it had been failing, for the log."""
        down = self._down.pop(address, None)
        if down is None:
            return None
        return down.attempts, self.clock() - down.since

    @property
    def down(self) -> list[Address]:
        return sorted(self._down)
