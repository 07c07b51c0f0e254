"""The usage of buckets held once across gateway replicas, as one replica keeps it. Sans-IO.

Every replica's bucket of a shared entity is fed by the same thing: the usage records read from
the exchange topic, this replica's own reports included once they come back. All replicas read
the same records, so all hold the same bucket (up to when each read them), and no replica's view
drifts from the others'. (Fed with its own usage at once and the others' when their reports
came, each replica's view would differ by whatever the transients left, for good: the replica
with the higher view would keep the quota and the others' clients starve.)

On top of the shared bucket each replica counts its own usage that has not come back yet
(``unconfirmed``): its own clients are throttled for it at once, and the replica whose clients
use more is held back more, which is what makes the replicas share the quota fairly.

Keys are client buckets (user, client-id) or partitions (topic, partition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Generic, TypeVar

from quota.rate import SampledRate
from quota.token_bucket import TokenBucket

K = TypeVar("K", tuple[str, str], tuple[str, int])


class SharedUsage(Generic[K]):
    """Pending, unconfirmed and read usage of the shared buckets of one quota table."""

    def __init__(self, now_ms: float) -> None:
        self.pending: dict[K, float] = {}  # own usage not yet published
        self.unconfirmed: dict[K, float] = {}  # own usage not yet read back from the topic
        self.remote: dict[K, float] = {}  # the others' usage read, not yet in the bucket
        self.confirmed: dict[K, float] = {}  # own usage read back, not yet in the bucket
        self.remote_old: dict[K, float] = {}
        self.confirmed_old: dict[K, float] = {}
        self.remote_ms: dict[K, float] = {}  # when the others' usage last went in
        # Keys whose clients this replica throttled, until when: reported every hot interval,
        # flagged hot (they want more than they get), for as long as the throttle lasts.
        self.hot: dict[K, float] = {}
        self.hot_peers: dict[K, dict[str, float]] = {}  # other replicas whose clients want more
        self._aged_ms = now_ms

    # --- this replica's usage ----------------------------------------------------------------

    def local(self, key: K, size: float, confirmable: bool) -> None:
        """A request of this replica's: to report, and (``confirmable``: the exchange works) to
        hold against the bucket until its report comes back."""
        self.pending[key] = self.pending.get(key, 0.0) + size
        if confirmable:
            self.unconfirmed[key] = self.unconfirmed.get(key, 0.0) + size

    def take_back(self, key: K, size: float) -> None:
        """A request's usage taken back (a fetch answered empty) before it was reported."""
        if key in self.pending:
            self.pending[key] -= size
        if key in self.unconfirmed:
            self.unconfirmed[key] -= size

    def own(self, key: K) -> float:
        return self.unconfirmed.get(key, 0.0)

    def throttled(self, key: K, now_ms: float, throttle_ms: float) -> None:
        """This replica throttled a client of ``key``: it wants more than it gets."""
        until = now_ms + throttle_ms + 500.0
        if until > self.hot.get(key, 0.0):
            self.hot[key] = until

    def take_pending(self, hot_only: bool, now_ms: float) -> list[tuple[K, float, bool]]:
        """Own usage since the last report, emptied, and whether each key is under pressure
        here (``hot_only``: only the keys under pressure)."""
        hot, pending = self.hot, self.pending
        if not hot_only and hot:
            self.hot = hot = {k: until for k, until in hot.items() if until > now_ms}
        # A key whose clients were throttled so much they sent nothing is told too (with no
        # usage): the others must know that this replica's clients want their part.
        quiet = [(k, 0.0, True) for k in hot if k not in pending]
        if hot_only:
            keys = [k for k in pending if k in hot]
            return [(k, pending.pop(k), True) for k in keys] + quiet
        taken = [(k, used, k in hot) for k, used in pending.items()]
        self.pending = {}
        return taken + quiet

    def settle(self, buckets: dict[K, TokenBucket], now_ms: float) -> None:
        """The exchange stopped working: own usage still unconfirmed goes into the buckets now
        (its reports may never come back), and from now on own usage goes in at once."""
        for key, size in self.unconfirmed.items():
            bucket = buckets.get(key)
            if bucket is not None and size > 0:
                bucket.record(size, now_ms)
        self.unconfirmed = {}

    # --- what is read from the topic -------------------------------------------------------------

    def add_remote(self, usage: Iterable[tuple[K, float]]) -> None:
        """Another replica's report: its usage goes into the buckets at their next use here."""
        remote = self.remote
        get = remote.get
        for key, amount in usage:
            remote[key] = get(key, 0.0) + amount

    def add_hot(self, instance: str, keys: Iterable[K], now_ms: float) -> None:
        """Keys whose clients another replica had to throttle lately: they want more."""
        for key in keys:
            peers = self.hot_peers.get(key)
            if peers is None:
                peers = self.hot_peers[key] = {}
            peers[instance] = now_ms

    def sharers(self, key: K, now_ms: float, within_ms: float) -> int:
        """This replica and the others whose clients wanted more of ``key`` lately."""
        peers = self.hot_peers.get(key)
        if not peers:
            return 1
        live = sum(1 for at in peers.values() if now_ms - at <= within_ms)
        if not live:
            del self.hot_peers[key]
        return 1 + live

    def add_confirmed(self, usage: Iterable[tuple[K, float]]) -> None:
        """This replica's own report read back: its usage leaves ``unconfirmed`` for the bucket."""
        unconfirmed, confirmed = self.unconfirmed, self.confirmed
        for key, amount in usage:
            left = unconfirmed.get(key)
            if left is not None:
                left -= amount
                if left > 1e-6:
                    unconfirmed[key] = left
                else:
                    del unconfirmed[key]
            confirmed[key] = confirmed.get(key, 0.0) + amount

    def fold(
        self,
        key: K,
        bucket: TokenBucket | None,
        rate: SampledRate | None,
        others: SampledRate | None,
        now_ms: float,
    ) -> None:
        """Put the usage read for ``key`` into its bucket (all of it), and the others' part
        into the windowed rates (``rate``: all replicas'; ``others``: theirs alone)."""
        remote = self.remote.pop(key, 0.0)
        confirmed = self.confirmed.pop(key, 0.0)
        if self.remote_old:
            remote += self.remote_old.pop(key, 0.0)
        if self.confirmed_old:
            confirmed += self.confirmed_old.pop(key, 0.0)
        if remote:
            self.remote_ms[key] = now_ms
            if rate is not None:
                rate.record(remote, now_ms)
            if others is not None:
                others.record(remote, now_ms)
        if bucket is not None and (remote or confirmed):
            bucket.record(remote + confirmed, now_ms)

    def age(
        self,
        buckets: dict[K, TokenBucket],
        rates: dict[K, SampledRate],
        now_ms: float,
        every_ms: float = 5000.0,
    ) -> None:
        """Usage read for keys nobody here has used for a while goes, a generation at a time
        (a bucket made later starts from the windowed history); for the buckets held
        here it goes in first, so a bucket whose clients are away for a while misses nothing."""
        if now_ms - self._aged_ms < every_ms:
            return
        self._aged_ms = now_ms
        for held in [k for k in (*self.remote_old, *self.confirmed_old) if k in buckets]:
            self.fold(held, buckets[held], rates.get(held), None, now_ms)
        self.remote_old, self.remote = self.remote, {}
        self.confirmed_old, self.confirmed = self.confirmed, {}
        if self.hot_peers:
            quiet = [
                k for k, peers in self.hot_peers.items() if all(now_ms - t > every_ms for t in peers.values())
            ]
            for gone in quiet:
                del self.hot_peers[gone]

    def recently_shared(self, key: K, now_ms: float, within_ms: float) -> bool:
        return now_ms - self.remote_ms.get(key, -math.inf) < within_ms

    def forget(self, key: K) -> None:
        for table in (self.remote_ms, self.unconfirmed, self.hot_peers):
            table.pop(key, None)
