"""KIP-599 controller mutation quotas: who may create or delete how many partitions, and when.

Sans-IO: callers pass the time in ms; nothing here blocks, sleeps or reads a clock.

A ``controller_mutation_rate`` Q, resolved over the same eight entity levels as the byte-rate
quotas, feeds a token bucket of burst num * size_seconds * Q (``controller_window``). The cost of
a topic is its partitions created or deleted. Kafka admits a request in one of two ways:

- strict (CreateTopics v6+, CreatePartitions v3+, DeleteTopics v5+): each topic, in request
  order, is refused with THROTTLING_QUOTA_EXCEEDED while the bucket is below zero, else charged in
  full even when that takes the bucket below zero. The request is throttled only when a topic was
  refused, by the throttle of that refusal; a request that empties the bucket is not.
- permissive (older versions, which know no such error): every topic is charged, and the request
  is throttled when the bucket ends up below zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quota.entities import Bucket, Match, any_entity_quota, resolve
from quota.keys import CONTROLLER_MUTATION_RATE
from quota.rate import QuotaWindow, SampledRate
from quota.token_bucket import TokenBucket

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.cluster_mutations import Alone
    from quota.config import QuotaConfig


@dataclass(frozen=True, slots=True)
class Admission:
    """What one request may do: which topics go through, and how long to throttle the client."""

    accepted: tuple[bool, ...]  # per topic, in request order
    throttle_ms: int
    bucket: Bucket | None  # None when no quota applies
    match: Match | None
    tokens: float  # after the decision (inf when no quota applies)

    @property
    def throttled(self) -> bool:
        return self.throttle_ms > 0

    @property
    def rejected(self) -> int:
        return self.accepted.count(False)


class _State:
    """A live bucket: its tokens, its rate of accepted mutations, and who last used it."""

    __slots__ = ("aligned_ms", "entity", "rate", "throttled_ms", "tokens")

    def __init__(self, tokens: TokenBucket, rate: SampledRate, entity: tuple[str, str]) -> None:
        self.tokens = tokens
        self.rate = rate
        self.throttled_ms = 0.0  # throttle decided against this bucket so far (for metrics)
        self.aligned_ms = -math.inf  # when last brought down to what the replicas' replay left
        self.entity = entity  # the (user, client-id) that last matched it, to re-resolve on reconfigure


class MutationQuotas:
    """``controller_mutation_rate`` for clients, one token bucket per matched entity bucket."""

    def __init__(self, cfg: QuotaConfig, now_ms: float) -> None:
        self.cfg = cfg
        self.window: QuotaWindow = cfg.controller_window.quota_window()
        self.buckets: dict[Bucket, _State] = {}
        self._matches: dict[tuple[str, str], Match | None] = {}
        self._last_expiry_ms = now_ms
        self.active = any_entity_quota(cfg, CONTROLLER_MUTATION_RATE)

    def burst(self, quota: float) -> float:
        """Kafka's TokenBucket burst: samples * window seconds * quota."""
        return self.window.num * self.window.size_ms / 1000.0 * quota

    def reconfigure(self, cfg: QuotaConfig) -> None:
        """Apply a new config, keeping each bucket's tokens while its entity still maps to it.

        A bucket whose quota or window changed keeps its tokens, clamped to the new burst, and
        refills at the new rate from its last update, as Kafka's bucket does once its metric
        config is swapped. A bucket its entity no longer maps to (or no quota) is dropped.
        """
        self.cfg = cfg
        self._matches.clear()
        self.active = any_entity_quota(cfg, CONTROLLER_MUTATION_RATE)
        window = cfg.controller_window.quota_window()
        window_changed = window != self.window
        self.window = window
        for bucket, state in list(self.buckets.items()):
            user, client_id = state.entity
            match = resolve(cfg, user, client_id, CONTROLLER_MUTATION_RATE)
            if match is None or match.bucket != bucket:
                del self.buckets[bucket]
                continue
            tb = state.tokens
            burst = self.burst(match.quota)
            if match.quota != tb.rate or burst != tb.burst:
                tb.reconfigure(match.quota, burst, tb.updated_ms)
            if window_changed:  # the rate is only a metric: start it afresh
                state.rate = SampledRate(window, tb.updated_ms)

    def match(self, user: str, client_id: str) -> Match | None:
        key = (user, client_id)
        try:
            return self._matches[key]
        except KeyError:
            found = self._matches[key] = resolve(self.cfg, user, client_id, CONTROLLER_MUTATION_RATE)
            return found

    def _state(self, match: Match, user: str, client_id: str, now_ms: float) -> _State:
        state = self.buckets.get(match.bucket)
        if state is None:
            tokens = TokenBucket(match.quota, self.burst(match.quota), now_ms)
            state = self.buckets[match.bucket] = _State(
                tokens, SampledRate(self.window, now_ms), (user, client_id)
            )
        else:
            state.entity = (user, client_id)
        return state

    def admit(
        self,
        user: str,
        client_id: str,
        costs: Sequence[int],
        strict: bool,
        now_ms: float,
        scale: float = 1.0,
        alone: Alone | None = None,
    ) -> Admission:
        """Decide a CreateTopics, CreatePartitions or DeleteTopics request, charging what it may do.

        ``costs`` are the partitions each topic creates or deletes, in request order. Strict, as
        Kafka's StrictControllerMutationQuota: check then charge each topic, the throttle being
        that of the last refusal, 0 when none was refused. Permissive, as Kafka's
        PermissiveControllerMutationQuota: charge every topic, then throttle while below zero.
        The mutation rate counts what was charged, as it shares Kafka's sensor with the bucket.

        ``alone``: a replica deciding a cluster-wide quota by itself (``scale`` its part). Its own
        bucket is not the replicas' one: at its first decision since it began to hold its part
        alone, the bucket holds at most its part of what the replicas' replay left, and nothing
        when it never read the replay (a replica rolled in, deciding before it read the exchange,
        gave a third of a burst the others had spent).
        """
        match = self.match(user, client_id)
        if match is None:
            return Admission((True,) * len(costs), 0, None, None, math.inf)
        state = self._state(match, user, client_id, now_ms)
        quota = match.quota * scale  # a replica's part of a cluster-wide quota, while it holds it alone
        if state.tokens.rate != quota:
            state.tokens.reconfigure(quota, self.burst(quota), now_ms)
        if alone is not None and state.aligned_ms < alone.since_ms:
            state.tokens.cap(alone.left(match.bucket, self.burst(match.quota)) * scale, now_ms)
            state.aligned_ms = now_ms
        accepted, throttle_ms, charged = admit_costs(state.tokens, costs, strict, now_ms)
        if charged:
            state.rate.record(charged, now_ms)
        state.throttled_ms += throttle_ms
        tokens = state.tokens.tokens(now_ms)
        self.maybe_expire(now_ms)
        return Admission(accepted, throttle_ms, match.bucket, match, tokens)

    def refund(self, bucket: Bucket, n: int, now_ms: float) -> None:
        """Give back what a topic was charged when the broker refused it for its own reasons.

        Kafka's controller validates a topic before it charges it, so such a topic never cost
        tokens there. The tokens never go past the burst; the mutation rate is taken back too.
        """
        state = self.buckets.get(bucket)
        if state is None:
            return
        state.tokens.record(-n, now_ms)
        state.rate.unrecord(n, now_ms)

    def state(self, user: str, client_id: str, now_ms: float) -> dict[str, object]:
        """The live state of one (user, client-id), JSON-serialisable, for the admin endpoint.

        A matched bucket not yet used reads as a fresh one (full, nothing recorded); none is made.
        """
        match = self.match(user, client_id)
        bucket = match.bucket if match is not None else ("", client_id)
        out: dict[str, object] = {
            "quota": match.quota if match else None,
            "level": match.level if match else None,
            "bucket": {"user": bucket[0], "client_id": bucket[1]},
            "burst": None,
            "tokens": None,
            "mutation_rate": None,
            "throttle_ms": 0,
            "throttle_ms_total": 0.0,
        }
        if match is None:
            return out
        state = self.buckets.get(bucket)
        if state is None:
            out.update(burst=self.burst(match.quota), tokens=self.burst(match.quota), mutation_rate=0.0)
            return out
        out.update(
            burst=state.tokens.burst,
            tokens=state.tokens.tokens(now_ms),
            mutation_rate=state.rate.measure(now_ms),
            throttle_ms=state.tokens.throttle_ms(now_ms),
            throttle_ms_total=state.throttled_ms,
        )
        return out

    def snapshot(self, now_ms: float) -> list[tuple[Bucket, float, float, float]]:
        """(bucket, tokens, mutations per second, throttle ms so far) of each live bucket."""
        return [
            (bucket, s.tokens.tokens(now_ms), s.rate.measure(now_ms), s.throttled_ms)
            for bucket, s in self.buckets.items()
        ]

    def maybe_expire(self, now_ms: float) -> int:
        """Drop buckets with nothing recorded for ``idle_expiry_seconds``; at most once a window.

        As Kafka expires its sensor, a bucket still below zero is dropped too: it comes back full.
        """
        if now_ms - self._last_expiry_ms < self.window.size_ms:
            return 0
        self._last_expiry_ms = now_ms
        horizon = now_ms - self.cfg.idle_expiry_seconds * 1000.0
        stale = [b for b, s in self.buckets.items() if s.tokens.last_record_ms < horizon]
        for bucket in stale:
            del self.buckets[bucket]
        if stale and len(self._matches) > 4 * max(1, len(self.buckets)):
            self._matches.clear()
        return len(stale)


def admit_costs(
    bucket: TokenBucket, costs: Sequence[int], strict: bool, now_ms: float
) -> tuple[tuple[bool, ...], int, int]:
    """Kafka's admission of one request's topics against a bucket: which are accepted, the
    throttle, and the partitions charged (see ``MutationQuotas.admit``)."""
    accepted: list[bool] = []
    throttle_ms = charged = 0
    for cost in costs:
        if strict and bucket.exceeded(now_ms):
            accepted.append(False)
            throttle_ms = bucket.throttle_ms(now_ms)
            continue
        bucket.record(cost, now_ms)
        charged += cost
        accepted.append(True)
        if not strict and bucket.exceeded(now_ms):
            throttle_ms = bucket.throttle_ms(now_ms)
    return tuple(accepted), throttle_ms, charged
