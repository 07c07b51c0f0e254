"""``request_percentage`` quotas (KIP-124), sans-IO: every call takes the time in ms.

Kafka (ClientRequestQuotaManager) records each request's thread time as a percentage of one
second, so the rate it measures is 'percent of one thread': 100 is one thread kept busy. The
quota is resolved like the byte rates (the same eight entity levels, the same buckets), measured
over the same ``quota.window.*`` windows, recorded first and then checked, and the throttle is
Kafka's formula capped at one window sample (``quota.window.size.seconds``), not the whole window.

At the proxy the request time is the upstream time (request sent to response received). That
includes the broker's queues, the network and any time a request waits by design (a fetch's
max_wait_ms, a JoinGroup's rebalance), none of which Kafka counts: callers should not charge
such waits, nor the requests Kafka exempts (see ``exempt``).
"""

from __future__ import annotations

from dataclasses import dataclass

from quota.config import QuotaConfig
from quota.entities import Bucket, Match, any_entity_quota, resolve
from quota.idle import drop_idle
from quota.keys import REQUEST_PERCENTAGE
from quota.rate import QuotaWindow, SampledRate, throttle_time_ms

PERCENT_PER_SECOND = 100.0  # Kafka: nanos * 100 / 1e9, so one second of time is 100 (%)

# Kafka handles these inter-broker ("cluster action") requests with the exempt send path:
# LeaderAndIsr 4, StopReplica 5, UpdateMetadata 6, ControlledShutdown 7, WriteTxnMarkers 27,
# AlterPartition 56. A client never legitimately sends them; when one fails its cluster
# authorization Kafka charges it after all.
CLUSTER_ACTION_API_KEYS: frozenset[int] = frozenset({4, 5, 6, 7, 27, 56})
# A SASL login, and a KIP-368 re-login, is read by the broker's authenticator in its network
# layer and never reaches the request handlers or their quota: SaslHandshake 17, SaslAuthenticate 36.
SASL_API_KEYS: frozenset[int] = frozenset({17, 36})

_PRODUCE, _FETCH = 0, 1


def exempt(api_key: int, *, acks: int | None = None, replica_id: int = -1) -> bool:
    """Whether Kafka leaves this request out of the request quota: produce with acks=0 (no
    response to throttle), a follower's fetch (replica id >= 0), the cluster actions and the
    SASL login's requests."""
    if api_key == _PRODUCE:
        return acks == 0
    if api_key == _FETCH:
        return replica_id >= 0
    return api_key in CLUSTER_ACTION_API_KEYS or api_key in SASL_API_KEYS


def seconds_to_percentage(seconds: float) -> float:
    """Request time as Kafka records it: percent of one second (nanosToPercentage)."""
    return seconds * PERCENT_PER_SECOND


def max_throttle_ms(window: QuotaWindow) -> int:
    """Kafka caps a request-time throttle at one sample (quotaWindowSizeSeconds in ms)."""
    return int(window.size_ms)


@dataclass(frozen=True, slots=True)
class RequestTimeDecision:
    """The throttle for one request (0 when none applies) and the bucket's measured percentage."""

    throttle_ms: int
    percentage: float
    bucket: Bucket
    match: Match | None

    @property
    def throttled(self) -> bool:
        return self.throttle_ms > 0


class RequestTimeQuotas:
    """Request-time percentages per bucket; only buckets under a quota keep any state."""

    def __init__(self, cfg: QuotaConfig, now_ms: float) -> None:
        self.cfg = cfg
        self.window = cfg.window.quota_window()
        self.rates: dict[Bucket, SampledRate] = {}
        self._matches: dict[tuple[str, str], Match | None] = {}
        self._last_expiry_ms = now_ms
        self.active = any_entity_quota(cfg, REQUEST_PERCENTAGE)

    def reconfigure(self, cfg: QuotaConfig) -> None:
        """Apply a new config; rates are kept unless the window changed (Kafka keeps its sensors)."""
        self.cfg = cfg
        window = cfg.window.quota_window()
        if window != self.window:
            self.window = window
            self.rates.clear()
        self._matches.clear()
        self.active = any_entity_quota(cfg, REQUEST_PERCENTAGE)

    def match(self, user: str, client_id: str) -> Match | None:
        key = (user, client_id)
        try:
            return self._matches[key]
        except KeyError:
            found = self._matches[key] = resolve(self.cfg, user, client_id, REQUEST_PERCENTAGE)
            return found

    def record(
        self, user: str, client_id: str, upstream_seconds: float, now_ms: float
    ) -> RequestTimeDecision:
        """Charge one request's upstream time (record first, then check, as Kafka does) and decide.

        A negative time (a clock stepping back) counts as none.
        """
        match = self.match(user, client_id)
        if match is None:
            self.maybe_expire(now_ms)
            return RequestTimeDecision(0, 0.0, ("", client_id), None)
        rate = self.rates.get(match.bucket)
        if rate is None:
            rate = self.rates[match.bucket] = SampledRate(self.window, now_ms)
        rate.record(seconds_to_percentage(max(0.0, upstream_seconds)), now_ms)
        measured = rate.measure(now_ms)
        uncapped = throttle_time_ms(measured, match.quota, rate.window_ms(now_ms))
        throttle = min(uncapped, max_throttle_ms(self.window))
        rate.throttled_ms += throttle
        self.maybe_expire(now_ms)
        return RequestTimeDecision(throttle, measured, match.bucket, match)

    def state(self, user: str, client_id: str, now_ms: float) -> dict[str, object]:
        """What applies to this client and how much it has used, for the admin API; creates nothing."""
        match = self.match(user, client_id)
        if match is None:
            return {"quota": None, "level": None, "bucket": None, "percentage": 0.0, "throttle_ms_total": 0.0}
        rate = self.rates.get(match.bucket)
        return {
            "quota": match.quota,
            "level": match.level,
            "bucket": {"user": match.bucket[0], "client_id": match.bucket[1]},
            "percentage": rate.measure(now_ms) if rate is not None else 0.0,
            "throttle_ms_total": rate.throttled_ms if rate is not None else 0.0,
        }

    def snapshot(self, now_ms: float) -> list[tuple[Bucket, float, float]]:
        """(bucket, percentage, throttle ms so far) of every bucket with state, for metrics."""
        return [(bucket, rate.measure(now_ms), rate.throttled_ms) for bucket, rate in self.rates.items()]

    def maybe_expire(self, now_ms: float) -> int:
        """Drop buckets idle for ``idle_expiry_seconds``; runs at most once a window sample."""
        if now_ms - self._last_expiry_ms < self.window.size_ms:
            return 0
        self._last_expiry_ms = now_ms
        dropped = drop_idle(self.rates, now_ms - self.cfg.idle_expiry_seconds * 1000.0)
        # Lookups are cached per (user, client-id), quota or not: keep the cache from growing unbounded.
        if len(self._matches) > 4 * max(256, len(self.rates)):
            self._matches.clear()
        return dropped
