"""Byte-rate quota state for one direction (produce or fetch): client buckets and partitions.

Sans-IO: callers pass the time in ms; nothing here blocks, sleeps or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quota.cluster import ClusterLink
from quota.entities import Bucket, Match, any_entity_quota, resolve, topic_quota, topic_scope
from quota.keys import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from quota.rate import SampledRate, throttle_time_ms
from quota.token_bucket import TokenBucket

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.config import QuotaConfig

PartitionKey = tuple[str, int]
# A grant not given back within this long is forgotten (a client's default request.timeout.ms):
# a fetch whose answer never came must not keep its entity's allowance small for ever.
GRANT_MAX_AGE_MS = 30_000.0
# Another replica's usage of a bucket this recent means the bucket is served by several replicas
# at once (a fetch allowance is then split between them).
SHARED_RECENT_MS = 2_000.0


@dataclass(frozen=True, slots=True)
class PartitionUsage:
    topic: str
    partition: int
    size: int


@dataclass(frozen=True, slots=True)
class Decision:
    """What one request cost: the throttle to apply (max over client and partitions) and why."""

    throttle_ms: int
    client_throttle_ms: int
    partition_throttle_ms: int
    bucket: Bucket
    match: Match | None
    client_rate: float
    worst_partition: PartitionKey | None = None
    # The client throttle came from steady shaping (a token bucket at the quota). A fetch so
    # throttled goes to the client with it (nothing refused): it was sized to the quota beforehand.
    shaped: bool = False
    # The partition throttles came from steady shaping too (a token bucket per partition).
    partitions_shaped: bool = False

    @property
    def throttled(self) -> bool:
        return self.throttle_ms > 0

    @property
    def deliverable(self) -> bool:
        """Every throttle of this decision came from steady shaping: a fetch goes to the client
        with its throttle, its bytes paid for by the buckets, rather than answered empty."""
        return (self.client_throttle_ms == 0 or self.shaped) and (
            self.partition_throttle_ms == 0 or self.partitions_shaped
        )


@dataclass(slots=True, eq=False)
class FetchGrant:
    """The max_bytes a Fetch was allowed and the part of its entity's tokens held for it while it
    is in flight, so fetches sent together (one per broker, or pipelined) share what the bucket
    holds instead of each being allowed all of it."""

    bucket: Bucket
    allowed: int
    reserved: int
    at_ms: float
    released: bool = False


class ByteRateQuotas:
    """``producer_byte_rate`` (produce=True) or ``consumer_byte_rate`` for clients, plus the
    matching KIP-1010 topic-partition quota, with idle state expiring."""

    def __init__(self, cfg: QuotaConfig, produce: bool, now_ms: float) -> None:
        self.produce = produce
        self.key = PRODUCER_BYTE_RATE if produce else CONSUMER_BYTE_RATE
        self.cfg = cfg
        self.window = cfg.window.quota_window()
        self.clients: dict[Bucket, SampledRate] = {}
        self.partitions: dict[PartitionKey, SampledRate] = {}
        self.shapers: dict[Bucket, TokenBucket] = {}  # steady shaping, per client bucket
        self.partition_shapers: dict[PartitionKey, TokenBucket] = {}  # and per partition
        self.grants: dict[Bucket, list[FetchGrant]] = {}  # fetches in flight, per client bucket
        self._matches: dict[tuple[str, str], Match | None] = {}
        self._topic_quotas: dict[str, float | None] = {}
        self._last_expiry_ms = now_ms
        self.active = self._any_quota(cfg)
        # One quota across gateway replicas (quota/cluster.py), while the exchange runs: this
        # replica's usage of shared buckets since its last report, the others' usage not yet
        # added to the buckets, and the buckets under pressure (reported more often).
        self.cluster: ClusterLink | None = None
        self.pending: dict[Bucket, float] = {}
        self.partition_pending: dict[PartitionKey, float] = {}
        self.remote: dict[Bucket, float] = {}
        self.partition_remote: dict[PartitionKey, float] = {}
        # The others' usage that waited more than half a window for a use here (buckets only
        # other replicas serve): kept one more half window, then it is past history.
        self.remote_old: dict[Bucket, float] = {}
        self.partition_remote_old: dict[PartitionKey, float] = {}
        self._aged_ms = now_ms
        self.remote_ms: dict[Bucket, float] = {}  # when another replica's usage was last added
        # The lowest bucket level another replica told for a bucket under pressure, and when.
        self.remote_levels: dict[Bucket | PartitionKey, tuple[float, float]] = {}
        self.remote_rates: dict[Bucket, SampledRate] = {}  # the others' part of a bucket's rate
        self.hot: set[Bucket | PartitionKey] = set()
        self._partition_shared: dict[str, bool] = {}

    def reconfigure(self, cfg: QuotaConfig) -> None:
        """Apply a new config; rates measured so far are kept (Kafka keeps its sensors)."""
        self.cfg = cfg
        window = cfg.window.quota_window()
        if window != self.window:
            self.window = window
            self.clients.clear()
            self.partitions.clear()
            self.shapers.clear()
            self.partition_shapers.clear()
        self._matches.clear()
        self._topic_quotas.clear()
        self._partition_shared.clear()
        self.active = self._any_quota(cfg)

    def _any_quota(self, cfg: QuotaConfig) -> bool:
        """Whether any entity or topic has a quota of this kind (else the proxy skips the work)."""
        if any_entity_quota(cfg, self.key):
            return True
        return any(
            (t.producer_byte_rate if self.produce else t.consumer_byte_rate) is not None
            for t in cfg.topics.values()
        )

    def match(self, user: str, client_id: str) -> Match | None:
        key = (user, client_id)
        try:
            return self._matches[key]
        except KeyError:
            found = self._matches[key] = resolve(self.cfg, user, client_id, self.key)
            return found

    def topic_quota(self, topic: str) -> float | None:
        try:
            return self._topic_quotas[topic]
        except KeyError:
            found = self._topic_quotas[topic] = topic_quota(self.cfg, topic, self.produce)
            return found

    def _rate(
        self,
        table: dict[Bucket, SampledRate] | dict[PartitionKey, SampledRate],
        key: Bucket | PartitionKey,
        now_ms: float,
    ) -> SampledRate:
        rate = table.get(key)  # type: ignore[arg-type]
        if rate is None:
            rate = table[key] = SampledRate(self.window, now_ms)  # type: ignore[index]
        return rate

    def shared(self, match: Match | None) -> bool:
        """Whether this entity's bucket holds once across replicas (the exchange runs and the
        entity's scope is not ``instance``). An entity without a quota is shared too: its usage
        is known everywhere the day a quota is set on it."""
        return self.cluster is not None and (match is None or match.scope != "instance")

    def record(
        self, user: str, client_id: str, size: int, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> Decision:
        """Record a request's bytes (record first, then check, as Kafka does) and decide."""
        match = self.match(user, client_id)
        bucket = match.bucket if match is not None else ("", client_id)
        rate = self._rate(self.clients, bucket, now_ms)
        quota = match.quota if match is not None else 0.0
        cluster = self.cluster
        if cluster is not None and (match is None or match.scope != "instance"):
            self.pending[bucket] = self.pending.get(bucket, 0.0) + size
            if self.remote:
                self._fold(bucket, rate, now_ms)
            quota *= cluster.multiplier
        client_ms = 0
        shaped = self.shaped(match)
        shaper = None
        if shaped:
            assert match is not None
            # Made before this request is recorded: a new bucket holds what the recent traffic
            # (the others' included) leaves of the quota.
            shaper = self._bucket(self.shapers, bucket, quota, now_ms, rate, match.quota)
        rate.record(size, now_ms)
        measured = rate.measure(now_ms)
        if shaper is not None:
            shaper.record(size, now_ms)
            client_ms = shaper.throttle_ms(now_ms)
            if cluster is not None and (client_ms or shaper.tokens(now_ms) < shaper.burst / 2):
                self.hot.add(bucket)
        elif match is not None:
            client_ms = throttle_time_ms(measured, quota, rate.window_ms(now_ms))
            if cluster is not None and client_ms:
                self.hot.add(bucket)
        rate.throttled_ms += client_ms
        part_ms, worst = self.record_partitions(partitions, now_ms)
        self.maybe_expire(now_ms)
        return Decision(
            max(client_ms, part_ms),
            client_ms,
            part_ms,
            bucket,
            match,
            measured,
            worst,
            shaped,
            partitions_shaped=self.steady,
        )

    # --- one quota across replicas ----------------------------------------------------------------

    def _fold(self, bucket: Bucket, rate: SampledRate, now_ms: float) -> None:
        """Add the others' usage of ``bucket`` that came in since this replica last looked."""
        amount = self.remote.pop(bucket, 0.0)
        if self.remote_old:
            amount += self.remote_old.pop(bucket, 0.0)
        if not amount:
            return
        rate.record(amount, now_ms)
        others = self.remote_rates.get(bucket)
        if others is None:
            others = self.remote_rates[bucket] = SampledRate(self.window, now_ms)
        others.record(amount, now_ms)
        self.remote_ms[bucket] = now_ms
        shaper = self.shapers.get(bucket)
        if shaper is not None:
            shaper.record(amount, now_ms)

    def _fold_partition(self, key: PartitionKey, rate: SampledRate, now_ms: float) -> None:
        amount = self.partition_remote.pop(key, 0.0)
        if self.partition_remote_old:
            amount += self.partition_remote_old.pop(key, 0.0)
        if not amount:
            return
        rate.record(amount, now_ms)
        shaper = self.partition_shapers.get(key)
        if shaper is not None:
            shaper.record(amount, now_ms)

    def _age_remote(self, now_ms: float) -> None:
        """Every half window, the others' usage still waiting for a use here moves to the old
        generation, and what was there goes: a bucket that comes to this replica (its clients'
        replica stopped) starts from the last half to whole window of the others' usage, not full."""
        if now_ms - self._aged_ms < self._span_ms / 2:
            return
        self._aged_ms = now_ms
        self.remote_old, self.remote = self.remote, {}
        self.partition_remote_old, self.partition_remote = self.partition_remote, {}
        if self.remote_levels:
            old = now_ms - 2 * self.window.size_ms
            self.remote_levels = {k: v for k, v in self.remote_levels.items() if v[1] >= old}

    @property
    def _span_ms(self) -> float:
        return self.window.num * self.window.size_ms

    def add_remote(self, bucket: Bucket, amount: float, now_ms: float) -> None:
        """Another replica's usage of a bucket: added to it at its next use here."""
        self._age_remote(now_ms)
        self.remote[bucket] = self.remote.get(bucket, 0.0) + amount

    def add_remote_many(self, usage: Iterable[tuple[Bucket, float]], now_ms: float) -> None:
        """``add_remote`` for a whole report at once (10,000 entries cost a few milliseconds)."""
        self._age_remote(now_ms)
        remote = self.remote
        get = remote.get
        for bucket, amount in usage:
            remote[bucket] = get(bucket, 0.0) + amount

    def add_remote_partition(self, key: PartitionKey, amount: float, now_ms: float) -> None:
        self._age_remote(now_ms)
        self.partition_remote[key] = self.partition_remote.get(key, 0.0) + amount

    def take_pending(
        self, hot_only: bool = False, now_ms: float = 0.0
    ) -> tuple[list[tuple[Bucket, float, float]], list[tuple[PartitionKey, float, float]]]:
        """This replica's usage of shared buckets and partitions since its last report, emptied,
        with the level of those under pressure (NaN for the others); with ``hot_only``, only of
        those under pressure (the rest wait for the next full report)."""
        hot = self.hot
        if hot_only:
            bucket_keys = [b for b in self.pending if b in hot]
            part_keys = [p for p in self.partition_pending if p in hot]
        else:
            bucket_keys, part_keys = list(self.pending), list(self.partition_pending)
        level, pending, partition_pending = self._level, self.pending, self.partition_pending
        buckets = [(b, pending.pop(b), level(self.shapers, b, now_ms)) for b in bucket_keys]
        parts = [(p, partition_pending.pop(p), level(self.partition_shapers, p, now_ms)) for p in part_keys]
        if not hot_only:
            self.hot = set()
        return buckets, parts

    def _level(
        self,
        table: dict[Bucket, TokenBucket] | dict[PartitionKey, TokenBucket],
        key: Bucket | PartitionKey,
        now_ms: float,
    ) -> float:
        if key not in self.hot:
            return math.nan
        shaper = table.get(key)  # type: ignore[arg-type]
        return math.nan if shaper is None else shaper.tokens(now_ms)

    def add_remote_level(self, key: Bucket | PartitionKey, tokens: float, now_ms: float) -> None:
        """Another replica's level of a bucket under pressure: a bucket made here starts no
        higher (with what refilled since)."""
        held = self.remote_levels.get(key)
        if held is None or tokens < held[0] or now_ms - held[1] > self.window.size_ms:
            self.remote_levels[key] = (tokens, now_ms)

    def shared_rates(self, bucket: Bucket, now_ms: float) -> tuple[float, float]:
        """(this replica's, all replicas') rate of a bucket: its share and the cluster total."""
        rate = self.clients.get(bucket)
        if rate is None:
            return 0.0, 0.0
        if self.remote:
            self._fold(bucket, rate, now_ms)
        total = rate.measure(now_ms)
        others = self.remote_rates.get(bucket)
        remote = others.total(now_ms) / (rate.window_ms(now_ms) / 1000.0) if others is not None else 0.0
        return max(0.0, total - remote), total

    @property
    def steady(self) -> bool:
        """Steady shaping is this table's mode (``produce_shaping`` / ``fetch_shaping``)."""
        return (self.cfg.produce_shaping if self.produce else self.cfg.fetch_shaping) == "steady"

    def shaped(self, match: Match | None) -> bool:
        """Steady shaping applies to this entity (it has a quota, and the mode is steady).

        Kafka's windowed rate forgets a sample once it is a window old; a client whose burst is
        bigger than the window holds (several connections, each with requests in flight) has
        part of it forgotten before its throttle has paid for it, and runs over its quota. The
        token bucket forgets nothing: over any stretch, quota x time plus one burst."""
        return self.steady and match is not None

    def shaper(self, bucket: Bucket) -> TokenBucket | None:
        """The steady-shaping token bucket of ``bucket``, if it has one yet."""
        return self.shapers.get(bucket)

    def _bucket(
        self,
        table: dict[Bucket, TokenBucket] | dict[PartitionKey, TokenBucket],
        key: Bucket | PartitionKey,
        quota: float,
        now_ms: float,
        history: SampledRate | None = None,
        configured: float | None = None,
    ) -> TokenBucket:
        """The steady-shaping token bucket of ``key`` at ``quota``, holding Kafka's burst.

        A new bucket, or one whose configured quota was lowered, holds no more than the recent
        traffic (``history``, the windowed rate of the same key) leaves of the quota: a bucket
        started that long ago would hold that much. So a quota set or lowered on a busy client
        bites at its next request, as a broker's windowed rate, which already holds the
        client's recent traffic, does. (``quota`` may be a part of ``configured``, the quota
        as set: a replica's part while the exchange is down; a changed part is no new quota.)"""
        burst = quota * self.window.max_value_factor_ms / 1000.0
        configured = quota if configured is None else configured
        shaper = table.get(key)  # type: ignore[arg-type]
        if shaper is None:
            shaper = table[key] = TokenBucket(quota, burst, now_ms)  # type: ignore[index]
            shaper.configured = configured
            if history is not None:
                shaper.cap(self._untaken(history, quota, burst, now_ms), now_ms)
            level = self.remote_levels.pop(key, None) if self.remote_levels else None
            if level is not None and now_ms - level[1] <= 2 * self.window.size_ms:
                # The others hold this bucket under pressure: join it where they have it.
                shaper.cap(level[0] + quota * (now_ms - level[1]) / 1000.0, now_ms)
        elif shaper.rate != quota or shaper.burst != burst:
            lowered = configured < shaper.configured
            shaper.reconfigure(quota, burst, now_ms)
            shaper.configured = configured
            if lowered and history is not None:
                shaper.cap(self._untaken(history, quota, burst, now_ms), now_ms)
        return shaper

    @staticmethod
    def _untaken(history: SampledRate, quota: float, burst: float, now_ms: float) -> float:
        """What a bucket at ``quota`` started one measured window ago would hold now, given the
        usage in that window."""
        window_ms = history.window_ms(now_ms)
        return burst + quota * window_ms / 1000.0 - history.total(now_ms)

    def record_partitions(
        self, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> tuple[int, PartitionKey | None]:
        """Charge KIP-1010 topic-partition quotas alone; the largest throttle and its partition.

        ``record`` calls it for every request; the proxy calls it by itself for bytes whose topic
        was addressed by an id it had to look up first (charged once the name is known). Under
        steady shaping each partition's throttle comes from its own token bucket at the topic's
        rate, for the reason ``shaped`` gives."""
        part_ms = 0
        worst: PartitionKey | None = None
        steady = self.steady
        cluster = self.cluster
        for usage in partitions:
            configured = self.topic_quota(usage.topic)
            if configured is None:
                continue
            quota = configured
            key = (usage.topic, usage.partition)
            prate = self._rate(self.partitions, key, now_ms)
            if cluster is not None and self._partition_is_shared(usage.topic):
                self.partition_pending[key] = self.partition_pending.get(key, 0.0) + usage.size
                if self.partition_remote:
                    self._fold_partition(key, prate, now_ms)
                quota *= cluster.multiplier
            if steady:
                shaper = self._bucket(self.partition_shapers, key, quota, now_ms, prate, configured)
                prate.record(usage.size, now_ms)
                shaper.record(usage.size, now_ms)
                ms = shaper.throttle_ms(now_ms)
            else:
                prate.record(usage.size, now_ms)
                ms = throttle_time_ms(prate.measure(now_ms), quota, prate.window_ms(now_ms))
            if cluster is not None and ms:
                self.hot.add(key)
            prate.throttled_ms += ms
            if ms > part_ms:
                part_ms, worst = ms, key
        return part_ms, worst

    def _partition_is_shared(self, topic: str) -> bool:
        try:
            return self._partition_shared[topic]
        except KeyError:
            found = self._partition_shared[topic] = topic_scope(self.cfg, topic) != "instance"
            return found

    def unrecord(
        self, decision: Decision, size: int, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> None:
        """Take back what ``record`` charged, for a fetch answered empty because it was throttled."""
        rate = self.clients.get(decision.bucket)
        if rate is not None:
            rate.unrecord(size, now_ms)
        if decision.bucket in self.pending:
            self.pending[decision.bucket] -= size
        shaper = self.shapers.get(decision.bucket) if decision.shaped else None
        if shaper is not None:
            shaper.record(-size, now_ms)
        for usage in partitions:
            key = (usage.topic, usage.partition)
            prate = self.partitions.get(key)
            if prate is not None:
                prate.unrecord(usage.size, now_ms)
            if key in self.partition_pending:
                self.partition_pending[key] -= usage.size
            pshaper = self.partition_shapers.get(key) if decision.partitions_shaped else None
            if pshaper is not None:
                pshaper.record(-usage.size, now_ms)

    def max_bytes_in_window(self, user: str, client_id: str) -> int | None:
        """Kafka caps a fetch at quota * (num - 1) * window size; None when no quota applies."""
        match = self.match(user, client_id)
        if match is None:
            return None
        return int(match.quota * self.window.max_value_factor_ms / 1000.0)

    def fetch_allowance(self, user: str, client_id: str, now_ms: float) -> int | None:
        """The most a Fetch may bring back now without putting its entity over the quota (None:
        no quota applies): what the bucket holds beyond the fetches already in flight
        (``grant_fetch``), within Kafka's cap of quota x (num - 1) x size, and at least 1 byte (a
        broker then still returns the first batch, KIP-74).

        Kafka caps a fetch at that much and answers a fetch that goes over empty, so a greedy
        consumer sees bursts and then silence; sized to what is left, each fetch comes back
        whole and the consumer sees its quota as a steady rate."""
        match = self.match(user, client_id)
        if match is None:
            return None
        quota = self._effective(match, now_ms)
        cap = max(1, int(quota * self.window.max_value_factor_ms / 1000.0))
        if not self.shaped(match):
            return cap
        # What the bucket holds now, but never less than one window sample's worth: a fetch the
        # size of a few bytes would cost a round trip for nothing; the throttle settles the rest.
        chunk = quota * self.window.size_ms / 1000.0
        history = self.clients.get(match.bucket)
        shaper = self._bucket(self.shapers, match.bucket, quota, now_ms, history, match.quota)
        free = shaper.tokens(now_ms) - self._reserved(match.bucket, now_ms)
        recent = now_ms - self.remote_ms.get(match.bucket, -math.inf) < SHARED_RECENT_MS
        if self.cluster is not None and recent:
            # Other replicas fetch for this entity too, from the same bucket, with grants this
            # one cannot see: each takes its part of what is free.
            free /= max(1, self.cluster.instances)
        return max(1, min(cap, int(max(free, chunk))))

    def _effective(self, match: Match, now_ms: float) -> float:
        """The quota that applies here now: a part of it while the exchange is down; with the
        others' usage of a shared bucket added first."""
        if not self.shared(match):
            return match.quota
        assert self.cluster is not None
        if self.remote:
            rate = self.clients.get(match.bucket)
            if rate is not None:
                self._fold(match.bucket, rate, now_ms)
        return match.quota * self.cluster.multiplier

    def grant_fetch(
        self, user: str, client_id: str, requested: int | None, now_ms: float
    ) -> FetchGrant | None:
        """``fetch_allowance`` for a Fetch about to be sent, held against the entity's tokens until
        ``release`` (None: no quota applies). ``requested`` is the Fetch's own max_bytes.

        A client fetches from every broker at once (and may pipeline): allowed the whole bucket
        each, three fetches bring three buckets' worth, and the entity then owes minutes of
        silence. What is held is what the fetch may bring back, its own max_bytes included."""
        allowed = self.fetch_allowance(user, client_id, now_ms)
        if allowed is None:
            return None
        match = self.match(user, client_id)
        assert match is not None
        reserved = allowed if requested is None else max(0, min(allowed, requested))
        grant = FetchGrant(match.bucket, allowed, reserved if self.shaped(match) else 0, now_ms)
        if grant.reserved:
            self.grants.setdefault(match.bucket, []).append(grant)
        return grant

    def fetch_wait_ms(self, user: str, client_id: str, now_ms: float) -> int:
        """How long a Fetch waits before it is sent (0: send it now): while the entity's bucket
        holds less than a window sample and its fetches in flight may already take all of that,
        a further fetch waits until the bucket has refilled what they hold.

        A consumer's fetches to several brokers, released together once a throttle has passed,
        would otherwise each bring at least a whole record batch at the same moment: a 3-broker
        consumer of 1 MiB batches at 512 KiB/s would get 3 MiB every six seconds instead of
        1 MiB every two. Under quota (the bucket holds a sample or more) nothing waits."""
        match = self.match(user, client_id)
        if match is None or not self.shaped(match) or match.bucket not in self.grants:
            return 0
        shaper = self.shapers.get(match.bucket)
        if shaper is None:
            return 0
        quota = self._effective(match, now_ms)
        tokens = shaper.tokens(now_ms)
        if tokens >= quota * self.window.size_ms / 1000.0:
            return 0
        short = self._reserved(match.bucket, now_ms) - tokens
        return math.ceil(short / quota * 1000.0) if short > 0 else 0

    def release(self, grant: FetchGrant) -> None:
        """The fetch was answered (or will never be): what it held goes back. Idempotent."""
        if grant.released:
            return
        grant.released = True
        held = self.grants.get(grant.bucket)
        if held is not None and grant in held:
            held.remove(grant)
            if not held:
                del self.grants[grant.bucket]

    def _reserved(self, bucket: Bucket, now_ms: float) -> int:
        held = self.grants.get(bucket)
        if not held:
            return 0
        horizon = now_ms - GRANT_MAX_AGE_MS
        if held[0].at_ms < horizon:  # oldest first: grants are appended in time order
            for grant in [g for g in held if g.at_ms < horizon]:
                self.release(grant)
            held = self.grants.get(bucket, [])
        return sum(g.reserved for g in held)

    def maybe_expire(self, now_ms: float) -> int:
        """Drop state idle for ``idle_expiry_seconds``; runs at most once a window."""
        if now_ms - self._last_expiry_ms < self.window.size_ms:
            return 0
        self._last_expiry_ms = now_ms
        horizon = now_ms - self.cfg.idle_expiry_seconds * 1000.0
        dropped = 0
        for table in (self.clients, self.partitions, self.shapers, self.partition_shapers, self.remote_rates):
            stale = [k for k, r in table.items() if r.last_record_ms < horizon]
            for key in stale:
                del table[key]  # type: ignore[arg-type]
                self.remote_ms.pop(key, None)  # type: ignore[arg-type]
            if table is self.clients or table is self.partitions:  # a shaper is part of that state
                dropped += len(stale)
        self._age_remote(now_ms)
        for bucket in list(self.grants):  # grants never given back (see GRANT_MAX_AGE_MS)
            self._reserved(bucket, now_ms)
        if dropped and len(self._matches) > 4 * max(1, len(self.clients)):
            self._matches.clear()
        return dropped
