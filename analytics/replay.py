"""Replay captured traffic through the proxy's own quota code under a proposed config.

An operator wants to see what a proposal would cost before applying it: who would be throttled,
how often and for how long. The answer comes from the very classes the proxy runs
(``ByteRateQuotas``, ``MutationQuotas``, ``ProducerIdQuotas``), fed the captured requests in time
order the way ``proxy/throttling.py`` feeds them live; no formula is copied here.

How each captured row is replayed (``api_key``):

- Produce (0): ``ByteRateQuotas(produce).record(principal, client_id, request_bytes, partitions)``
  at ``ts_ms``, then, for a user with a ``producer_ids_rate``, ``ProducerIdQuotas.record`` with the
  row's ``producer_ids``. The request's throttle is the largest of the quotas it is over (the
  client's from the token bucket under ``produce_shaping: steady``, as live).
- Fetch (1): ``ByteRateQuotas(fetch).record(principal, client_id, response_bytes, partitions)`` at
  the time the proxy charged it, the response: ``ts_ms + upstream_ms``. A throttled fetch is
  answered empty, so its bytes are taken back (``unrecord``) unless the config is in dry-run (the
  proxy keeps them then; ``enforce`` overrides that) or its throttles all come from steady shaping
  (``fetch_shaping: steady``: delivered with its throttle).
- InitProducerId (22): ``ProducerIdQuotas.pending_throttle_ms`` at the response, as the proxy
  answers it.
- CreateTopics, DeleteTopics, CreatePartitions with ``mutations >= 0``:
  ``MutationQuotas.admit(principal, client_id, [mutations], strict)``, strict from
  ``protocol.versions.STRICT_MUTATION_FROM`` (the one place for that fact).

The capture's own decisions (``throttle_ms``, ``decided_throttle_ms``, ``dry_run``) are ignored:
the replay decides. Approximations, all because the capture does not carry more:

- A mutation row carries the request's total, not its per-topic costs: it is admitted or
  rejected as one topic of that cost. A strict request that would have had some topics admitted
  and the rest rejected is all admitted or all rejected here. Refunds for topics the broker
  refused are not replayed (the capture does not say how many partitions they had).
- ``request_percentage`` is not replayed (the capture's ``upstream_ms`` is not the busy time the
  proxy charges), nor is its effect on a fetch (a fetch throttled by request time only is not
  taken back here).
- Topics a request addressed by id appear in the capture as 32 hex digits; the proxy applies no
  topic quota to them, and neither does the replay (a topic really named so would be skipped too).
- The replay sees the traffic that happened; clients that would have backed off under the
  proposal would have sent less, so the throttle reported is an upper bound in that sense.
- Ties (same charge time) are replayed in input order (in Spark: in the order rows were read).

API: ``replay_rows`` (pure Python, one result per quota bucket, ``RESULT_COLUMNS``),
``replay_requests`` (each row's decision, to compare with what the proxy decided live) and
``replay`` (the same results as ``replay_rows``, from a Spark DataFrame of captures, at scale).

At scale, buckets are independent, so only buckets that can exceed their quota are replayed, each
from its own rows; the others get their request counts from aggregates. The pruning bound
(``rate_bound``), from the rate definition in quota/rate.py: measured at time t, the live samples
started at s0 > t - num * size (older ones are purged first) and hold only what was recorded in
[s0, t]; the window divided by is at least max(t - s0, (num - 1) * size, 1 ms); ``unrecord`` only
takes away. With the bytes summed per slot of g ms, [s0, t] touches k consecutive slots where
t - s0 > (k - 2) * g and k <= ceil(num * size / g) + 1, so no rate the bucket measures exceeds
max over k of (largest sum of k consecutive slots) / max((k - 2) * g, (num - 1) * size, 1 ms).
A bucket whose bound is at most its quota is never throttled (Kafka throttles only a rate
strictly above the quota) and is not replayed. With Kafka's 11 x 1 s and g = 500 ms, steady
traffic up to ~91% of its quota is pruned. Producer ids use the same bound on the distinct ids per
half filter window (an id seen at t is remembered until at least t + window / 2, quota/bloom.py,
so it is new at most once in any half window), after a first bound that counts every id of every
request as new. Mutations are not pruned (they are few) and are replayed as one unit, since their
buckets come back full after an idle expiry whose timing depends on all traffic. Fetch buckets
that share requests are replayed together: a fetch throttled by either its client or one of its
partitions takes its bytes back from both.

In ``kthrottle tune`` the statistics pass already sums every entity and partition per second
(``analytics.stats.Seconds``), so the replay bounds from those first, with 1 s slots and the
bound shifted by the longest upstream time of the fetches summed (a fetch is slotted by its send
and charged at its response): request counts and most pruning come without reading a record.
Only buckets that bound leaves over their quota, but not far over (``REFINE_BELOW``) and with
enough requests to be worth a pass (``REPLAY_ROW_COST``), are bounded again at ``slot_ms`` from
the records; the rest are replayed. Pruning more or less changes the time, never a result.

Byte-rate and producer-id buckets replayed apart expire exactly as they would together as long
as ``idle_expiry_seconds`` is at least the rate window (``num * size``): an expired rate had
nothing left in it to lose. Below that, the Spark replay may differ slightly from ``replay_rows``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from protocol.api_keys import ApiKey
from quota.keys import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
)
from quota.keys import (
    DEFAULT as DEFAULT_TOPIC,
)
from quota.manager import ByteRateQuotas, PartitionUsage
from quota.mutations import MutationQuotas
from quota.plain_config import plain
from quota.producer_ids import NO_PRODUCER_ID, ProducerIdQuotas
from quota.rate import QuotaWindow

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession

    from analytics.stats import Seconds
    from quota.config import QuotaConfig

TOPIC_PRODUCER = "topic_producer"
TOPIC_CONSUMER = "topic_consumer"
QUOTAS: tuple[str, ...] = (
    PRODUCER_BYTE_RATE,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_IDS_RATE,
    TOPIC_PRODUCER,
    TOPIC_CONSUMER,
)
RESULT_COLUMNS: tuple[str, ...] = (
    "quota",
    "user",
    "client_id",
    "topic",
    "partition",
    "level",
    "quota_value",
    "requests",
    "throttled_requests",
    "throttle_ms_total",
    "max_throttle_ms",
    "rejected_mutations",
    # Per request, the largest throttle of all quotas it was under (what the client would wait),
    # summed over the requests of a producer_byte_rate / consumer_byte_rate bucket; for the other
    # quotas their own figures.
    "effective_throttled_requests",
    "effective_throttle_ms_total",
    "effective_max_throttle_ms",
)

PRODUCE, FETCH, INIT_PRODUCER_ID = int(ApiKey.PRODUCE), int(ApiKey.FETCH), int(ApiKey.INIT_PRODUCER_ID)
MUTATION_KEYS: frozenset[int] = frozenset(
    int(k) for k in (ApiKey.CREATE_TOPICS, ApiKey.DELETE_TOPICS, ApiKey.CREATE_PARTITIONS)
)
REPLAYED_KEYS: frozenset[int] = frozenset({PRODUCE, FETCH, INIT_PRODUCER_ID}) | MUTATION_KEYS
# Decided when the response comes back, so charged at ts_ms + upstream_ms.
AT_RESPONSE: frozenset[int] = frozenset({FETCH, INIT_PRODUCER_ID})

# With the statistics' seconds, a bucket whose coarse bound is over this many times its quota is
# replayed without the finer look (a pass over the records): it is most likely over its quota, and
# replaying one that is not changes no result, only time.
REFINE_BELOW = 1.5
# The finer look is one pass over all records; replaying a request costs about as much as reading
# this many in such a pass (measured on local[2]: ~20 us against ~0.25 us). Buckets with fewer
# requests than records / this, together, are replayed without it.
REPLAY_ROW_COST = 80

_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
_TOPIC_ID_SQL = "^[0-9a-f]{32}$"

Key = tuple[str, str, str, str, int]  # quota, user, client_id, topic, partition (-1: not a partition)


def strict_mutation_versions() -> dict[int, int]:
    """KIP-599 strict versions per mutation api key, from protocol/versions.py (never retyped).

    Imported lazily: it pulls the protocol schemas, which the rest of the replay does not need.
    """
    from protocol.versions import STRICT_MUTATION_FROM

    return {int(k): int(v) for k, v in STRICT_MUTATION_FROM.items()}


@lru_cache(maxsize=65536)
def is_topic_id(topic: str) -> bool:
    """A topic the request addressed by id (the capture writes the 16-byte id in hex)."""
    return _TOPIC_ID.fullmatch(topic) is not None


def charge_time_ms(api_key: int, ts_ms: float, upstream_ms: float) -> float:
    """When the proxy decided the request: fetch and InitProducerId at their response."""
    if api_key in AT_RESPONSE and upstream_ms >= 0:
        return ts_ms + upstream_ms
    return float(ts_ms)


def sliding_peaks(groups: Any, slots: Any, values: Any, span: int) -> dict[int, float]:
    """Per group, the largest sum of ``values`` over ``span`` consecutive slot indexes.

    Vectorised (numpy): rows sorted by (group, slot), prefix sums, and for each row the first row
    of its group no more than ``span - 1`` slots before it. Slots need not be distinct or dense.
    """
    import numpy as np

    g = np.asarray(groups, dtype=np.int64)
    if g.size == 0:
        return {}
    s = np.asarray(slots, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    order = np.lexsort((s, g))
    g, s, v = g[order], s[order] - s.min(), v[order]
    stride = int(s.max()) + span + 1  # keeps every search inside its own group
    key = g * stride + s
    csum = np.concatenate(([0.0], np.cumsum(v)))
    lo = np.searchsorted(key, key - (span - 1), side="left")
    hi = np.searchsorted(key, key, side="right")  # rows of the same slot count together
    sums = csum[hi] - csum[lo]
    starts = np.concatenate(([0], np.flatnonzero(np.diff(g)) + 1))
    peaks = np.maximum.reduceat(sums, starts)
    return {int(k): float(p) for k, p in zip(g[starts], peaks, strict=True)}


def rate_bound(
    groups: Any,
    slots: Any,
    values: Any,
    window: QuotaWindow,
    slot_ms: float,
    steps: int = 8,
    shift_ms: float = 0.0,
) -> dict[int, float]:
    """Per group, a rate (per second) that no measurement of its SampledRate can exceed, given the
    values recorded per slot (slot index = floor(time / slot_ms)).

    Why (quota/rate.py): when measured at ``now``, the live samples started at s0 > now - num*size
    (older ones are purged) and hold only values recorded in [s0, now], and the window divided by
    is at least max(now - s0, (num - 1) * size, 1 ms). [s0, now] touches k consecutive slots with
    now - s0 > (k - 2) * slot_ms and k <= ceil(num * size / slot_ms) + 1. So the rate is at most
    max over k of (largest sum over k consecutive slots) / max((k - 2) * slot_ms, (num - 1) * size,
    1 ms). Taking values back (a throttled fetch) only lowers the truth.

    ``shift_ms``: the values were slotted by a time up to ``shift_ms`` before the one they were
    recorded at (a fetch slotted by its send, charged at its response). What was recorded in
    [s0, now] was then slotted in [s0 - shift, now]: k slots with now - s0 > (k - 2) * slot_ms -
    shift, k <= ceil((num * size + shift) / slot_ms) + 1, the same bound with those.
    """
    last = math.ceil((window.num * window.size_ms + shift_ms) / slot_ms - 1e-9) + 1
    floor_ms = max(window.max_value_factor_ms, 1.0)
    first = min(last, max(1, math.floor((floor_ms + shift_ms) / slot_ms + 1e-9) + 2))
    # Up to ``first`` every k has the floor as denominator; past it, check ``steps`` spans of k,
    # each at its largest k (the largest sum) over its smallest k's denominator: never below.
    checks = sorted({first, *(first + math.ceil((last - first) * i / steps) for i in range(1, steps + 1))})
    out: dict[int, float] = {}
    previous = 0
    for k in checks:
        smallest = previous + 1
        per_second = 1000.0 / max((smallest - 2) * slot_ms - shift_ms, floor_ms)
        for group, peak in sliding_peaks(groups, slots, values, k).items():
            out[group] = max(out.get(group, 0.0), peak * per_second)
        previous = k
    return out


def shifted_rate_bound(
    groups: Any, slots: Any, values: Any, shifts: Any, window: QuotaWindow, slot_ms: float
) -> dict[int, float]:
    """``rate_bound`` with each group's own shift: the largest of its rows' ``shifts`` (ms),
    rounded up to whole slots so that groups of the same rounded shift are bounded together."""
    import numpy as np

    g = np.asarray(groups, dtype=np.int64)
    if g.size == 0:
        return {}
    shift = np.nan_to_num(np.asarray(shifts, dtype=np.float64), nan=0.0)
    per_group = np.zeros(int(g.max()) + 1)
    np.maximum.at(per_group, g, shift)
    classes = np.ceil(per_group / slot_ms - 1e-9).astype(np.int64)
    row_class = classes[g]
    s, v = np.asarray(slots, dtype=np.int64), np.asarray(values, dtype=np.float64)
    out: dict[int, float] = {}
    for c in np.unique(row_class):
        mask = row_class == c
        out.update(rate_bound(g[mask], s[mask], v[mask], window, slot_ms, shift_ms=float(c) * slot_ms))
    return out


# --- the replay itself ----------------------------------------------------------------------------


class _Stat:
    __slots__ = (
        "eff_max",
        "eff_n",
        "eff_total",
        "level",
        "max",
        "quota",
        "rejected",
        "requests",
        "throttled",
        "total",
    )

    def __init__(self, level: int | None, quota: float | None) -> None:
        self.level = level
        self.quota = quota
        self.requests = self.throttled = self.total = self.max = self.rejected = 0
        self.eff_n = self.eff_total = self.eff_max = 0

    def add(self, ms: int) -> None:
        self.requests += 1
        if ms > 0:
            self.throttled += 1
            self.total += ms
            self.max = max(self.max, ms)

    def effective(self, ms: int) -> None:
        if ms > 0:
            self.eff_n += 1
            self.eff_total += ms
            self.eff_max = max(self.eff_max, ms)


def _client_key(quota: str, bucket: tuple[str, str]) -> Key:
    return (quota, bucket[0], bucket[1], "", -1)


class _Replayer:
    """One set of the proxy's quota objects, fed requests the way proxy/throttling.py feeds them."""

    def __init__(
        self, cfg: QuotaConfig, now_ms: float, enforce: bool, strict_from: Mapping[int, int]
    ) -> None:
        self.produce = ByteRateQuotas(cfg, produce=True, now_ms=now_ms)
        self.fetch = ByteRateQuotas(cfg, produce=False, now_ms=now_ms)
        self.mutations = MutationQuotas(cfg, now_ms)
        self.pids = ProducerIdQuotas(cfg, now_ms)
        self.enforce = enforce
        self.strict_from = strict_from
        self.stats: dict[Key, _Stat] = {}

    def _stat(self, key: Key, level: int | None, quota: float | None) -> _Stat:
        stat = self.stats.get(key)
        if stat is None:
            stat = self.stats[key] = _Stat(level, quota)
        return stat

    def _record(
        self, q: ByteRateQuotas, user: str, client_id: str, size: int, usages: list[PartitionUsage], t: float
    ) -> tuple[int, _Stat, Any]:
        """Record as the proxy does; attribute the client's and each partition's own throttle."""
        quota_name, topic_name = (
            (PRODUCER_BYTE_RATE, TOPIC_PRODUCER) if q.produce else (CONSUMER_BYTE_RATE, TOPIC_CONSUMER)
        )
        # ByteRateQuotas keeps each partition's throttle so far; the difference is this request's.
        before = []
        for u in usages:
            rate = q.partitions.get((u.topic, u.partition))
            before.append(rate.throttled_ms if rate is not None else 0.0)
        decision = q.record(user, client_id, size, usages, t)
        match = decision.match
        stat = self._stat(
            _client_key(quota_name, decision.bucket),
            match.level if match else None,
            match.quota if match else None,
        )
        stat.add(decision.client_throttle_ms)
        for u, was in zip(usages, before, strict=True):
            quota = q.topic_quota(u.topic)
            if quota is None:
                continue
            rate = q.partitions[(u.topic, u.partition)]
            self._stat((topic_name, "", "", u.topic, u.partition), None, quota).add(
                round(rate.throttled_ms - was)
            )
        return decision.throttle_ms, stat, decision

    def produce_request(
        self, user: str, client_id: str, size: int, usages: list[PartitionUsage], ids: list[int], t: float
    ) -> int:
        """QuotaEnforcer.on_produce: bytes first, then producer ids new to the user."""
        throttle, stat, _ = self._record(self.produce, user, client_id, size, usages, t)
        if ids and self.pids.active and self.pids.match(user) is not None:
            throttle = max(throttle, self.producer_ids(user, ids, t))
        stat.effective(throttle)
        return throttle

    def producer_ids(self, user: str, ids: list[int], t: float) -> int:
        decision = self.pids.record(user, ids, t)
        match = decision.match
        assert match is not None
        self._stat((PRODUCER_IDS_RATE, user, "", "", -1), match.level, match.quota).add(decision.throttle_ms)
        return decision.throttle_ms

    def fetch_response(
        self, user: str, client_id: str, size: int, usages: list[PartitionUsage], t: float
    ) -> int:
        """QuotaEnforcer.on_fetch_response: a throttled fetch goes out empty, its bytes taken back,
        unless its throttles all come from steady shaping (then it goes out with them)."""
        if not self.fetch.active:
            return 0
        throttle, stat, decision = self._record(self.fetch, user, client_id, size, usages, t)
        delivered = decision.deliverable
        if throttle and self.enforce and not delivered:
            self.fetch.unrecord(decision, size, usages, t)
        stat.effective(throttle)
        return throttle

    def init_producer_id(self, user: str, t: float) -> int:
        """QuotaEnforcer.on_init_producer_id: the throttle the user's next new id would meet."""
        if not self.pids.active:
            return 0
        match = self.pids.match(user)
        if match is None:
            return 0
        ms = self.pids.pending_throttle_ms(user, t)
        self._stat((PRODUCER_IDS_RATE, user, "", "", -1), match.level, match.quota).add(ms)
        return ms

    def mutation(self, api_key: int, version: int, user: str, client_id: str, cost: int, t: float) -> int:
        """QuotaEnforcer.on_mutation, the request's mutations taken as one topic's cost."""
        if cost < 0 or not self.mutations.active:
            return 0
        strict = version >= self.strict_from.get(api_key, 1 << 15)
        admission = self.mutations.admit(user, client_id, [cost], strict, t)
        match = admission.match
        if admission.bucket is None or match is None:
            return 0
        stat = self._stat(_client_key(CONTROLLER_MUTATION_RATE, admission.bucket), match.level, match.quota)
        stat.add(admission.throttle_ms)
        if admission.rejected:
            stat.rejected += cost
        return admission.throttle_ms

    def request(self, row: _Row) -> int:
        api = row.api_key
        if api == PRODUCE:
            return self.produce_request(row.user, row.client_id, row.size, row.usages, row.ids, row.t)
        if api == FETCH:
            return self.fetch_response(row.user, row.client_id, row.size, row.usages, row.t)
        if api == INIT_PRODUCER_ID:
            return self.init_producer_id(row.user, row.t)
        if api in MUTATION_KEYS:
            return self.mutation(api, row.version, row.user, row.client_id, row.size, row.t)
        return 0

    def results(self, keep: Callable[[Key], bool] | None = None) -> list[dict[str, Any]]:
        return [_result(key, stat) for key, stat in self.stats.items() if keep is None or keep(key)]


def _result(key: Key, stat: _Stat) -> dict[str, Any]:
    quota, user, client_id, topic, partition = key
    client_bytes = quota in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
    return {
        "quota": quota,
        "user": user,
        "client_id": client_id,
        "topic": topic,
        "partition": partition,
        "level": stat.level,
        "quota_value": stat.quota,
        "requests": stat.requests,
        "throttled_requests": stat.throttled,
        "throttle_ms_total": stat.total,
        "max_throttle_ms": stat.max,
        "rejected_mutations": stat.rejected,
        "effective_throttled_requests": stat.eff_n if client_bytes else stat.throttled,
        "effective_throttle_ms_total": stat.eff_total if client_bytes else stat.total,
        "effective_max_throttle_ms": stat.eff_max if client_bytes else stat.max,
    }


def _reportable(result: Mapping[str, Any]) -> bool:
    """Client byte buckets without a quota are listed only when another quota throttled them."""
    if result["quota"] in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE) and result["quota_value"] is None:
        return bool(result["effective_throttled_requests"])
    return bool(result["requests"])


def _sort_key(result: Mapping[str, Any]) -> tuple[int, str, str, str, int]:
    return (
        QUOTAS.index(result["quota"]),
        result["user"],
        result["client_id"],
        result["topic"],
        result["partition"],
    )


def _finish(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((r for r in results if _reportable(r)), key=_sort_key)


@dataclass(slots=True)
class _Row:
    t: float
    api_key: int
    version: int
    user: str
    client_id: str
    size: int  # bytes charged (request or response), or the mutations asked for
    usages: list[PartitionUsage]
    ids: list[int]


def _get(row: Mapping[str, Any], name: str, default: Any) -> Any:
    try:
        value = row[name]
    except (KeyError, ValueError, IndexError):
        return default
    return default if value is None else value


def _usages(partitions: Iterable[Any]) -> list[PartitionUsage]:
    """The capture's partitions as ByteRateQuotas takes them, topic ids left out as live."""
    out = []
    for p in partitions:
        topic = str(p["topic"])
        if not is_topic_id(topic):
            out.append(PartitionUsage(topic, int(p["partition"]), int(p["bytes"])))
    return out


def _valid_ids(ids: Iterable[Any]) -> list[int]:
    return [int(pid) for pid in ids if int(pid) > NO_PRODUCER_ID]


def _to_row(row: Mapping[str, Any]) -> _Row | None:
    api = int(row["api_key"])
    if api not in REPLAYED_KEYS:
        return None
    t = charge_time_ms(api, float(row["ts_ms"]), float(_get(row, "upstream_ms", -1.0)))
    usages: list[PartitionUsage] = []
    ids: list[int] = []
    if api == PRODUCE:
        size = int(_get(row, "request_bytes", 0))
        usages = _usages(_get(row, "partitions", ()))
        ids = _valid_ids(_get(row, "producer_ids", ()))
    elif api == FETCH:
        size = int(_get(row, "response_bytes", 0))
        usages = _usages(_get(row, "partitions", ()))
    elif api in MUTATION_KEYS:
        size = int(_get(row, "mutations", -1))
    else:
        size = 0
    return _Row(
        t,
        api,
        int(_get(row, "api_version", 0)),
        str(row["principal"]),
        str(_get(row, "client_id", "")),
        size,
        usages,
        ids,
    )


def _replay(
    rows: Iterable[Mapping[str, Any]],
    cfg: QuotaConfig,
    enforce: bool | None,
    strict_from: Mapping[int, int] | None,
) -> tuple[_Replayer | None, list[tuple[int, _Row, int]]]:
    parsed = [(i, r) for i, r in enumerate(_to_row(row) for row in rows) if r is not None]
    parsed.sort(key=lambda item: (item[1].t, item[0]))
    if not parsed:
        return None, []
    replayer = _Replayer(
        cfg,
        parsed[0][1].t,
        (not cfg.dry_run) if enforce is None else enforce,
        strict_mutation_versions() if strict_from is None else strict_from,
    )
    return replayer, [(i, row, replayer.request(row)) for i, row in parsed]


def replay_requests(
    rows: Iterable[Mapping[str, Any]],
    cfg: QuotaConfig,
    *,
    enforce: bool | None = None,
    strict_from: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Each replayed row's decision, in input order: to compare with what the proxy did live.

    Rows of other api keys are left out. ``index`` is the row's position in ``rows``.
    """
    _, decided = _replay(rows, cfg, enforce, strict_from)
    decided.sort(key=lambda item: item[0])
    return [
        {
            "index": i,
            "t_ms": row.t,
            "api_key": row.api_key,
            "user": row.user,
            "client_id": row.client_id,
            "throttle_ms": ms,
        }
        for i, row, ms in decided
    ]


def replay_rows(
    rows: Iterable[Mapping[str, Any]],
    cfg: QuotaConfig,
    *,
    enforce: bool | None = None,
    strict_from: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Replay capture rows (dicts with the capture schema's names) in time order; one result per
    quota bucket (``RESULT_COLUMNS``), ordered by quota, user, client id, topic, partition.

    ``enforce``: take a throttled fetch's bytes back, as the proxy does unless in dry-run (the
    default follows ``cfg.dry_run``). ``strict_from``: KIP-599 strict versions per api key
    (default: protocol/versions.py).
    """
    replayer, _ = _replay(rows, cfg, enforce, strict_from)
    return [] if replayer is None else _finish(replayer.results())


# --- at scale, in Spark -------------------------------------------------------------------------------

_UNIT_PRODUCE_CLIENT, _UNIT_PRODUCE_PARTITION, _UNIT_FETCH, _UNIT_PIDS, _UNIT_MUTATIONS = range(5)
_REC_STAT, _REC_THROTTLED, _REC_EFFECTIVE = 0, 1, 2
_PART_T = "array<struct<topic:string,partition:int,bytes:long,records:int>>"
_ENTRY_T = (
    f"struct<unit:long,size:long,bucket:long,parts:{_PART_T},ids:array<long>,user:string,client_id:string>"
)
_OUT_SCHEMA = (
    "rec int, quota string, user string, client_id string, topic string, partition int, level int, "
    "quota_value double, requests long, throttled_requests long, throttle_ms_total long, "
    "max_throttle_ms long, rejected_mutations long, effective_throttled_requests long, "
    "effective_throttle_ms_total long, effective_max_throttle_ms long, row_id long, direction int, "
    "bucket long"
)
_OUT_FIELDS = [f.split()[0] for f in _OUT_SCHEMA.split(", ")]
_EFFECTIVE = ("effective_throttled_requests", "effective_throttle_ms_total", "effective_max_throttle_ms")


@dataclass(frozen=True, slots=True)
class _Unit:
    """Buckets replayed together, from their own rows only."""

    kind: int
    user: str = ""  # an entity of the bucket (produce client), or the user (producer ids)
    client_id: str = ""
    topic: str = ""  # produce partition
    partition: int = -1
    keep: frozenset[Key] = frozenset()  # fetch: the buckets whose figures come from this unit


def _replay_unit(
    cfg: QuotaConfig,
    units: Mapping[int, _Unit],
    fetch_reps: Mapping[int, tuple[str, str]],
    enforce: bool,
    strict_from: Mapping[int, int],
) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The per-unit function of the Spark replay: the same _Replayer, on one unit's rows.

    Emits the unit's bucket results, and each request it throttled (row id, the client bucket of
    the request, the throttle) so the driver can take the largest per request.
    """

    def run(pdf: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        pdf = pdf.sort_values(["t", "row_id"], kind="stable")
        unit = units[int(pdf["unit"].iloc[0])]
        replayer = _Replayer(cfg, float(pdf["t"].iloc[0]), enforce, strict_from)
        shared_rows: list[tuple[int, int, int, int]] = []  # requests other units throttle too
        alone: dict[tuple[int, int], list[int]] = {}  # (direction, bucket) -> count, total, max
        cols = [
            pdf[c].tolist() for c in ("row_id", "t", "api_key", "api_version", "size", "bucket", "shared")
        ]
        parts, ids = pdf["parts"].tolist(), pdf["ids"].tolist()
        users, clients = pdf["user"].tolist(), pdf["client_id"].tolist()
        kind = unit.kind
        for k, (row_id, t, api, version, size, bucket, shared) in enumerate(zip(*cols, strict=True)):
            if kind == _UNIT_PRODUCE_CLIENT:
                ms = replayer.produce_request(unit.user, unit.client_id, size, [], [], t)
            elif kind == _UNIT_PRODUCE_PARTITION:
                usage = [PartitionUsage(unit.topic, unit.partition, size)]
                ms = replayer.produce_request("", "", 0, usage, [], t)  # 0 bytes: the client never throttles
            elif kind == _UNIT_FETCH:
                user, client_id = fetch_reps[bucket]
                ms = replayer.fetch_response(user, client_id, size, _usages(parts[k]), t)
            elif kind == _UNIT_PIDS:
                if api == INIT_PRODUCER_ID:
                    replayer.init_producer_id(unit.user, t)
                    continue
                ms = replayer.producer_ids(unit.user, _valid_ids(ids[k]), t)
            else:
                replayer.mutation(api, version, users[k], clients[k], size, t)
                continue
            if ms <= 0:
                continue
            if shared:
                shared_rows.append((row_id, api, bucket, ms))
            else:
                figures = alone.setdefault((api, bucket), [0, 0, 0])
                figures[0] += 1
                figures[1] += ms
                figures[2] = max(figures[2], ms)

        def keep(key: Key) -> bool:
            if kind == _UNIT_PRODUCE_CLIENT:
                return key[0] == PRODUCER_BYTE_RATE
            if kind == _UNIT_PRODUCE_PARTITION:
                return key[0] == TOPIC_PRODUCER
            if kind == _UNIT_FETCH:
                return key in unit.keep
            return True

        records = [{**r, "rec": _REC_STAT} for r in replayer.results(keep)]
        records += [
            {
                "rec": _REC_EFFECTIVE,
                "direction": d,
                "bucket": b,
                **dict(zip(_EFFECTIVE, figures, strict=True)),
            }
            for (d, b), figures in alone.items()
        ]
        records += [
            {"rec": _REC_THROTTLED, "row_id": r, "direction": d, "bucket": b, "max_throttle_ms": ms}
            for r, d, b, ms in shared_rows
        ]
        return pd.DataFrame.from_records(records, columns=_OUT_FIELDS)

    return run


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        parent = self.parent
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _part_key(topic: str, partition: int) -> str:
    return f"{topic}\u0000{partition}"


def _part_key_col(topic: Column, partition: Column) -> Column:
    from pyspark.sql import functions as F

    return F.concat_ws("\u0000", topic, partition.cast("string"))


def _lookup(mapping: Mapping[str, int]) -> Column:
    """A literal map column (hot partitions are few)."""
    from pyspark.sql import functions as F

    return F.create_map(*[F.lit(x) for k in sorted(mapping) for x in (k, mapping[k])])


@dataclass
class _Buckets:
    """The client buckets of every entity seen, by the quota classes' own matching."""

    ids: dict[int, dict[tuple[str, str], int]]  # direction -> bucket -> id
    keys: dict[tuple[int, int], Key]  # (direction, id) -> result key
    quotas: dict[tuple[int, int], tuple[int | None, float | None]]  # level, quota
    reps: dict[tuple[int, int], tuple[str, str]]  # an entity of the bucket


def replay(
    spark: SparkSession,
    captures_df: DataFrame,
    cfg: QuotaConfig,
    *,
    enforce: bool | None = None,
    strict_from: Mapping[int, int] | None = None,
    slot_ms: float | None = None,
    tasks: int | None = None,
    seconds: Seconds | None = None,
) -> pd.DataFrame:
    """``replay_rows`` at scale: the same results, as a pandas DataFrame of ``RESULT_COLUMNS``.

    Buckets that provably cannot exceed their quota (module docstring) get their request counts
    from aggregates and are not replayed; the rest are replayed per bucket, in parallel, with the
    same quota classes. ``slot_ms`` is the bound's granularity (default half a quota window
    sample: steady traffic is pruned up to ~91% of its quota with Kafka's 11 samples; finer
    slots prune closer to the quota at more aggregation). ``tasks``: Spark tasks of the replay.
    ``seconds``: the statistics' per-second sums of the same captures (analytics/stats.py): request
    counts come from them and a first, coarser bound (1 s slots, shifted by the fetches' upstream
    time), so only the buckets it cannot prune are read again from the records, for the bound
    at ``slot_ms``.
    ``frame.attrs["replay"]`` says what was done and how long each step took.
    """
    import numpy as np
    import pandas as pd
    from pyspark.sql import functions as F

    started = time.perf_counter()
    steps: dict[str, float] = {}
    info: dict[str, Any] = {"steps": steps}
    last = [started]

    def lap(step: str) -> None:
        now = time.perf_counter()
        steps[step] = round(now - last[0], 3)
        last[0] = now

    enforce = (not cfg.dry_run) if enforce is None else enforce
    strict = dict(strict_mutation_versions() if strict_from is None else strict_from)
    window = cfg.window.quota_window()
    slot = float(slot_ms) if slot_ms else window.size_ms / 2.0
    pid_window = cfg.producer_ids.window.quota_window()
    # An id seen at t is known until t + window / 2 at least: new at most once per half window.
    pid_slot = pid_window.size_ms / 2.0
    nparts = tasks or max(2, spark.sparkContext.defaultParallelism * 2)

    produce = ByteRateQuotas(cfg, produce=True, now_ms=0.0)
    fetch = ByteRateQuotas(cfg, produce=False, now_ms=0.0)
    pids = ProducerIdQuotas(cfg, 0.0)
    mutations_active = MutationQuotas(cfg, 0.0).active

    api = F.col("api_key").cast("int")
    t_col = F.when(
        api.isin(*sorted(AT_RESPONSE)) & (F.col("upstream_ms") >= 0), F.col("ts_ms") + F.col("upstream_ms")
    ).otherwise(F.col("ts_ms").cast("double"))
    keys = sorted(REPLAYED_KEYS if mutations_active else REPLAYED_KEYS - MUTATION_KEYS)
    base = captures_df.select(
        "principal",
        "client_id",
        api.alias("api"),
        F.col("api_version").cast("int").alias("version"),
        t_col.alias("t"),
        "request_bytes",
        "response_bytes",
        "partitions",
        "producer_ids",
        "mutations",
    ).filter(F.col("api").isin(*keys))
    valid_ids = F.filter("producer_ids", lambda x: x > NO_PRODUCER_ID)
    slot_col = F.floor(F.col("t") / slot).cast("long").alias("slot")

    # 1. Per entity and slot: requests and bytes; one pass, small (entities x slots) result.
    entity_slot_cols: list[Column | str] = [
        "principal",
        "client_id",
        "api",
        slot_col,
        F.when(F.col("api") == PRODUCE, F.col("request_bytes"))
        .when(F.col("api") == FETCH, F.col("response_bytes"))
        .otherwise(0)
        .alias("bytes"),
    ]

    def entity_slots(only: DataFrame | None) -> pd.DataFrame:
        rows = base.filter(F.col("api").isin(PRODUCE, FETCH, INIT_PRODUCER_ID))
        if only is not None:  # the entities (principal, client_id, api) still to bound
            rows = rows.join(F.broadcast(only), ["principal", "client_id", "api"])
        return _to_pandas(
            rows.select(
                *entity_slot_cols,
                # Producer ids are a nested column: read only when a producer_ids_rate is proposed.
                (
                    F.when(F.col("api") == PRODUCE, F.size(valid_ids)).otherwise(0)
                    if pids.active and only is None
                    else F.lit(0)
                ).alias("pid_ids"),
            )
            .groupBy("principal", "client_id", "api", "slot")
            .agg(
                F.count(F.lit(1)).alias("n"),
                F.sum("bytes").alias("bytes"),
                F.sum((F.col("pid_ids") > 0).cast("long")).alias("pid_n"),
                F.sum("pid_ids").alias("pid_ids"),
            )
        )

    if seconds is not None:
        by_slot = _entity_seconds(seconds.entities)
        coarse_slot = 1000.0
    else:
        by_slot = entity_slots(None)
        by_slot["shift"] = 0.0
        coarse_slot = slot
    lap("entity_slots")
    entity_of = by_slot.groupby(["principal", "client_id"], sort=False).ngroup().to_numpy()
    entities = list(by_slot[["principal", "client_id"]].drop_duplicates().itertuples(index=False, name=None))
    info["entities"] = len(entities)

    # 2. Buckets of every entity (driver side: entities are few).
    buckets = _Buckets({PRODUCE: {}, FETCH: {}}, {}, {}, {})
    bucket_of = {PRODUCE: np.zeros(len(entities), np.int64), FETCH: np.zeros(len(entities), np.int64)}
    pid_users: dict[str, int] = {}
    user_of = np.full(len(entities), -1, np.int64)
    for e, (user, client_id) in enumerate(entities):
        for direction, q in ((PRODUCE, produce), (FETCH, fetch)):
            match = q.match(user, client_id)
            bucket = match.bucket if match is not None else ("", client_id)
            table = buckets.ids[direction]
            bid = table.setdefault(bucket, len(table))
            bucket_of[direction][e] = bid
            if (direction, bid) not in buckets.reps:
                buckets.reps[(direction, bid)] = (user, client_id)
                name = PRODUCER_BYTE_RATE if direction == PRODUCE else CONSUMER_BYTE_RATE
                buckets.keys[(direction, bid)] = _client_key(name, bucket)
                buckets.quotas[(direction, bid)] = (match.level, match.quota) if match else (None, None)
        if pids.active and pids.match(user) is not None:
            user_of[e] = pid_users.setdefault(user, len(pid_users))

    def refine(coarse: dict[int, dict[int, float]], quota_of: dict[int, Any]) -> None:
        """The bound at ``slot``, in place, for the buckets whose coarse bound is over their quota
        but not far over; one pass over the records for both directions."""
        left = {
            direction: {b for b, bound in bounds.items() if quota_of[direction][b] < bound}
            for direction, bounds in coarse.items()
        }
        for direction, bids in left.items():
            bids -= {b for b in bids if coarse[direction][b] > quota_of[direction][b] * REFINE_BELOW}
        asked = sum(counts_of[direction][b] for direction, bids in left.items() for b in bids)
        if asked * REPLAY_ROW_COST < total_requests:
            return
        wanted = [
            (user, client_id, direction)
            for direction, bids in left.items()
            for e, (user, client_id) in enumerate(entities)
            if int(bucket_of[direction][e]) in bids
        ]
        if not wanted:
            return
        only = spark.createDataFrame(wanted, "principal string, client_id string, api int")
        fine = entity_slots(only)
        index = {pair: e for e, pair in enumerate(entities)}
        rows = [index[pair] for pair in zip(fine["principal"], fine["client_id"], strict=True)]
        for direction, bids in left.items():
            mine = (fine["api"] == direction).to_numpy()
            of = (
                bucket_of[direction][np.asarray(rows, dtype=np.int64)[mine]]
                if rows
                else np.zeros(0, np.int64)
            )
            refined = rate_bound(
                of, fine["slot"].to_numpy()[mine], fine["bytes"].to_numpy()[mine], window, slot
            )
            for b in bids:
                coarse[direction][b] = refined.get(b, 0.0)

    # 3. Client buckets: requests, and which can exceed their quota (module docstring).
    results: dict[Key, dict[str, Any]] = {}
    requests_of: dict[tuple[int, int], int] = {}
    hot_clients: set[tuple[int, int]] = set()
    api_arr = by_slot["api"].to_numpy()
    n_arr = by_slot["n"].to_numpy()
    bounds_of: dict[int, dict[int, float]] = {}
    quotas_of: dict[int, Any] = {}
    counts_of: dict[int, Any] = {}
    for direction, q in ((PRODUCE, produce), (FETCH, fetch)):
        if direction == FETCH and not q.active:
            continue  # the proxy records no fetch then
        rows_of = api_arr == direction
        bids = bucket_of[direction][entity_of[rows_of]]
        counts_of[direction] = np.bincount(
            bids, weights=n_arr[rows_of], minlength=len(buckets.ids[direction])
        )
        quota_of = quotas_of[direction] = np.array(
            [buckets.quotas[(direction, b)][1] or 0.0 for b in range(len(buckets.ids[direction]))]
        )
        limited = quota_of[bids] > 0
        bounds_of[direction] = shifted_rate_bound(
            bids[limited],
            by_slot["slot"].to_numpy()[rows_of][limited],
            by_slot["bytes"].to_numpy()[rows_of][limited],
            by_slot["shift"].to_numpy()[rows_of][limited],
            window,
            coarse_slot,
        )
    total_requests = int(n_arr.sum())
    if seconds is not None:
        refine(bounds_of, quotas_of)
    for direction, counts in counts_of.items():
        for bid, count in enumerate(counts):
            if count:
                requests_of[(direction, bid)] = int(count)
                level, quota = buckets.quotas[(direction, bid)]
                if quota is not None:
                    key = buckets.keys[(direction, bid)]
                    results[key] = _cold(key, level, quota, int(count))
                    if bounds_of[direction].get(bid, 0.0) > quota:
                        hot_clients.add((direction, bid))

    lap("client_bounds")

    # Producer ids: requests per user, then users whose distinct ids per half window may exceed.
    hot_users: set[int] = set()
    if pid_users:
        uids = user_of[entity_of]
        charged = np.where(
            api_arr == PRODUCE, by_slot["pid_n"].to_numpy(), np.where(api_arr == INIT_PRODUCER_ID, n_arr, 0)
        )
        counts = np.bincount(uids[uids >= 0], weights=charged[uids >= 0], minlength=len(pid_users))
        names = {uid: user for user, uid in pid_users.items()}
        for uid, count in enumerate(counts):
            match = pids.match(names[uid])
            assert match is not None
            if count:
                key = (PRODUCER_IDS_RATE, names[uid], "", "", -1)
                results[key] = _cold(key, match.level, match.quota, int(count))
        # Every id of a request counted new: a bound that needs no pass over the ids themselves.
        with_ids = (uids >= 0) & (api_arr == PRODUCE)
        bounds = rate_bound(
            uids[with_ids],
            by_slot["slot"].to_numpy()[with_ids],
            by_slot["pid_ids"].to_numpy()[with_ids],
            pid_window,
            coarse_slot,
        )
        busy = {uid for uid, bound in bounds.items() if bound > _pid_quota(pids, names[uid])}
        if busy:
            # Distinct ids per half window: the same id is new at most once in it.
            users_df = spark.createDataFrame(
                [(names[uid], uid) for uid in sorted(busy)], "principal string, uid long"
            )
            distinct_ids = _to_pandas(
                base.filter(F.col("api") == PRODUCE)
                .join(F.broadcast(users_df), "principal")
                .select(
                    "uid",
                    F.floor(F.col("t") / pid_slot).cast("long").alias("slot"),
                    F.explode(valid_ids).alias("pid"),
                )
                .distinct()
                .groupBy("uid", "slot")
                .agg(F.count(F.lit(1)).alias("ids"))
            )
            bounds = rate_bound(
                distinct_ids["uid"], distinct_ids["slot"], distinct_ids["ids"], pid_window, pid_slot
            )
            hot_users = {uid for uid, bound in bounds.items() if bound > _pid_quota(pids, names[uid])}
        lap("producer_id_bounds")
    del by_slot, entity_of

    # 4. Topic-partition buckets (KIP-1010), from the exploded partitions of quota'd topics.
    hot_parts: dict[int, set[tuple[str, int]]] = {PRODUCE: set(), FETCH: set()}
    part_cond = None
    for direction, q in ((PRODUCE, produce), (FETCH, fetch)):
        names_q = {
            n
            for n, tq in cfg.topics.items()
            if (tq.producer_byte_rate if q.produce else tq.consumer_byte_rate)
        }
        if names_q:
            topic_cond = F.lit(True) if DEFAULT_TOPIC in names_q else F.col("topic").isin(*sorted(names_q))
            cond = (F.col("api") == direction) & topic_cond
            part_cond = cond if part_cond is None else part_cond | cond
    if part_cond is not None:

        def partition_slots(rows: DataFrame, cond: Column) -> pd.DataFrame:
            return _to_pandas(
                rows.filter(F.col("api").isin(PRODUCE, FETCH))
                .select("api", slot_col, F.explode("partitions").alias("p"))
                .select(
                    "api",
                    "slot",
                    F.col("p.topic").alias("topic"),
                    F.col("p.partition").alias("partition"),
                    F.col("p.bytes").alias("bytes"),
                )
                .filter(cond)
                .groupBy("api", "topic", "partition", "slot")
                .agg(F.count(F.lit(1)).alias("n"), F.sum("bytes").alias("bytes"))
            )

        if seconds is None:
            parts_pdf = partition_slots(base, ~F.col("topic").rlike(_TOPIC_ID_SQL) & part_cond)
            group = parts_pdf.groupby(["api", "topic", "partition"], sort=False).ngroup().to_numpy()
            bounds = rate_bound(group, parts_pdf["slot"], parts_pdf["bytes"], window, slot)
        else:
            parts_pdf = _partition_seconds(seconds.partitions, produce, fetch)
            group = parts_pdf.groupby(["api", "topic", "partition"], sort=False).ngroup().to_numpy()
            bounds = shifted_rate_bound(
                group, parts_pdf["slot"], parts_pdf["bytes"], parts_pdf["shift"], window, 1000.0
            )
            heads = parts_pdf.drop_duplicates(["api", "topic", "partition"])
            left = {}
            for gid, (direction, topic, partition) in enumerate(
                heads[["api", "topic", "partition"]].itertuples(index=False, name=None)
            ):
                q = produce if direction == PRODUCE else fetch
                quota = q.topic_quota(topic)
                if quota is not None and quota < bounds.get(gid, 0.0) <= quota * REFINE_BELOW:
                    left[f"{direction}\u0000{_part_key(topic, int(partition))}"] = gid
            requests_per_group = np.bincount(group, weights=parts_pdf["n"].to_numpy())
            asked = sum(int(requests_per_group[gid]) for gid in left.values())
            if left and asked * REPLAY_ROW_COST >= total_requests:
                left_map = _lookup(dict.fromkeys(left, 1))
                api_part = F.concat_ws(
                    "\u0000", F.col("api").cast("string"), _part_key_col(F.col("topic"), F.col("partition"))
                )
                fine = partition_slots(base, F.element_at(left_map, api_part).isNotNull())
                fine_group = np.array(
                    [
                        left[f"{a}\u0000{_part_key(t, int(pn))}"]
                        for a, t, pn in zip(fine["api"], fine["topic"], fine["partition"], strict=True)
                    ],
                    dtype=np.int64,
                )
                refined = rate_bound(fine_group, fine["slot"], fine["bytes"], window, slot)
                for gid in left.values():
                    bounds[gid] = refined.get(gid, 0.0)
        part_counts = np.bincount(group, weights=parts_pdf["n"].to_numpy()) if len(group) else np.zeros(0)
        first = parts_pdf.drop_duplicates(["api", "topic", "partition"])
        for gid, (direction, topic, partition) in enumerate(
            first[["api", "topic", "partition"]].itertuples(index=False, name=None)
        ):
            q = produce if direction == PRODUCE else fetch
            quota = q.topic_quota(topic)
            if quota is None:
                continue
            name = TOPIC_PRODUCER if direction == PRODUCE else TOPIC_CONSUMER
            key = (name, "", "", topic, int(partition))
            results[key] = _cold(key, None, quota, int(part_counts[gid]))
            if bounds.get(gid, 0.0) > quota:
                hot_parts[int(direction)].add((topic, int(partition)))
        lap("partition_bounds")

    # 5. Units: each hot bucket alone, but fetch buckets that share requests together.
    units: dict[int, _Unit] = {}
    pu: dict[int, int] = {}
    for direction, bid in sorted(hot_clients):
        if direction == PRODUCE:
            user, client_id = buckets.reps[(PRODUCE, bid)]
            pu[bid] = len(units)
            units[len(units)] = _Unit(_UNIT_PRODUCE_CLIENT, user, client_id)
    pp: dict[str, int] = {}
    for topic, partition in sorted(hot_parts[PRODUCE]):
        pp[_part_key(topic, partition)] = len(units)
        units[len(units)] = _Unit(_UNIT_PRODUCE_PARTITION, topic=topic, partition=partition)
    uu: dict[int, int] = {}
    for uid in sorted(hot_users):
        uu[uid] = len(units)
        units[len(units)] = _Unit(_UNIT_PIDS, next(u for u, i in pid_users.items() if i == uid))
    fu, fp = _fetch_units(
        spark, base, entities, bucket_of[FETCH], hot_clients, hot_parts[FETCH], buckets, units
    )
    mu = None
    if mutations_active:
        mu = len(units)
        units[mu] = _Unit(_UNIT_MUTATIONS)
    info["units"] = len(units)
    info["hot_buckets"] = len(hot_clients) + len(hot_users) + sum(len(s) for s in hot_parts.values())
    info["pruned_buckets"] = len(results) - info["hot_buckets"]
    lap("units")

    # 6. Replay the units; the rest were never throttled.
    effective: dict[Key, tuple[int, int, int]] = {}
    info["replayed_rows"] = 0
    if units:
        em_rows = []
        for e, (user, client_id) in enumerate(entities):
            pb, fb, uid = int(bucket_of[PRODUCE][e]), int(bucket_of[FETCH][e]), int(user_of[e])
            found = (pu.get(pb), fu.get(fb), uu.get(uid) if uid >= 0 else None)
            if pp or any(u is not None for u in found):  # else no row of this entity is needed
                em_rows.append((user, client_id, pb, fb, *found))
        em = spark.createDataFrame(
            em_rows or [("", "", -1, -1, None, None, None)],
            "principal string, client_id string, pb long, fb long, pu long, fu long, uu long",
        )
        wanted = {_UNIT_PRODUCE_CLIENT: bool(pu), _UNIT_PIDS: bool(uu), _UNIT_FETCH: bool(fu)}
        rows = _unit_rows(base, em, pp, fp, mu, valid_ids, wanted)
        fn = _replay_unit(
            plain(cfg),  # executors have no pydantic: the engines get the config as plain attributes
            units,
            {b: r for (d, b), r in buckets.reps.items() if d == FETCH},
            enforce,
            strict,
        )
        tasks_of = min(nparts, len(units))
        task = _task_keys(spark, tasks_of)
        spread = F.element_at(_lookup_int(task), F.pmod(F.col("unit"), F.lit(tasks_of)).cast("int")).cast(
            "long"
        )
        out = _to_pandas(
            rows.withColumn("task", spread)
            .repartition(tasks_of, "task")
            .groupBy("task", "unit")
            .applyInPandas(fn, _OUT_SCHEMA)
        )
        lap("replay")
        stat_rows = out[out["rec"] == _REC_STAT]
        info["replayed_rows"] = int(stat_rows["requests"].sum())
        for r in stat_rows.to_dict("records"):
            key = (r["quota"], r["user"], r["client_id"], r["topic"], int(r["partition"]))
            merged = {c: r[c] for c in RESULT_COLUMNS}
            merged["level"] = None if pd.isna(r["level"]) else int(r["level"])
            merged["quota_value"] = None if pd.isna(r["quota_value"]) else float(r["quota_value"])
            results[key] = merged
        # Each request's throttle is the largest of its units'; most requests were in one unit only.
        parts_of_eff = [out[out["rec"] == _REC_EFFECTIVE][["direction", "bucket", *_EFFECTIVE]]]
        thr = out[out["rec"] == _REC_THROTTLED]
        if len(thr):
            per_row = thr.groupby("row_id").agg(
                ms=("max_throttle_ms", "max"), direction=("direction", "first"), bucket=("bucket", "first")
            )
            per_bucket = (
                per_row.groupby(["direction", "bucket"])["ms"].agg(["count", "sum", "max"]).reset_index()
            )
            per_bucket.columns = ["direction", "bucket", *_EFFECTIVE]
            parts_of_eff.append(per_bucket)
        eff = pd.concat(parts_of_eff, ignore_index=True)
        if len(eff):
            eff = eff.groupby(["direction", "bucket"]).agg(
                n=(_EFFECTIVE[0], "sum"), total=(_EFFECTIVE[1], "sum"), mx=(_EFFECTIVE[2], "max")
            )
            for (direction, bid), r in eff.iterrows():
                key = buckets.keys[(int(direction), int(bid))]
                effective[key] = (int(r["n"]), int(r["total"]), int(r["mx"]))
    for key, figures in effective.items():
        if key not in results:
            direction = PRODUCE if key[0] == PRODUCER_BYTE_RATE else FETCH
            bid = buckets.ids[direction][(key[1], key[2])]
            results[key] = _cold(key, None, None, requests_of.get((direction, bid), 0))
        results[key].update(dict(zip(_EFFECTIVE, figures, strict=True)))

    frame = pd.DataFrame(_finish(results.values()), columns=list(RESULT_COLUMNS))
    for c in ("partition", *RESULT_COLUMNS[7:]):
        frame[c] = frame[c].astype("int64")
    frame["level"] = frame["level"].astype("Int64")  # None where a level does not apply
    frame["quota_value"] = frame["quota_value"].astype("float64")
    info["seconds"] = round(time.perf_counter() - started, 3)
    frame.attrs["replay"] = info
    return frame


def _entity_seconds(entities: pd.DataFrame) -> pd.DataFrame:
    """``Seconds.entities`` in the shape of the per-slot table (1 s slots): one row per (entity,
    api, second) with n, bytes, pid_n, pid_ids and shift (ms the charge may come after the slot)."""
    import pandas as pd

    frames = []
    for api, n, size, pid_n, pid_ids, shift in (
        (PRODUCE, "produce_requests", "produce_bytes", "pid_requests", "pid_ids", None),
        (FETCH, "fetch_requests", "fetch_bytes", None, None, "fetch_shift_ms"),
        (INIT_PRODUCER_ID, "init_pid_requests", None, None, None, None),
    ):
        counts = entities[n].fillna(0).astype("int64")
        rows = entities[counts > 0]

        def column(name: str | None, frame: pd.DataFrame = rows) -> Any:
            return frame[name].fillna(0).to_numpy() if name is not None else 0

        frames.append(
            pd.DataFrame(
                {
                    "principal": rows["principal"].to_numpy(),
                    "client_id": rows["client_id"].to_numpy(),
                    "api": api,
                    "slot": rows["sec"].astype("int64").to_numpy(),
                    "n": counts[counts > 0].to_numpy(),
                    "bytes": column(size),
                    "pid_n": column(pid_n),
                    "pid_ids": column(pid_ids),
                    "shift": column(shift),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _partition_seconds(
    partitions: pd.DataFrame, produce: ByteRateQuotas, fetch: ByteRateQuotas
) -> pd.DataFrame:
    """``Seconds.partitions`` in the shape of the per-slot partition table (1 s slots), for the
    partitions of topics with a quota in that direction (topics named by id left out)."""
    import pandas as pd

    topics = partitions["topic"].unique()
    frames = []
    for api, q, n, size, shift in (
        (PRODUCE, produce, "produce_n", "produce_bytes", None),
        (FETCH, fetch, "fetch_n", "fetch_bytes", "fetch_shift_ms"),
    ):
        quotad = {t for t in topics if not is_topic_id(t) and q.topic_quota(t) is not None}
        if not quotad:
            continue
        counts = partitions[n].fillna(0).astype("int64")
        rows = partitions[(counts > 0) & partitions["topic"].isin(quotad)]
        frames.append(
            pd.DataFrame(
                {
                    "api": api,
                    "topic": rows["topic"].to_numpy(),
                    "partition": rows["partition"].astype("int64").to_numpy(),
                    "slot": rows["sec"].astype("int64").to_numpy(),
                    "n": rows[n].astype("int64").to_numpy(),
                    "bytes": rows[size].fillna(0).to_numpy(),
                    "shift": rows[shift].fillna(0).to_numpy() if shift else 0.0,
                }
            )
        )
    columns = ["api", "topic", "partition", "slot", "n", "bytes", "shift"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def _task_keys(spark: SparkSession, tasks: int) -> dict[int, int]:
    """For each task 0..tasks-1, a value that Spark's hash partitioning into ``tasks`` sends to
    it: units spread round-robin over the tasks with these, so two large units never share a
    task by a hash collision (hashing the unit ids themselves put two of three in one)."""
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    n = 64
    while len(found) < tasks:
        for r in spark.range(n).select("id", F.pmod(F.hash("id"), F.lit(tasks)).alias("p")).collect():
            found.setdefault(int(r["p"]), int(r["id"]))
        n *= 4
    return found


def _lookup_int(mapping: Mapping[int, int]) -> Column:
    from pyspark.sql import functions as F

    return F.create_map(*[F.lit(x) for k in sorted(mapping) for x in (k, mapping[k])])


def _to_pandas(df: DataFrame) -> pd.DataFrame:
    """A (small) Spark result on the driver, through Arrow."""
    from typing import cast

    return cast("pd.DataFrame", df.toPandas())


def _pid_quota(pids: ProducerIdQuotas, user: str) -> float:
    match = pids.match(user)
    assert match is not None
    return match.quota


def _cold(key: Key, level: int | None, quota: float | None, requests: int) -> dict[str, Any]:
    """The result of a bucket never throttled by its own quota (effective figures come later)."""
    stat = _Stat(level, quota)
    stat.requests = requests
    return _result(key, stat)


def _fetch_units(
    spark: SparkSession,
    base: DataFrame,
    entities: Sequence[tuple[str, str]],
    fetch_bucket_of: Any,
    hot_clients: set[tuple[int, int]],
    hot_parts: set[tuple[str, int]],
    buckets: _Buckets,
    units: dict[int, _Unit],
) -> tuple[dict[int, int], dict[str, int]]:
    """Fetch units. A fetch throttled by its client's quota takes bytes back from its partitions,
    and one throttled by a partition takes them back from its client: hot fetch buckets linked
    by requests (through any client, hot or not) are replayed together, as connected components.
    Returns unit by fetch bucket id, and by hot partition key."""
    from pyspark.sql import functions as F

    hot = {b for d, b in hot_clients if d == FETCH}
    uf = _UnionFind()
    for b in hot:
        uf.find(("c", b))
    for topic, partition in hot_parts:
        uf.find(("p", topic, partition))
    if hot_parts:
        ents = spark.createDataFrame(
            [(u, c, int(b)) for (u, c), b in zip(entities, fetch_bucket_of, strict=True)],
            "principal string, client_id string, fb long",
        )
        hot_map = _lookup({_part_key(*tp): 1 for tp in hot_parts})
        edges = (
            base.filter(F.col("api") == FETCH)
            .join(F.broadcast(ents), ["principal", "client_id"])
            .select("fb", F.explode("partitions").alias("p"))
            .filter(F.element_at(hot_map, _part_key_col(F.col("p.topic"), F.col("p.partition"))).isNotNull())
            .select("fb", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"))
            .distinct()
            .collect()
        )
        for r in edges:
            uf.union(("c", int(r["fb"])), ("p", r["topic"], int(r["partition"])))
    members: dict[Any, list[Any]] = {}
    for node in list(uf.parent):
        members.setdefault(uf.find(node), []).append(node)
    fu: dict[int, int] = {}
    fp: dict[str, int] = {}
    for root in sorted(members, key=repr):
        keep: set[Key] = set()
        unit_id = len(units)
        for node in members[root]:
            if node[0] == "c":
                fu[node[1]] = unit_id
                if node[1] in hot:
                    keep.add(buckets.keys[(FETCH, node[1])])
            else:
                fp[_part_key(node[1], node[2])] = unit_id
                keep.add((TOPIC_CONSUMER, "", "", node[1], node[2]))
        units[unit_id] = _Unit(_UNIT_FETCH, keep=frozenset(keep))
    return fu, fp


def _unit_rows(
    base: DataFrame,
    em: DataFrame,
    pp: Mapping[str, int],
    fp: Mapping[str, int],
    mu: int | None,
    valid_ids: Column,
    wanted: Mapping[int, bool],
) -> DataFrame:
    """One row per (request, unit it goes to), carrying only what the unit needs."""
    from pyspark.sql import functions as F

    parts_of = F.col("partitions").cast(_PART_T)

    def entry(
        unit: Column,
        size: Column,
        bucket: Column,
        parts: Column | None = None,
        ids: Column | None = None,
        who: bool = False,
    ) -> Column:
        none = F.lit(None)
        return F.struct(
            unit.cast("long").alias("unit"),
            size.cast("long").alias("size"),
            bucket.cast("long").alias("bucket"),
            (parts if parts is not None else none.cast(_PART_T)).alias("parts"),
            (ids if ids is not None else none.cast("array<long>")).alias("ids"),
            (F.col("principal") if who else none.cast("string")).alias("user"),
            (F.col("client_id") if who else none.cast("string")).alias("client_id"),
        )

    api = F.col("api")
    # Only what the units use is referenced, so Spark reads no nested column it does not need.
    singles = []
    if wanted.get(_UNIT_PRODUCE_CLIENT):
        singles.append(
            F.when(
                (api == PRODUCE) & F.col("pu").isNotNull(),
                entry(F.col("pu"), F.col("request_bytes"), F.col("pb")),
            )
        )
    if wanted.get(_UNIT_PIDS):
        singles.append(
            F.when(
                ((api == INIT_PRODUCER_ID) | ((api == PRODUCE) & (F.size(valid_ids) > 0)))
                & F.col("uu").isNotNull(),
                entry(F.col("uu"), F.lit(0), F.col("pb"), ids=valid_ids),
            )
        )
    if wanted.get(_UNIT_FETCH):
        if fp:
            fmap = _lookup(fp)
            hot_parts = F.filter(
                parts_of, lambda p: F.element_at(fmap, _part_key_col(p["topic"], p["partition"])).isNotNull()
            )
        else:
            hot_parts = F.array().cast(_PART_T)
        singles.append(
            F.when(
                (api == FETCH) & F.col("fu").isNotNull(),
                entry(F.col("fu"), F.col("response_bytes"), F.col("fb"), hot_parts),
            )
        )
    empty = F.array().cast(f"array<{_ENTRY_T}>")
    entries = F.filter(F.array(*singles), lambda e: e.isNotNull()) if singles else empty
    if pp:
        pmap = _lookup(pp)

        def unit_of(p: Column) -> Column:
            return F.element_at(pmap, _part_key_col(p["topic"], p["partition"]))

        produce_parts = F.when(
            api == PRODUCE,
            F.transform(
                F.filter(parts_of, lambda p: unit_of(p).isNotNull()),
                lambda p: entry(unit_of(p), p["bytes"], F.col("pb")),
            ),
        ).otherwise(empty)
        entries = F.concat(entries, produce_parts)

    def exploded(df: DataFrame, row_id: Column, entries: Column) -> DataFrame:
        # The id first, on its own: in the select of a generator it would be drawn per output row.
        return (
            df.withColumn("row_id", row_id)
            .select(
                "row_id",
                "t",
                F.col("api").alias("api_key"),
                F.col("version").alias("api_version"),
                (F.size(entries) > 1).alias("shared"),
                F.explode(entries).alias("e"),
            )
            .select("row_id", "t", "api_key", "api_version", "shared", "e.*")
        )

    branches = []
    if singles or pp:
        # Without hot produce partitions only the rows of entities with a unit are needed.
        requests = base.filter(api.isin(PRODUCE, FETCH, INIT_PRODUCER_ID)).join(
            F.broadcast(em), ["principal", "client_id"], "left" if pp else "inner"
        )
        branches.append(exploded(requests, F.monotonically_increasing_id(), entries))
    if mu is not None:  # mutation rows: one unit, and never part of another
        mutations = base.filter(api.isin(*sorted(MUTATION_KEYS)) & (F.col("mutations") >= 0))
        one = F.array(entry(F.lit(mu), F.col("mutations"), F.lit(-1), who=True))
        branches.append(exploded(mutations, F.lit(-1).cast("long"), one))
    rows = branches[0]
    for more in branches[1:]:
        rows = rows.unionByName(more)
    return rows
