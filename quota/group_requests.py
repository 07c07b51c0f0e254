"""Consumer-group guard rails, sans-IO: every call takes the time in ms.

Per-entity rates, in requests per second, of the requests that make a group coordinator work:
JoinGroup of new members (``join_group_rate``: a consumer crash-looping joins as a new member on
every start, and each join rebalances the whole group), JoinGroup of members rejoining with
their id (``rejoin_group_rate``), SyncGroup and OffsetCommit. No broker has them. Each is a
token bucket per entity bucket (the KIP-55 levels, prefixes and groups, as every client quota),
holding ``window.num x size x rate`` requests as KIP-599's mutation buckets do.

A request is let through when its bucket owes nothing, and then charged; one that comes while
the bucket owes waits until it does not (``wait_ms``), so the coordinator never sees more than
the rate and its burst, whichever connection the requests come on; the answer carries the
throttle its own charge left (``record``), as Kafka's quotas do.
"""

from __future__ import annotations

from dataclasses import dataclass

from quota.config import QuotaConfig
from quota.entities import Bucket, Match, any_entity_quota, resolve
from quota.idle import drop_idle
from quota.keys import (
    GROUP_RATE_KEYS,
    JOIN_GROUP_RATE,
    OFFSET_COMMIT_RATE,
    REJOIN_GROUP_RATE,
    SYNC_GROUP_RATE,
)
from quota.token_bucket import TokenBucket

JOIN_GROUP, SYNC_GROUP, OFFSET_COMMIT = 11, 14, 8  # API keys

API_KEYS_OF: dict[str, int] = {
    JOIN_GROUP_RATE: JOIN_GROUP,
    REJOIN_GROUP_RATE: JOIN_GROUP,
    SYNC_GROUP_RATE: SYNC_GROUP,
    OFFSET_COMMIT_RATE: OFFSET_COMMIT,
}


def quota_key(api_key: int, member_id: str | None = None) -> str:
    """Which rate a request counts against (a JoinGroup's depends on whether it has a member id)."""
    if api_key == JOIN_GROUP:
        return REJOIN_GROUP_RATE if member_id else JOIN_GROUP_RATE
    return SYNC_GROUP_RATE if api_key == SYNC_GROUP else OFFSET_COMMIT_RATE


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """The throttle a request's own charge left (0: none), and the quota that applied."""

    throttle_ms: int
    match: Match | None


NO_QUOTA = GroupDecision(0, None)


class GroupRequestQuotas:
    """Token buckets of group requests per (quota key, entity bucket); only buckets under a quota
    keep any state."""

    def __init__(self, cfg: QuotaConfig, now_ms: float) -> None:
        self.buckets: dict[tuple[str, Bucket], TokenBucket] = {}
        self._matches: dict[tuple[str, str, str], Match | None] = {}
        self._last_expiry_ms = now_ms
        self.reconfigure(cfg, now_ms)

    def reconfigure(self, cfg: QuotaConfig, now_ms: float | None = None) -> None:
        """Apply a new config: buckets keep their tokens at their new rate (a quota removed
        drops its buckets)."""
        self.cfg = cfg
        self.window = cfg.window.quota_window()
        self._matches.clear()
        self.keys = frozenset(k for k in GROUP_RATE_KEYS if any_entity_quota(cfg, k))
        self.api_keys = frozenset(API_KEYS_OF[k] for k in self.keys)
        self.active = bool(self.keys)
        for (key, bucket), tb in list(self.buckets.items()):
            match = self.match(key, *bucket) if key in self.keys else None
            if match is None or match.bucket != bucket:
                del self.buckets[(key, bucket)]
            elif match.quota != tb.rate or self._burst(match.quota) != tb.burst:
                when = now_ms if now_ms is not None else tb.updated_ms
                tb.reconfigure(match.quota, self._burst(match.quota), when)

    def _burst(self, rate: float) -> float:
        return self.window.num * self.window.size_ms / 1000.0 * rate

    def match(self, key: str, user: str, client_id: str) -> Match | None:
        found_key = (key, user, client_id)
        try:
            return self._matches[found_key]
        except KeyError:
            found = self._matches[found_key] = resolve(self.cfg, user, client_id, key)
            return found

    def _bucket(self, key: str, match: Match, now_ms: float) -> TokenBucket:
        tb = self.buckets.get((key, match.bucket))
        if tb is None:
            tb = TokenBucket(match.quota, self._burst(match.quota), now_ms)
            self.buckets[(key, match.bucket)] = tb
        return tb

    def wait_ms(self, key: str, user: str, client_id: str, now_ms: float) -> int:
        """How long a request must wait before it goes on: until its bucket owes nothing."""
        if key not in self.keys:
            return 0
        match = self.match(key, user, client_id)
        if match is None:
            return 0
        tb = self.buckets.get((key, match.bucket))
        return tb.throttle_ms(now_ms) if tb is not None else 0

    def record(self, key: str, user: str, client_id: str, now_ms: float) -> GroupDecision:
        """Charge one request going on now; the throttle its charge leaves."""
        if key not in self.keys:
            return NO_QUOTA
        match = self.match(key, user, client_id)
        self.maybe_expire(now_ms)
        if match is None:
            return NO_QUOTA
        tb = self._bucket(key, match, now_ms)
        tb.record(1.0, now_ms)
        return GroupDecision(tb.throttle_ms(now_ms), match)

    def state(self, user: str, client_id: str, now_ms: float) -> dict[str, dict[str, object]]:
        """Each group rate that applies to this client, for the admin API; creates nothing."""
        out: dict[str, dict[str, object]] = {}
        for key in sorted(self.keys):
            match = self.match(key, user, client_id)
            if match is None:
                continue
            tb = self.buckets.get((key, match.bucket))
            out[key] = {
                "quota": match.quota,
                "level": match.level,
                "bucket": {"user": match.bucket[0], "client_id": match.bucket[1]},
                "tokens": tb.tokens(now_ms) if tb is not None else self._burst(match.quota),
                "burst": self._burst(match.quota),
            }
        return out

    def maybe_expire(self, now_ms: float) -> int:
        """Drop buckets idle for ``idle_expiry_seconds`` (runs at most once a window sample)."""
        if now_ms - self._last_expiry_ms < self.window.size_ms:
            return 0
        self._last_expiry_ms = now_ms
        dropped = drop_idle(self.buckets, now_ms - self.cfg.idle_expiry_seconds * 1000.0)
        if len(self._matches) > 4 * max(256, len(self.buckets)):
            self._matches.clear()
        return dropped
