"""KIP-936's ``producer_ids_rate``: how fast a user brings new producer ids, throttled. Sans-IO.

Per user principal (never per client id), a TimedBloomFilter remembers the producer ids seen in
the last half to whole ``producer_ids.window.size_seconds``; an id none of its filters holds is
new, is added, and is counted in a SampledRate over ``producer_ids.window`` (num samples of that
size). Ids the user keeps reusing (idempotent and transactional producers) are counted once.
Throttling is Kafka's byte-rate formula on that rate: record first, then check, uncapped.

Only users with a ``producer_ids_rate`` (their own or the <default> user's) are tracked; each has
its own bucket either way. Requests without a producer id (-1: not idempotent) are not charged.

Steady shaping (``producer_ids.shaping``, the default) pays new ids into a token bucket at the
quota instead, and charges an InitProducerId for the id it hands out (``allocate``): producers
started together each wait for their own turn, where the windowed rate tells them all the same
throttle at once. Across gateway replicas (quota/cluster.py) each replica tells the others the
ids new to it, and each counts an id once, whichever replica saw it first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quota.bloom import TimedBloomFilter, capacity_of, hash_count, mix64
from quota.cluster import ClusterLink
from quota.entities import Match, resolve
from quota.keys import PRODUCER_IDS_RATE
from quota.rate import QuotaWindow, SampledRate, throttle_time_ms
from quota.token_bucket import TokenBucket

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.config import QuotaConfig

NO_PRODUCER_ID = -1


@dataclass(frozen=True, slots=True)
class ProducerIdDecision:
    """What a request's producer ids cost: the throttle, how many ids were new, the rate after."""

    throttle_ms: int
    new_ids: int
    rate: float  # new ids per second, as measured after recording this request
    match: Match | None

    @property
    def throttled(self) -> bool:
        return self.throttle_ms > 0


class _User:
    __slots__ = ("bucket", "filters", "rate", "reserved")

    def __init__(self, filters: TimedBloomFilter, rate: SampledRate) -> None:
        self.filters = filters
        self.rate = rate
        self.bucket: TokenBucket | None = None  # steady shaping
        self.reserved = 0  # InitProducerIds charged before they were forwarded, not yet answered


class ProducerIdQuotas:
    """New-producer-id rates and filters of the users that have a ``producer_ids_rate``."""

    def __init__(self, cfg: QuotaConfig, now_ms: float, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.window = cfg.producer_ids.window.quota_window()
        self.users: dict[str, _User] = {}
        self._matches: dict[str, Match | None] = {}
        self._last_expiry_ms = now_ms
        self.active = self._any_quota(cfg)
        self.cluster: ClusterLink | None = None  # one quota across replicas, while the exchange runs
        self.claims: list[tuple[str, int]] = []  # ids new here since the last report

    @property
    def filter_window_ms(self) -> float:
        """A filter is written for half of this and dropped at its end (KIP-936)."""
        return self.window.size_ms

    @staticmethod
    def _any_quota(cfg: QuotaConfig) -> bool:
        # Validation keeps producer_ids_rate off client ids, so the users are all to look at.
        return any(q.producer_ids_rate is not None for q in cfg.users.values())

    def reconfigure(self, cfg: QuotaConfig) -> None:
        """Apply a new config, keeping what it leaves valid.

        A new window size drops everything (filters and samples are laid out by it); a new sample
        count resets the rates but keeps the filters, so known ids stay known. New filter sizing
        applies to filters started from now on: for at most one window a user may hold one filter
        of each sizing, at most the larger of the two bounds. Users left without a quota are dropped.
        """
        old = self.cfg.producer_ids
        new = cfg.producer_ids
        self.cfg = cfg
        self._matches.clear()
        window = new.window.quota_window()
        if window.size_ms != self.window.size_ms:
            self.users.clear()
        elif window != self.window:
            for state in self.users.values():
                throttled = state.rate.throttled_ms
                state.rate = SampledRate(window, state.rate.last_record_ms)
                state.rate.throttled_ms = throttled
        self.window = window
        sizing = (new.max_bytes_per_user, new.false_positive_rate)
        if sizing != (old.max_bytes_per_user, old.false_positive_rate):
            for state in self.users.values():
                state.filters.configure(new.max_bytes_per_user, new.false_positive_rate)
        for user in [u for u in self.users if self.match(u) is None]:
            del self.users[user]
        self.active = self._any_quota(cfg)

    def match(self, user: str) -> Match | None:
        """The user's producer_ids_rate: its own (level 3) or the <default> user's (level 6)."""
        try:
            return self._matches[user]
        except KeyError:
            found = self._matches[user] = resolve(self.cfg, user, "", PRODUCER_IDS_RATE)
            return found

    def _user_seed(self, user: str) -> int:
        """Each user's filters hash with their own seed: false positives do not line up across users."""
        digest = hashlib.blake2b(user.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return mix64((self.seed ^ int.from_bytes(digest, "big")) & ((1 << 64) - 1))

    def _new_user(self, user: str, now_ms: float) -> _User:
        opts = self.cfg.producer_ids
        seed = self._user_seed(user)
        filters = TimedBloomFilter(
            self.filter_window_ms, opts.max_bytes_per_user, opts.false_positive_rate, now_ms, seed
        )
        state = self.users[user] = _User(filters, SampledRate(self.window, now_ms))
        return state

    def record(self, user: str, producer_ids: Iterable[int], now_ms: float) -> ProducerIdDecision:
        """Count the request's new producer ids against the user's quota and decide its throttle.

        Every request of a user over quota that carries a producer id is throttled, also one whose
        ids are all known, as Kafka throttles every request of a client over its byte rate.
        """
        match = self.match(user)
        if match is None:
            return ProducerIdDecision(0, 0, 0.0, None)
        ids = {pid for pid in producer_ids if pid > NO_PRODUCER_ID}
        state = self.users.get(user)
        if not ids:
            return ProducerIdDecision(0, 0, state.rate.measure(now_ms) if state else 0.0, match)
        if state is None:
            state = self._new_user(user, now_ms)
        new_ids = self._count(user, state, match, ids, now_ms)
        throttle_ms, measured = self._throttle(state, match, now_ms)
        state.rate.throttled_ms += throttle_ms
        self.maybe_expire(now_ms)
        return ProducerIdDecision(throttle_ms, new_ids, measured, match)

    def _count(self, user: str, state: _User, match: Match, ids: Iterable[int], now_ms: float) -> int:
        """Observe ``ids``; count those new to the user's filters (and tell the other replicas)."""
        observe = state.filters.observe
        new = [pid for pid in ids if observe(pid, now_ms)]
        if not new:
            state.rate.record(0, now_ms)  # the user is active: not idle
            return 0
        if self.steady:
            self._bucket(state, match, now_ms).record(len(new), now_ms)
        state.rate.record(len(new), now_ms)
        if self._shared(match):
            self.claims += [(user, pid) for pid in new]
        return len(new)

    @property
    def steady(self) -> bool:
        return self.cfg.producer_ids.shaping == "steady"

    def _shared(self, match: Match) -> bool:
        return self.cluster is not None and match.scope != "instance"

    def _quota(self, match: Match) -> float:
        if self.cluster is not None and match.scope != "instance":
            return match.quota * self.cluster.multiplier
        return match.quota

    def _bucket(self, state: _User, match: Match, now_ms: float) -> TokenBucket:
        """The user's steady-shaping bucket, at the quota that applies here, holding the
        window's burst; a new one (or one whose quota was lowered) holds what the recent new
        ids leave of it, so a quota set on a busy user bites at once."""
        quota = self._quota(match)
        burst = quota * self.window.max_value_factor_ms / 1000.0
        bucket = state.bucket
        rate = state.rate
        if bucket is None:
            bucket = state.bucket = TokenBucket(quota, burst, now_ms)
            bucket.configured = match.quota
            bucket.cap(quota * rate.window_ms(now_ms) / 1000.0 - rate.total(now_ms), now_ms)
        elif (bucket.rate, bucket.burst) != (quota, burst):
            lowered = match.quota < bucket.configured
            bucket.reconfigure(quota, burst, now_ms)
            bucket.configured = match.quota
            if lowered:
                bucket.cap(quota * rate.window_ms(now_ms) / 1000.0 - rate.total(now_ms), now_ms)
        return bucket

    def _throttle(self, state: _User, match: Match, now_ms: float) -> tuple[int, float]:
        """The throttle the user meets now, and its rate of new ids."""
        rate = state.rate
        window_ms = rate.window_ms(now_ms)
        measured = rate.total(now_ms) / (window_ms / 1000.0)  # rate.measure, sharing the window
        if self.steady:
            return self._bucket(state, match, now_ms).throttle_ms(now_ms), measured
        return throttle_time_ms(measured, self._quota(match), window_ms), measured

    def reserve(self, user: str, now_ms: float) -> int:
        """An InitProducerId of the user, before it is forwarded (steady shaping): the id it will
        bring is charged now, and the time it must wait before it goes on is returned (0: now).

        A new producer cannot produce before it has its id; held here, it waits its turn, on
        whichever broker and gateway replica it produces to later (a throttle on the answer
        would only mute the connection it came on, and a short-lived producer's Produce goes on
        others). Each reservation deepens the bucket: producers started together are spaced out
        at the quota. The answer settles it (``settle``)."""
        match = self.match(user)
        if match is None or not self.steady:
            return 0
        state = self.users.get(user) or self._new_user(user, now_ms)
        bucket = self._bucket(state, match, now_ms)
        bucket.record(1, now_ms)
        state.reserved += 1
        throttle_ms = bucket.throttle_ms(now_ms)
        state.rate.throttled_ms += throttle_ms
        return throttle_ms

    def settle(self, user: str, producer_id: int, now_ms: float, reserved: bool) -> int:
        """An InitProducerId's answer handed ``producer_id`` to the user (-1: none): the id is
        counted now if new (its Produce requests then find it known), its reservation given back
        if it is not (a transactional producer's id again). Returns the throttle for the answer:
        0 under steady shaping (the request waited before it went on), else the throttle the
        user's next new id would meet (``pending_throttle_ms``)."""
        match = self.match(user)
        if match is None:
            return 0
        if not self.steady:
            return self.pending_throttle_ms(user, now_ms)
        state = self.users.get(user) or self._new_user(user, now_ms)
        if reserved and state.reserved > 0:
            state.reserved -= 1
        else:
            reserved = False
        new = producer_id > NO_PRODUCER_ID and state.filters.observe(producer_id, now_ms)
        if new:
            state.rate.record(1, now_ms)
            if self._shared(match):
                self.claims.append((user, producer_id))
        bucket = self._bucket(state, match, now_ms)
        if reserved and not new:
            bucket.record(-1, now_ms)  # no new id after all
        elif new and not reserved:
            bucket.record(1, now_ms)
        self.maybe_expire(now_ms)
        return 0

    def add_remote_claims(self, _instance: str, claims: Iterable[tuple[str, int]], now_ms: float) -> None:
        """Ids another replica saw first: each counts here too unless this replica knows it
        already (it saw it itself, or from a third): every replica counts an id once."""
        for user, pid in claims:
            match = self.match(user)
            if match is None or not self._shared(match):
                continue
            state = self.users.get(user) or self._new_user(user, now_ms)
            if state.filters.observe(pid, now_ms):
                state.rate.record(1, now_ms)
                if self.steady:
                    self._bucket(state, match, now_ms).record(1, now_ms)

    def take_claims(self) -> list[tuple[str, int]]:
        """The ids new here since the last report, emptied."""
        claims, self.claims = self.claims, []
        return claims

    def pending_throttle_ms(self, user: str, now_ms: float) -> int:
        """The throttle the user's next new producer id would meet, without recording anything.

        The proxy answers a user's InitProducerId with it: a producer that is about to bring a new
        id waits before its first Produce, which is what slows a storm of short-lived producers
        (each on a fresh connection, so muting after their Produce would not).
        """
        match = self.match(user)
        state = self.users.get(user)
        if match is None or state is None:
            return 0
        return self._throttle(state, match, now_ms)[0]

    def memory_bytes(self) -> int:
        """Bytes held by all users' filters (the bloom bit arrays; per user at most the bound)."""
        return sum(state.filters.nbytes for state in self.users.values())

    def state(self, user: str, now_ms: float) -> dict[str, object]:
        """One user's producer-id quota, for the admin endpoint."""
        match = self.match(user)
        state = self.users.get(user)
        out: dict[str, object] = {
            "user": user,
            "quota": match.quota if match else None,
            "level": match.level if match else None,
            "tracked": state is not None,
            "window_ms": state.rate.window_ms(now_ms) if state else None,
            "rate": state.rate.measure(now_ms) if state else 0.0,
            "new_ids_in_window": state.rate.total(now_ms) if state else 0.0,
            "throttle_ms_total": state.rate.throttled_ms if state else 0.0,
        }
        filters = state.filters.filters() if state else []
        opts = self.cfg.producer_ids  # the sizing of the next filter; live ones list their own
        out["filters"] = {
            "count": len(filters),
            "bytes": sum(bloom.nbytes for _, bloom in filters),
            "capacity": capacity_of(max(1, opts.max_bytes_per_user // 2) * 8, opts.false_positive_rate),
            "hashes": hash_count(opts.false_positive_rate),
            "live": [
                {
                    "created_ms": created,
                    "bytes": bloom.nbytes,
                    "capacity": bloom.capacity,
                    "ids": bloom.count,
                    "expired": now_ms - created >= self.filter_window_ms,
                }
                for created, bloom in filters
            ],
        }
        return out

    def snapshot(self, now_ms: float) -> list[tuple[str, float, float, int]]:
        """(user, new-id rate per second, throttle ms so far, filter bytes) per tracked user."""
        return [
            (user, state.rate.measure(now_ms), state.rate.throttled_ms, state.filters.nbytes)
            for user, state in self.users.items()
        ]

    def maybe_expire(self, now_ms: float) -> int:
        """Free filters a window old and drop idle users; runs at most once per half window.

        A user is dropped once idle for the whole rate window (num x size: its rate has fallen to
        nothing by then, so dropping forgets nothing) plus ``idle_expiry_seconds``. Its filters go
        much sooner, a window after they were started, so an idle user holds only its rate.
        Returns how many users were dropped.
        """
        if now_ms - self._last_expiry_ms < self.filter_window_ms / 2:
            return 0
        self._last_expiry_ms = now_ms
        horizon = now_ms - self._span_ms(self.window) - self.cfg.idle_expiry_seconds * 1000.0
        stale = []
        for user, state in self.users.items():
            state.filters.expire(now_ms)
            if state.filters.empty and state.rate.last_record_ms < horizon:
                stale.append(user)
        for user in stale:
            del self.users[user]
        if len(self._matches) > 4 * max(16, len(self.users)):
            self._matches.clear()
        return len(stale)

    @staticmethod
    def _span_ms(window: QuotaWindow) -> float:
        return window.num * window.size_ms
