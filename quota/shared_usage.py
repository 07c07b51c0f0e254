"""The usage of buckets held once across gateway replicas, as one replica keeps it. Sans-IO.

Every replica's bucket of a shared entity is fed by the same thing: the usage each replica
reports, its own when it reports it, the others' when their reports are read from the exchange
topic. All replicas add the same reports, so all hold the same bucket (up to when each added
them), and no replica's view drifts from the others'. (Fed with its own usage request by request
and the others' when their reports came, each replica's view would differ by whatever the
transients left, for good: the replica with the higher view would keep the quota and the
others' clients starve.)

On top of the shared bucket each replica counts its own usage that it has not reported yet
(``pending``): its own clients are throttled for it at once, and the replica whose clients use
more is held back more, which makes the replicas share the quota fairly.

Keys are client buckets (user, client-id) or partitions (topic, partition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, Generic, TypeVar

from quota.cluster_report import BLOCKED, CAPPED
from quota.rate import SampledRate
from quota.token_bucket import TokenBucket

K = TypeVar("K", tuple[str, str], tuple[str, int])
OWN_RATE_SPAN_MS: Final = 5000.0


class SharedUsage(Generic[K]):
    """Pending, reported and read usage of the shared buckets of one quota table."""

    def __init__(self, now_ms: float) -> None:
        self.pending: dict[K, float] = {}  # own usage not yet reported
        # The others' usage read of keys nobody here has used lately (no rate held here): it
        # goes into the rate and bucket made at their first use here (the rest goes in as read).
        self.remote: dict[K, float] = {}
        self.remote_old: dict[K, float] = {}
        self.remote_ms: dict[K, float] = {}  # when the others' usage last went in
        # Keys whose clients this replica throttled, until when, by the shared bucket (blocked)
        # or by its fair part (capped): reported every hot interval, flagged, for as long as the
        # throttle lasts.
        self.blocked: dict[K, float] = {}
        self.capped: dict[K, float] = {}
        # Keys whose bucket here has less than half its burst left, or of which this replica has
        # given out more than its part of half the burst untold (ByteRateQuotas.record): their
        # usage goes out in the next hot report too, so the others see a burst taken on several
        # replicas at once within a fraction of a second, not a full report later (emptied by
        # every report).
        self.near: set[K] = set()
        # Other replicas whose clients of a key want more: when told, their usage rate, flags.
        self.wanting: dict[K, dict[str, tuple[float, float, int]]] = {}
        self.seen: set[K] = set()  # keys this replica's clients used as shared
        # This replica's own usage so far (as reported), and two snapshots of it at least
        # OWN_RATE_SPAN_MS apart: its part of each bucket's rate, read off without per-request work.
        self.own_total: dict[K, float] = {}
        self.last_used: dict[K, float] = {}  # when this replica last reported usage of a key
        self.first_used: dict[K, float] = {}  # when it first did
        self._snapshots: list[tuple[float, dict[K, float]]] = [(now_ms, {})]
        self._aged_ms = now_ms

    # --- this replica's usage ----------------------------------------------------------------

    def local(self, key: K, size: float) -> None:
        """A request of this replica's (the exchange works): to report, and held against the
        bucket until it is reported (then it is in the bucket)."""
        self.pending[key] = self.pending.get(key, 0.0) + size

    def take_back(self, key: K, size: float, bucket: TokenBucket | None, now_ms: float) -> None:
        """A request's usage taken back (a fetch answered empty): from what is not reported
        yet, else from the bucket it went into when it was."""
        if key in self.pending:
            self.pending[key] -= size
        elif bucket is not None:
            bucket.record(-size, now_ms)

    def own(self, key: K) -> float:
        return self.pending.get(key, 0.0)

    def throttled(self, key: K, now_ms: float, throttle_ms: float, capped: bool) -> None:
        """This replica throttled a client of ``key`` (by its fair part when ``capped``, else by
        the shared bucket): it wants more than it gets."""
        table = self.capped if capped else self.blocked
        until = now_ms + throttle_ms + 500.0
        if until > table.get(key, 0.0):
            table[key] = until

    def flags(self, key: K) -> int:
        return (BLOCKED if key in self.blocked else 0) | (CAPPED if key in self.capped else 0)

    def take_pending(
        self, hot_only: bool, now_ms: float, buckets: dict[K, TokenBucket]
    ) -> list[tuple[K, float, int]]:
        """Own usage since the last report, emptied, with each key's flags (``hot_only``: only
        the flagged keys and those near their quota). What is reported goes into the buckets
        now, as the others add it when they read it, a few milliseconds later."""
        # Throttles past are dropped at every report (few keys are flagged): a replica whose
        # clients stopped must stop saying that they want more.
        self.blocked = {k: until for k, until in self.blocked.items() if until > now_ms}
        self.capped = {k: until for k, until in self.capped.items() if until > now_ms}
        pending, flags = self.pending, self.flags
        hot = self.blocked.keys() | self.capped.keys()
        # A key whose clients were throttled so much they sent nothing is told too (with no
        # usage): the others must know that this replica's clients want their part.
        quiet = [(k, 0.0, flags(k)) for k in hot if k not in pending]
        near, self.near = self.near, set()  # a key still near is marked again at its next use
        if hot_only:  # a few times a second: the hot keys are looked up, not every pending one
            hot = hot | near
            taken = [(k, pending.pop(k), flags(k)) for k in [k for k in hot if k in pending]]
        else:
            if hot:
                taken = [(k, used, flags(k)) for k, used in pending.items()]
            else:  # nothing flagged: no lookups
                taken = [(k, used, 0) for k, used in pending.items()]
            self.pending = {}
        total, get, bucket_of = self.own_total, self.own_total.get, buckets.get
        last_used, first_used = self.last_used, self.first_used
        for key, used, _flags in taken:
            total[key] = get(key, 0.0) + used
            bucket = bucket_of(key)
            if bucket is not None and used:
                bucket.record(used, now_ms)
            last_used[key] = now_ms
            if key not in first_used:
                first_used[key] = now_ms
        if not hot_only and now_ms - self._snapshots[-1][0] >= OWN_RATE_SPAN_MS:
            self._snapshots = [self._snapshots[-1], (now_ms, dict(total))]
        return taken + quiet

    def starved(self, key: K, now_ms: float, for_ms: float) -> bool:
        """This replica's clients of ``key`` used none of it for ``for_ms``: they are starved,
        not merely held in turn (a consumer's fetches, each delivered with the throttle it
        costs, come about once a second on each connection)."""
        return key not in self.pending and now_ms - self.last_used.get(key, -math.inf) >= for_ms

    def own_rate(self, key: K, now_ms: float) -> float:
        """This replica's own usage of ``key`` per second, over the last 5 to 10 seconds."""
        since, then = self._snapshots[0]
        if now_ms - since <= 0:
            return 0.0
        return (self.own_total.get(key, 0.0) - then.get(key, 0.0)) / ((now_ms - since) / 1000.0)

    def settle(self, buckets: dict[K, TokenBucket], now_ms: float) -> None:
        """The exchange stopped working: own usage not reported yet goes into the buckets now,
        and from now on own usage goes in at once (``local`` is not called meanwhile)."""
        for key, size in self.pending.items():
            bucket = buckets.get(key)
            if bucket is not None and size > 0:
                bucket.record(size, now_ms)
        self.pending = {}

    # --- what is read from the topic -------------------------------------------------------------

    def add_remote(
        self,
        usage: Iterable[tuple[K, float]],
        buckets: dict[K, TokenBucket],
        rates: dict[K, SampledRate],
        now_ms: float,
    ) -> None:
        """Another replica's report: its usage goes into the windowed rate (all replicas' usage)
        and bucket of each key held here now; a key nobody here uses waits for its first use
        (``fold``), a generation at most (``age``). Added as read, no per-request lookup is left
        for it: at 10,000 client ids, tables of waiting usage slowed every request."""
        remote, get, rate_of, bucket_of = self.remote, self.remote.get, rates.get, buckets.get
        for key, amount in usage:
            if not amount:
                continue
            rate = rate_of(key)
            if rate is None:
                remote[key] = get(key, 0.0) + amount
            else:
                self._add_others(key, amount, bucket_of(key), rate, now_ms)

    def _add_others(
        self, key: K, amount: float, bucket: TokenBucket | None, rate: SampledRate | None, now_ms: float
    ) -> None:
        """The others' usage of ``key`` into its windowed rate (all replicas' usage) and bucket."""
        self.remote_ms[key] = now_ms
        if rate is not None:
            rate.record(amount, now_ms)
        if bucket is not None:
            bucket.record(amount, now_ms)

    def add_wanting(self, instance: str, entries: Iterable[tuple[K, float, int]], now_ms: float) -> None:
        """Another replica's flagged entries: its clients of those keys want more (its usage
        since its previous flagged report of each, as a rate)."""
        wanting = self.wanting
        for key, usage, flags in entries:
            peers = wanting.get(key)
            if peers is None:
                peers = wanting[key] = {}
            told = peers.get(instance)
            if told is not None and now_ms - told[0] < 2000.0:
                rate = usage / max(0.05, (now_ms - told[0]) / 1000.0)
                rate = (told[1] + rate) / 2
            else:
                rate = usage / 0.25
            peers[instance] = (now_ms, rate, flags)

    def fair_part(self, key: K, quota: float, now_ms: float, within_ms: float) -> float | None:
        """This replica's fair part of ``quota`` (None: no other replica's clients want more).

        The replicas whose clients want more share it equally; a replica held at its part
        (capped) that uses well under it, and is not blocked by the shared bucket, is taken at
        its use, and what it leaves goes to the others (a client that sends in bursts is held at
        its part now and then, yet wants no more on average)."""
        peers = self.wanting.get(key)
        if not peers:
            return None
        live = [told for told in peers.values() if now_ms - told[0] <= within_ms]
        if not live:
            del self.wanting[key]
            return None
        n = 1 + len(live)
        part = quota / n
        light = [rate for _at, rate, flags in live if flags == CAPPED and rate < 0.8 * part]
        if light:
            part += sum(part - rate for rate in light) / (n - len(light))
        return part

    def fold(self, key: K, bucket: TokenBucket | None, rate: SampledRate | None, now_ms: float) -> None:
        """Put the others' usage read for ``key`` before this replica held it into its bucket
        and its windowed rate of all replicas' usage (``rate``)."""
        remote = self.remote.pop(key, 0.0)
        if self.remote_old:
            remote += self.remote_old.pop(key, 0.0)
        if remote:
            self._add_others(key, remote, bucket, rate, now_ms)

    def age(
        self,
        buckets: dict[K, TokenBucket],
        rates: dict[K, SampledRate],
        now_ms: float,
        every_ms: float = 5000.0,
    ) -> None:
        """Usage read for keys nobody here has used for a while goes, a generation at a time
        (a bucket made later starts from the windowed history); for a key first used here since
        it was read it goes in first, so its rate misses nothing."""
        if now_ms - self._aged_ms < every_ms:
            return
        self._aged_ms = now_ms
        for held in [k for k in self.remote_old if k in buckets or k in rates]:
            self.fold(held, buckets.get(held), rates.get(held), now_ms)
        self.remote_old, self.remote = self.remote, {}
        if self.wanting:
            quiet = [
                k
                for k, peers in self.wanting.items()
                if all(now_ms - t[0] > every_ms for t in peers.values())
            ]
            for gone in quiet:
                del self.wanting[gone]

    def maybe_shared(self, key: K, now_ms: float, within_ms: float) -> bool:
        """Another replica's clients may use ``key`` too: their usage was read within
        ``within_ms``, or this replica has not reported its own for that long yet (the others'
        reports of a client that came to all replicas at once may still be on their way)."""
        if now_ms - self.remote_ms.get(key, -math.inf) < within_ms:
            return True
        return now_ms - self.first_used.get(key, now_ms) < within_ms

    def forget(self, key: K) -> None:
        for table in (
            self.remote_ms,
            self.last_used,
            self.first_used,
            self.wanting,
            self.blocked,
            self.capped,
            self.own_total,
        ):
            table.pop(key, None)
        self.seen.discard(key)
        self.near.discard(key)
