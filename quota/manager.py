"""Byte-rate quota state for one direction (produce or fetch): client buckets and partitions.

Sans-IO: callers pass the time in ms; nothing here blocks, sleeps or reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from quota.cluster import ClusterLink
from quota.entities import Bucket, Match, any_entity_quota, named_bucket, resolve, topic_quota, topic_scope
from quota.keys import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from quota.rate import SampledRate, java_round, throttle_time_ms
from quota.shared_usage import SharedUsage
from quota.token_bucket import TokenBucket

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.config import QuotaConfig

PartitionKey = tuple[str, int]
# A grant not given back within this long is forgotten (a client's default request.timeout.ms):
# a fetch whose answer never came must not keep its entity's allowance small for ever.
GRANT_MAX_AGE_MS: Final = 30_000.0
# Another replica's usage of a bucket this recent means the bucket is served by several replicas
# at once (a fetch allowance is then split between them).
SHARED_RECENT_MS: Final = 2_000.0
# Replicas whose clients of a shared bucket were throttled this recently share it equally.
SHARERS_WITHIN_MS: Final = 600.0
# The fair-share cap of a replica holds this many seconds of its share as a burst.
FAIR_BURST_SECONDS: Final = 1.0
# A replica whose clients used nothing of a bucket they want more of for this long is starved.
STARVED_MS: Final = 2_000.0


class PartitionUsage:
    """One partition's bytes in a request. A plain class: compiled, a dataclass's generated
    ``__init__`` would run interpreted, and these are built per partition per request."""

    __slots__ = ("partition", "size", "topic")

    def __init__(self, topic: str, partition: int, size: int) -> None:
        self.topic = topic
        self.partition = partition
        self.size = size

    def __repr__(self) -> str:
        return f"PartitionUsage({self.topic!r}, {self.partition}, {self.size})"


class Decision:
    """What one request cost: the throttle to apply (max over client and partitions) and why.
    A plain class (one per request): see ``PartitionUsage``."""

    __slots__ = (
        "bucket",
        "client_rate",
        "client_throttle_ms",
        "match",
        "owed_ms",
        "partition_throttle_ms",
        "partitions_shaped",
        "shaped",
        "throttle_ms",
        "unbounded_ms",
        "worst_partition",
    )

    def __init__(
        self,
        throttle_ms: int,
        client_throttle_ms: int,
        partition_throttle_ms: int,
        bucket: Bucket,
        match: Match | None,
        client_rate: float,
        worst_partition: PartitionKey | None = None,
        shaped: bool = False,
        partitions_shaped: bool = False,
        unbounded_ms: int = 0,
        owed_ms: int = 0,
    ) -> None:
        self.throttle_ms = throttle_ms
        self.client_throttle_ms = client_throttle_ms
        self.partition_throttle_ms = partition_throttle_ms
        self.bucket = bucket
        self.match = match
        self.client_rate = client_rate
        self.worst_partition = worst_partition
        # The client throttle came from steady shaping (a token bucket at the quota). A fetch so
        # throttled goes to the client with it (nothing refused): it was sized to the quota beforehand.
        self.shaped = shaped
        # The partition throttles came from steady shaping too (a token bucket per partition).
        self.partitions_shaped = partitions_shaped
        # The throttle before ``quotas.max_throttle_ms`` bounded it (equal to throttle_ms when not).
        self.unbounded_ms = unbounded_ms
        # Bounded: what the entity's bucket owed before this request, in ms of its quota. A fetch
        # made while it owed is answered empty, so the bound cannot let its bytes through.
        self.owed_ms = owed_ms

    def __repr__(self) -> str:
        return f"Decision(throttle_ms={self.throttle_ms}, bucket={self.bucket!r})"

    @property
    def bounded(self) -> bool:
        """The bound cut this decision's throttle short (the rest stays owed)."""
        return self.unbounded_ms > self.throttle_ms

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


class FetchGrant:
    """The max_bytes a Fetch was allowed and the part of its entity's tokens held for it while it
    is in flight, so fetches sent together (one per broker, or pipelined) share what the bucket
    holds instead of each being allowed all of it. A plain class (one per fetch): see
    ``PartitionUsage``; equal only to itself."""

    __slots__ = ("allowed", "at_ms", "bucket", "released", "reserved")

    def __init__(self, bucket: Bucket, allowed: int, reserved: int, at_ms: float) -> None:
        self.bucket = bucket
        self.allowed = allowed
        self.reserved = reserved
        self.at_ms = at_ms
        self.released = False


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
        # One quota across gateway replicas (quota/cluster.py, quota/shared_usage.py), while the
        # exchange runs: the usage of the shared client buckets and partitions.
        self.cluster: ClusterLink | None = None
        self.shared_buckets: SharedUsage[Bucket] = SharedUsage(now_ms)
        self.shared_partitions: SharedUsage[PartitionKey] = SharedUsage(now_ms)
        # This replica's cap at its equal part of a shared bucket that several replicas' clients
        # want more of (see ``_fair_ms``), per client bucket and per partition.
        self.fair: dict[Bucket, TokenBucket] = {}
        self.partition_fair: dict[PartitionKey, TokenBucket] = {}
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
        self._seed_shared_buckets()

    def _seed_shared_buckets(self) -> None:
        """A group or client-id prefix bucket new in this config starts from what its members sent
        recently (the sum of their own rates' samples), as a quota set on a busy client holds from
        its next request: no fresh bucket's burst for clients already at full speed."""
        if not (self.cfg.groups or self.cfg.client_id_prefixes):
            return
        now = max((rate.last_record_ms for rate in self.clients.values()), default=0.0)
        members: dict[Bucket, list[SampledRate]] = {}
        for bucket, rate in self.clients.items():
            match = None if named_bucket(bucket) else self.match(*bucket)
            if match is not None and match.via and match.bucket not in self.clients:
                members.setdefault(match.bucket, []).append(rate)
        for bucket, rates in members.items():
            self.clients[bucket] = SampledRate.merged(rates, now)

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
        shared = cluster is not None and (match is None or match.scope != "instance")
        held = 0.0  # this replica's own usage not yet back from the exchange
        shaped = self.shaped(match)
        shaper = None
        if shared:
            assert cluster is not None
            quota *= cluster.multiplier
            usage = self.shared_buckets
            usage.seen.add(bucket)
            held_bucket = self.shapers.get(bucket)
            # Near its quota (less than half the burst left), or given out here and not told
            # yet beyond this replica's part of half the burst (the others may be giving out
            # the same burst: a client new to all replicas), the bucket's usage is told every
            # hot interval; the rest waits for the next full report.
            if held_bucket is None:
                if shaped:  # a bucket is made below, from the history with the others' usage
                    usage.fold(bucket, None, rate, now_ms)
                    usage.near.add(bucket)
                elif match is not None:  # Kafka's windowed rate: its part of half the window
                    limit = match.quota * self.window.max_value_factor_ms / 1000.0
                    if usage.own(bucket) > limit / (2 * cluster.instances):
                        usage.near.add(bucket)
            else:
                own = usage.own(bucket)
                left = held_bucket.tokens(now_ms) - own
                if left < held_bucket.burst / 2 or own > held_bucket.burst / (2 * cluster.instances):
                    usage.near.add(bucket)
        if shaped:
            assert match is not None
            # Made before this request is recorded: a new bucket holds what the recent traffic
            # (the others' included) leaves of the quota.
            shaper = self._bucket(self.shapers, bucket, quota, now_ms, rate, match.quota)
        if shared:
            assert cluster is not None
            if not cluster.local_only:  # alone, its usage goes into the bucket at once (below)
                usage.local(bucket, size)
                held = usage.own(bucket)
        rate.record(size, now_ms)
        measured = rate.measure(now_ms)
        client_ms = 0
        if shaper is not None:
            if shared and not cluster.local_only:  # type: ignore[union-attr]
                usage = self.shared_buckets
                part = usage.fair_part(bucket, quota, now_ms, SHARERS_WITHIN_MS)
                if part is not None and usage.starved(bucket, now_ms, STARVED_MS):
                    # Its clients get less than their part while the others are held at theirs
                    # (which sum to the quota): what this replica's view of the bucket owes past
                    # its part's burst came of the others' usage before they were held, and is
                    # not its clients' to wait out.
                    shaper.forgive(now_ms, held - part * FAIR_BURST_SECONDS)
                client_ms = _throttle_ms(shaper.tokens(now_ms) - held, quota)
                if client_ms:  # the shared bucket holds this replica's clients back: they want more
                    usage.throttled(bucket, now_ms, client_ms, capped=False)
                fair_ms = self._fair_ms(self.fair, usage, bucket, part, size, now_ms)
                client_ms = max(client_ms, fair_ms)
            else:
                shaper.record(size, now_ms)
                client_ms = shaper.throttle_ms(now_ms)
        elif match is not None:
            client_ms = throttle_time_ms(measured, quota, rate.window_ms(now_ms))
            if shared and client_ms:
                self.shared_buckets.throttled(bucket, now_ms, client_ms, capped=False)
        part_ms, worst, part_owed_ms = self._record_partitions(partitions, now_ms)
        unbounded = max(client_ms, part_ms)
        owed_ms = 0
        bound = self.cfg.max_throttle_ms
        if bound is not None and unbounded > bound:
            # The rest stays owed in the buckets, throttled in the entity's next requests.
            owed_ms = part_owed_ms
            if quota > 0:
                owed_ms = max(owed_ms, client_ms - java_round(size / quota * 1000.0))
            client_ms, part_ms = min(client_ms, bound), min(part_ms, bound)
        rate.throttled_ms += client_ms
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
            unbounded_ms=unbounded,
            owed_ms=owed_ms,
        )

    # --- one quota across replicas ----------------------------------------------------------------

    @staticmethod
    def _fair_ms(
        table: dict[Bucket, TokenBucket] | dict[PartitionKey, TokenBucket],
        usage: SharedUsage[Bucket] | SharedUsage[PartitionKey],
        key: Bucket | PartitionKey,
        part: float | None,
        size: float,
        now_ms: float,
    ) -> int:
        """The throttle of this replica's equal part of a shared bucket whose clients want more
        on several replicas (0 when no other replica's do).

        The shared bucket holds the sum to the quota. How it is shared between replicas would
        rest on every replica's view of the bucket being the same; views a little apart (a
        report lost, clocks a few milliseconds apart, a replica that joined) stay apart while
        the bucket is in debt, and the replica with the higher view would take the quota from
        the others' clients. Capped at its part (SharedUsage.fair_part), none takes more than
        that, and what one leaves goes to the others through the bucket."""
        if part is None:
            table.pop(key, None)  # type: ignore[arg-type]
            return 0
        burst = part * FAIR_BURST_SECONDS
        fair = table.get(key)  # type: ignore[arg-type]
        if fair is None:
            fair = table[key] = TokenBucket(part, burst, now_ms)  # type: ignore[index]
        elif fair.rate != part:
            fair.reconfigure(part, burst, now_ms)
        fair.record(size, now_ms)
        throttle_ms = fair.throttle_ms(now_ms)
        if throttle_ms:
            usage.throttled(key, now_ms, throttle_ms, capped=True)  # type: ignore[arg-type]
        return throttle_ms

    def add_remote(self, usage: Iterable[tuple[Bucket, float]], now_ms: float) -> None:
        """Another replica's report: its usage of client buckets (10,000 entries: milliseconds)."""
        self.shared_buckets.add_remote(usage, self.shapers, self.clients, now_ms)

    def add_remote_partitions(self, usage: Iterable[tuple[PartitionKey, float]], now_ms: float) -> None:
        self.shared_partitions.add_remote(usage, self.partition_shapers, self.partitions, now_ms)

    def add_wanting(
        self,
        instance: str,
        buckets: Iterable[tuple[Bucket, float, int]],
        partitions: Iterable[tuple[PartitionKey, float, int]],
        now_ms: float,
    ) -> None:
        """What another replica's clients want more of: (key, its usage, its flags)."""
        self.shared_buckets.add_wanting(instance, buckets, now_ms)
        self.shared_partitions.add_wanting(instance, partitions, now_ms)

    def settle(self, now_ms: float) -> None:
        """The exchange stopped working: own usage not yet back goes into the buckets now."""
        self.shared_buckets.settle(self.shapers, now_ms)
        self.shared_partitions.settle(self.partition_shapers, now_ms)

    def mode_changed(self, rejoined: bool, now_ms: float) -> None:
        """The cluster mode changed: every shared bucket refills at its new part of the quota
        from now (not from its next request, which a throttled client may not send for long).
        ``rejoined``: this replica held its part alone and reads the exchange again; what its
        buckets owe then is its own, taken while the others set its part aside: it is dropped,
        or this replica's clients would wait it out while the others' take the quota."""
        assert self.cluster is not None
        multiplier = self.cluster.multiplier
        factor = self.window.max_value_factor_ms / 1000.0
        shared = [s for b, s in self.shapers.items() if b in self.shared_buckets.seen]
        shared += [s for p, s in self.partition_shapers.items() if self._partition_is_shared(p[0])]
        for shaper in shared:
            quota = shaper.configured * multiplier
            if shaper.rate != quota:
                shaper.reconfigure(quota, quota * factor, now_ms)
            if rejoined:
                shaper.forgive(now_ms)

    def take_pending(
        self, hot_only: bool = False, now_ms: float = 0.0
    ) -> tuple[list[tuple[Bucket, float, int]], list[tuple[PartitionKey, float, int]]]:
        """This replica's usage of shared buckets and partitions since its last report, emptied,
        each with its flags (BLOCKED, CAPPED: its clients were throttled lately, and by what);
        with ``hot_only``, only the flagged (the rest wait for the next full report)."""
        return (
            self.shared_buckets.take_pending(hot_only, now_ms, self.shapers),
            self.shared_partitions.take_pending(hot_only, now_ms, self.partition_shapers),
        )

    def fairness(self, bucket: Bucket, now_ms: float) -> dict[str, object]:
        """How the replicas share a bucket now, for the admin endpoint: this replica's flags, its
        fair part (None: no other replica's clients want more) and the replicas whose do."""
        usage = self.shared_buckets
        match = self.match(*bucket) if bucket[0] or bucket[1] else None
        quota = match.quota * (self.cluster.multiplier if self.cluster else 1.0) if match else None
        part = usage.fair_part(bucket, quota, now_ms, SHARERS_WITHIN_MS) if quota else None
        peers = usage.wanting.get(bucket, {})
        return {
            "blocked": bucket in usage.blocked and usage.blocked[bucket] > now_ms,
            "capped": bucket in usage.capped and usage.capped[bucket] > now_ms,
            "fair_part": part,
            "wanting": {
                name: {"age_ms": round(now_ms - at), "rate": round(rate), "flags": flags}
                for name, (at, rate, flags) in sorted(peers.items())
            },
        }

    def shared_rates(self, bucket: Bucket, now_ms: float) -> tuple[float, float]:
        """(this replica's, all replicas') rate of a bucket: its share and the cluster total."""
        rate = self.clients.get(bucket)
        if rate is None:
            return 0.0, 0.0
        if self.cluster is None:
            total = rate.measure(now_ms)
            return total, total
        self.shared_buckets.fold(bucket, self.shapers.get(bucket), rate, now_ms)
        return self.shared_buckets.own_rate(bucket, now_ms), rate.measure(now_ms)

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
                untaken = self._untaken(history, quota, burst, now_ms)
                if self.cluster is not None:
                    # Across replicas a bucket made here joins one the others may hold. Its
                    # history holds the others' usage only since this replica began to read
                    # it: the part of the window before then is taken as used at the quota (a
                    # replica rolled in a second before a busy client's connections moved to it
                    # gave them most of a burst the others had spent). Paid up: its history's
                    # debt was theirs to throttle.
                    unseen_ms = history.window_ms(now_ms) - (now_ms - self.cluster.sharing_since_ms)
                    if unseen_ms > 0:
                        untaken -= quota * unseen_ms / 1000.0
                    untaken = max(0.0, untaken)
                    if self.cluster.local_only:
                        # Holding its part alone (starting, reconnecting, cut off), this replica
                        # cannot tell what the others gave the entity: a new bucket here holds
                        # no burst, so the parts still sum to the quota (a replica rolled in
                        # under a busy client gave out a third of a burst at once).
                        untaken = 0.0
                shaper.cap(untaken, now_ms)
        elif shaper.rate != quota or shaper.burst != burst:
            lowered = configured < shaper.configured
            shaper.reconfigure(quota, burst, now_ms)
            shaper.configured = configured
            if lowered and history is not None:
                shaper.cap(self._untaken(history, quota, burst, now_ms), now_ms)
        return shaper

    @staticmethod
    def _untaken(history: SampledRate, quota: float, burst: float, now_ms: float) -> float:
        """What Kafka's windowed rate still lets the entity take before it is over ``quota``:
        the quota's worth of the measured window less what the window holds (a new entity: the
        whole burst; one at the quota: nothing; one over it: a debt of the throttle Kafka would
        give). The bucket holds that, at most its burst."""
        return quota * history.window_ms(now_ms) / 1000.0 - history.total(now_ms)

    def record_partitions(
        self, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> tuple[int, PartitionKey | None]:
        """Charge KIP-1010 topic-partition quotas alone; the largest throttle and its partition.

        ``record`` calls it for every request; the proxy calls it by itself for bytes whose topic
        was addressed by an id it had to look up first (charged once the name is known). Under
        steady shaping each partition's throttle comes from its own token bucket at the topic's
        rate, for the reason ``shaped`` gives."""
        part_ms, worst, _owed = self._record_partitions(partitions, now_ms)
        return part_ms, worst

    def _record_partitions(
        self, partitions: Iterable[PartitionUsage], now_ms: float
    ) -> tuple[int, PartitionKey | None, int]:
        """``record_partitions``, and the most any of them owed before (ms of its quota)."""
        part_ms = owed_ms = 0
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
            shared = cluster is not None and self._partition_is_shared(usage.topic)
            if shared:
                assert cluster is not None
                quota *= cluster.multiplier
                parts = self.shared_partitions
                parts.fold(key, self.partition_shapers.get(key), prate, now_ms)
            if steady:
                shaper = self._bucket(self.partition_shapers, key, quota, now_ms, prate, configured)
                prate.record(usage.size, now_ms)
                if shared and not cluster.local_only:  # type: ignore[union-attr]
                    parts.local(key, usage.size)
                    held = parts.own(key)
                    part = parts.fair_part(key, quota, now_ms, SHARERS_WITHIN_MS)
                    if part is not None and parts.starved(key, now_ms, STARVED_MS):  # as in record()
                        shaper.forgive(now_ms, held - part * FAIR_BURST_SECONDS)
                    left = shaper.tokens(now_ms) - held
                    untold = held > shaper.burst / (2 * cluster.instances)  # type: ignore[union-attr]
                    if left < shaper.burst / 2 or untold:  # told every hot interval (as in record())
                        parts.near.add(key)
                    ms = _throttle_ms(left, quota)
                    if ms:
                        parts.throttled(key, now_ms, ms, capped=False)
                    ms = max(ms, self._fair_ms(self.partition_fair, parts, key, part, usage.size, now_ms))
                else:
                    shaper.record(usage.size, now_ms)
                    ms = shaper.throttle_ms(now_ms)
            else:
                prate.record(usage.size, now_ms)
                if shared and not cluster.local_only:  # type: ignore[union-attr]
                    self.shared_partitions.local(key, usage.size)
                ms = throttle_time_ms(prate.measure(now_ms), quota, prate.window_ms(now_ms))
            if shared and ms and not steady:
                self.shared_partitions.throttled(key, now_ms, ms, capped=False)
            prate.throttled_ms += ms
            if ms > part_ms:
                part_ms, worst = ms, key
            if ms and quota > 0:
                owed_ms = max(owed_ms, ms - java_round(usage.size / quota * 1000.0))
        return part_ms, worst, owed_ms

    def _partition_is_shared(self, topic: str) -> bool:
        try:
            return self._partition_shared[topic]
        except KeyError:
            found = self._partition_shared[topic] = topic_scope(self.cfg, topic) != "instance"
            return found

    def unrecord(
        self,
        decision: Decision,
        size: int,
        partitions: Iterable[PartitionUsage],
        now_ms: float,
        keep_rates: bool = False,
    ) -> None:
        """Take back what ``record`` charged, for a fetch answered empty because it was throttled;
        ``keep_rates``: only what the buckets were charged (an exempt client's bytes stay
        measured, but owe nothing and take nothing from the others of a shared bucket)."""
        rate = None if keep_rates else self.clients.get(decision.bucket)
        if rate is not None:
            rate.unrecord(size, now_ms)
        cluster = self.cluster
        confirming = cluster is not None and not cluster.local_only and self.shared(decision.match)
        shaper = self.shapers.get(decision.bucket) if decision.shaped else None
        if confirming:  # its usage is pending, or went into the bucket when reported
            self.shared_buckets.take_back(decision.bucket, size, shaper, now_ms)
        elif shaper is not None:
            shaper.record(-size, now_ms)
        for usage in partitions:
            key = (usage.topic, usage.partition)
            prate = None if keep_rates else self.partitions.get(key)
            if prate is not None:
                prate.unrecord(usage.size, now_ms)
            shared_part = (
                cluster is not None and not cluster.local_only and self._partition_is_shared(usage.topic)
            )
            pshaper = self.partition_shapers.get(key) if decision.partitions_shaped else None
            if shared_part:
                self.shared_partitions.take_back(key, usage.size, pshaper, now_ms)
            elif pshaper is not None:
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
        cluster = self.cluster
        if cluster is not None and self.shared(match):
            free -= self.shared_buckets.own(match.bucket)
            if self.shared_buckets.maybe_shared(match.bucket, now_ms, SHARED_RECENT_MS):
                # Other replicas fetch for this entity too (or may: a consumer's first fetches
                # reach every replica at once), from the same bucket, with grants this one
                # cannot see: each takes its part of what is free.
                free /= max(1, cluster.instances)
        return max(1, min(cap, int(max(free, chunk))))

    def _effective(self, match: Match, now_ms: float) -> float:
        """The quota that applies here now: a part of it while the exchange is down; with the
        others' usage of a shared bucket added first."""
        if not self.shared(match):
            return match.quota
        assert self.cluster is not None
        # The windowed rate is made here if need be: the others' usage read before this
        # replica served the entity goes into it (a consumer moved here by a rolled replica is
        # busy, and its first fetch is sized from that), not dropped for want of a table.
        rate = self._rate(self.clients, match.bucket, now_ms)
        self.shared_buckets.fold(match.bucket, self.shapers.get(match.bucket), rate, now_ms)
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
        if self.cluster is not None and self.shared(match):
            tokens -= self.shared_buckets.own(match.bucket)
        if tokens >= quota * self.window.size_ms / 1000.0:
            return 0
        short = self._reserved(match.bucket, now_ms) - tokens
        wait = math.ceil(short / quota * 1000.0) if short > 0 else 0
        bound = self.cfg.max_throttle_ms
        return wait if bound is None else min(wait, bound)

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
        tables = (
            self.clients,
            self.partitions,
            self.shapers,
            self.partition_shapers,
            self.fair,
            self.partition_fair,
        )
        for table in tables:
            stale = [k for k, r in table.items() if r.last_record_ms < horizon]
            for key in stale:
                del table[key]  # type: ignore[arg-type]
            if table is self.clients:
                for key in stale:
                    self.shared_buckets.forget(key)  # type: ignore[arg-type]
            elif table is self.partitions:
                for key in stale:
                    self.shared_partitions.forget(key)  # type: ignore[arg-type]
            if table is self.clients or table is self.partitions:  # a shaper is part of that state
                dropped += len(stale)
        if self.cluster is not None:
            self.shared_buckets.age(self.shapers, self.clients, now_ms)
            self.shared_partitions.age(self.partition_shapers, self.partitions, now_ms)
        for bucket in list(self.grants):  # grants never given back (see GRANT_MAX_AGE_MS)
            self._reserved(bucket, now_ms)
        if dropped and len(self._matches) > 4 * max(1, len(self.clients)):
            self._matches.clear()
        return dropped


def _throttle_ms(tokens: float, quota: float) -> int:
    """The time a bucket at ``quota`` holding ``tokens`` needs to be back at zero (0 if not below)."""
    return java_round(-tokens / quota * 1000.0) if tokens < 0 else 0
