"""Byte-rate quota state for one direction (produce or fetch): client buckets and partitions.

Sans-IO: callers pass the time in ms; nothing here blocks, sleeps or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quota.cluster import FETCH_KIND, PRODUCE_KIND, ClusterView
from quota.entities import Bucket, Match, any_entity_quota, resolve, topic_quota
from quota.keys import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from quota.rate import SampledRate, throttle_time_ms
from quota.token_bucket import TokenBucket

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.config import QuotaConfig

PartitionKey = tuple[str, int]
# A grant not given back within this long is forgotten (a client's default request.timeout.ms):
# a fetch whose answer never came must not keep its entity's allowance small for ever.
GRANT_MAX_AGE_MS = 30_000.0


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
        # Cluster scope (quota/cluster.py): the other instances' rates, when the exchange runs.
        self.cluster: ClusterView | None = None
        self.cluster_buckets: set[Bucket] = set()
        self.kind = PRODUCE_KIND if produce else FETCH_KIND

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
        self.cluster_buckets.clear()  # matched again, with the new scopes, at the next request
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

    def record(
        self, user: str, client_id: str, size: int, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> Decision:
        """Record a request's bytes (record first, then check, as Kafka does) and decide."""
        match = self.match(user, client_id)
        bucket = match.bucket if match is not None else ("", client_id)
        rate = self._rate(self.clients, bucket, now_ms)
        rate.record(size, now_ms)
        measured = rate.measure(now_ms)
        client_ms = 0
        shaped = self.shaped(match)
        if shaped:
            assert match is not None
            shaper = self._bucket(self.shapers, match.bucket, match.quota, now_ms)
            shaper.record(size, now_ms)
            client_ms = shaper.throttle_ms(now_ms)
        elif match is not None:
            client_quota = match.quota
            if match.cluster and self.cluster is not None:
                self.cluster_buckets.add(bucket)
                client_quota = self.cluster.share(self.kind, bucket, client_quota, measured, now_ms)
            client_ms = throttle_time_ms(measured, client_quota, rate.window_ms(now_ms))
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

    @property
    def steady(self) -> bool:
        """Steady shaping is this table's mode (``produce_shaping`` / ``fetch_shaping``)."""
        return (self.cfg.produce_shaping if self.produce else self.cfg.fetch_shaping) == "steady"

    def shaped(self, match: Match | None) -> bool:
        """Steady shaping applies to this entity (not to cluster-scoped quotas, whose share is
        decided per request from the other instances' rates).

        Kafka's windowed rate forgets a sample once it is a window old; a client whose burst is
        bigger than the window holds (several connections, each with requests in flight) has
        part of it forgotten before its throttle has paid for it, and runs over its quota. The
        token bucket forgets nothing: over any stretch, quota x time plus one burst."""
        return self.steady and match is not None and not match.cluster

    def shaper(self, bucket: Bucket) -> TokenBucket | None:
        """The steady-shaping token bucket of ``bucket``, if it has one yet."""
        return self.shapers.get(bucket)

    def _bucket(
        self,
        table: dict[Bucket, TokenBucket] | dict[PartitionKey, TokenBucket],
        key: Bucket | PartitionKey,
        quota: float,
        now_ms: float,
    ) -> TokenBucket:
        """The steady-shaping token bucket of ``key`` at ``quota``, holding Kafka's burst."""
        burst = quota * self.window.max_value_factor_ms / 1000.0
        shaper = table.get(key)  # type: ignore[arg-type]
        if shaper is None:
            shaper = table[key] = TokenBucket(quota, burst, now_ms)  # type: ignore[index]
        elif shaper.rate != quota or shaper.burst != burst:
            shaper.reconfigure(quota, burst, now_ms)
        return shaper

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
        for usage in partitions:
            quota = self.topic_quota(usage.topic)
            if quota is None:
                continue
            key = (usage.topic, usage.partition)
            prate = self._rate(self.partitions, key, now_ms)
            prate.record(usage.size, now_ms)
            if steady:
                shaper = self._bucket(self.partition_shapers, key, quota, now_ms)
                shaper.record(usage.size, now_ms)
                ms = shaper.throttle_ms(now_ms)
            else:
                ms = throttle_time_ms(prate.measure(now_ms), quota, prate.window_ms(now_ms))
            prate.throttled_ms += ms
            if ms > part_ms:
                part_ms, worst = ms, key
        return part_ms, worst

    def unrecord(
        self, decision: Decision, size: int, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> None:
        """Take back what ``record`` charged, for a fetch answered empty because it was throttled."""
        rate = self.clients.get(decision.bucket)
        if rate is not None:
            rate.unrecord(size, now_ms)
        shaper = self.shapers.get(decision.bucket) if decision.shaped else None
        if shaper is not None:
            shaper.record(-size, now_ms)
        for usage in partitions:
            key = (usage.topic, usage.partition)
            prate = self.partitions.get(key)
            if prate is not None:
                prate.unrecord(usage.size, now_ms)
            pshaper = self.partition_shapers.get(key) if decision.partitions_shaped else None
            if pshaper is not None:
                pshaper.record(-usage.size, now_ms)

    def cluster_rates(self, now_ms: float) -> list[tuple[str, Bucket, float]]:
        """This instance's rate for each cluster-scoped bucket: what it reports to the others."""
        out = []
        for bucket in self.cluster_buckets:
            rate = self.clients.get(bucket)
            if rate is not None:
                out.append((self.kind, bucket, rate.measure(now_ms)))
        return out

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
        cap = max(1, int(match.quota * self.window.max_value_factor_ms / 1000.0))
        if not self.shaped(match):
            return cap
        # What the bucket holds now, but never less than one window sample's worth: a fetch the
        # size of a few bytes would cost a round trip for nothing; the throttle settles the rest.
        chunk = match.quota * self.window.size_ms / 1000.0
        shaper = self._bucket(self.shapers, match.bucket, match.quota, now_ms)
        free = shaper.tokens(now_ms) - self._reserved(match.bucket, now_ms)
        return max(1, min(cap, int(max(free, chunk))))

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
        tokens = shaper.tokens(now_ms)
        if tokens >= match.quota * self.window.size_ms / 1000.0:
            return 0
        short = self._reserved(match.bucket, now_ms) - tokens
        return math.ceil(short / match.quota * 1000.0) if short > 0 else 0

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
        for table in (self.clients, self.partitions, self.shapers, self.partition_shapers):
            stale = [k for k, r in table.items() if r.last_record_ms < horizon]
            for key in stale:
                del table[key]  # type: ignore[arg-type]
                self.cluster_buckets.discard(key)
            if table is self.clients or table is self.partitions:  # a shaper is part of that state
                dropped += len(stale)
        for bucket in list(self.grants):  # grants never given back (see GRANT_MAX_AGE_MS)
            self._reserved(bucket, now_ms)
        if dropped and len(self._matches) > 4 * max(1, len(self.clients)):
            self._matches.clear()
        return dropped
