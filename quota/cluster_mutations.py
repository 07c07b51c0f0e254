"""KIP-599 across gateway replicas: every replica replays the same mutation records in the
exchange topic's order, so all hold the same token buckets and each request is decided as the
one controller would decide it. Sans-IO.

The replica a request came to publishes it (quota/cluster_report.py ``MutationRecord``) and
answers the client with what the replay decides when the record comes back. The replay's clock
is the records' own timestamps (the broker's append time), never going back: every replica sees
the same records at the same times, in the same order, so every replica reaches the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from quota.cluster_report import MutationRecord
from quota.entities import Bucket
from quota.mutations import admit_costs
from quota.token_bucket import TokenBucket


@dataclass(frozen=True, slots=True)
class LogAdmission:
    accepted: tuple[bool, ...]
    throttle_ms: int
    tokens: float


class MutationLog:
    """The cluster-wide mutation buckets, as the replay has them."""

    def __init__(self) -> None:
        self.buckets: dict[Bucket, TokenBucket] = {}
        self.clock_ms = 0.0
        self.applied = 0

    def apply(self, record: MutationRecord, at_ms: float) -> LogAdmission:
        """Replay one record at ``at_ms`` (its timestamp in the topic)."""
        self.clock_ms = now = max(self.clock_ms, at_ms)
        self.applied += 1
        burst = record.quota * record.burst_seconds
        bucket = self.buckets.get(record.bucket)
        if bucket is None:
            bucket = self.buckets[record.bucket] = TokenBucket(record.quota, burst, now)
        elif (bucket.rate, bucket.burst) != (record.quota, burst):
            bucket.reconfigure(record.quota, burst, now)
        if record.refund:
            bucket.record(-record.refund, now)
            return LogAdmission((), 0, bucket.tokens(now))
        accepted, throttle_ms, _charged = admit_costs(bucket, record.costs, record.strict, now)
        if self.applied % 64 == 0:
            self._expire(now)
        return LogAdmission(accepted, throttle_ms, bucket.tokens(now))

    def _expire(self, now_ms: float) -> None:
        """A full bucket is what a new one would be: dropping it changes no answer."""
        for key in [k for k, b in self.buckets.items() if b.tokens(now_ms) >= b.burst]:
            del self.buckets[key]

    def tokens(self, bucket: Bucket) -> float | None:
        found = self.buckets.get(bucket)
        return None if found is None else found.tokens(self.clock_ms)


class Alone:
    """A replica deciding cluster-wide mutation quotas by itself: since when, and the replay it
    read (None: none yet, as a replica starting before it read the exchange)."""

    __slots__ = ("log", "since_ms")

    def __init__(self, since_ms: float, log: MutationLog | None) -> None:
        self.since_ms = since_ms
        self.log = log

    def left(self, bucket: Bucket, burst: float) -> float:
        """The tokens the replay's bucket had last (a debt stays a debt); a bucket the replay does
        not hold is full (it drops full ones); nothing is known to be left without a replay."""
        if self.log is None:
            return 0.0
        tokens = self.log.tokens(bucket)
        return burst if tokens is None else tokens
