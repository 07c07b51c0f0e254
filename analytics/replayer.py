"""The replay row by row: captured requests through the proxy's own quota classes.

The heart of the tuning job's replay (analytics/replay.py says what is replayed and how): one set
of ``ByteRateQuotas``, ``MutationQuotas`` and ``ProducerIdQuotas`` fed the rows in time order, as
``proxy/throttling.py`` feeds them live, and per quota bucket what they decided (``BucketStat``,
``RESULT_COLUMNS``). ``replay_rows`` runs it on a whole capture in plain Python; at scale the same
``Replayer`` runs in Spark's Python workers on one unit of buckets at a time
(analytics/replay_worker.py), so this module imports only the standard library, ``protocol`` and
``quota`` (never pydantic: the config comes as ``quota/plain_config.py``'s plain attributes).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
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
from quota.manager import ByteRateQuotas, PartitionUsage
from quota.mutations import MutationQuotas
from quota.producer_ids import NO_PRODUCER_ID, ProducerIdQuotas

if TYPE_CHECKING:
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

_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
TOPIC_ID_SQL = "^[0-9a-f]{32}$"  # the same, for Spark SQL

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


class BucketStat:
    """What one quota bucket decided: its requests, throttles and refused mutations, and (for a
    client's byte bucket) the largest throttle each of its requests met from any quota."""

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


def client_key(quota: str, bucket: tuple[str, str]) -> Key:
    return (quota, bucket[0], bucket[1], "", -1)


class Replayer:
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
        self.stats: dict[Key, BucketStat] = {}

    def _stat(self, key: Key, level: int | None, quota: float | None) -> BucketStat:
        stat = self.stats.get(key)
        if stat is None:
            stat = self.stats[key] = BucketStat(level, quota)
        return stat

    def _record(
        self, q: ByteRateQuotas, user: str, client_id: str, size: int, usages: list[PartitionUsage], t: float
    ) -> tuple[int, BucketStat, Any]:
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
            client_key(quota_name, decision.bucket),
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
        stat = self._stat(client_key(CONTROLLER_MUTATION_RATE, admission.bucket), match.level, match.quota)
        stat.add(admission.throttle_ms)
        if admission.rejected:
            stat.rejected += cost
        return admission.throttle_ms

    def request(self, row: Row) -> int:
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
        return [result_of(key, stat) for key, stat in self.stats.items() if keep is None or keep(key)]


def result_of(key: Key, stat: BucketStat) -> dict[str, Any]:
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


def finish(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((r for r in results if _reportable(r)), key=_sort_key)


@dataclass(slots=True)
class Row:
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


def partition_usages(partitions: Iterable[Any]) -> list[PartitionUsage]:
    """The capture's partitions as ByteRateQuotas takes them, topic ids left out as live."""
    out = []
    for p in partitions:
        topic = str(p["topic"])
        if not is_topic_id(topic):
            out.append(PartitionUsage(topic, int(p["partition"]), int(p["bytes"])))
    return out


def producer_ids_of(ids: Iterable[Any]) -> list[int]:
    return [int(pid) for pid in ids if int(pid) > NO_PRODUCER_ID]


def to_row(row: Mapping[str, Any]) -> Row | None:
    """A capture row as the replay takes it (None for api keys it does not replay)."""
    api = int(row["api_key"])
    if api not in REPLAYED_KEYS:
        return None
    t = charge_time_ms(api, float(row["ts_ms"]), float(_get(row, "upstream_ms", -1.0)))
    usages: list[PartitionUsage] = []
    ids: list[int] = []
    if api == PRODUCE:
        size = int(_get(row, "request_bytes", 0))
        usages = partition_usages(_get(row, "partitions", ()))
        ids = producer_ids_of(_get(row, "producer_ids", ()))
    elif api == FETCH:
        size = int(_get(row, "response_bytes", 0))
        usages = partition_usages(_get(row, "partitions", ()))
    elif api in MUTATION_KEYS:
        size = int(_get(row, "mutations", -1))
    else:
        size = 0
    return Row(
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
) -> tuple[Replayer | None, list[tuple[int, Row, int]]]:
    parsed = [(i, r) for i, r in enumerate(to_row(row) for row in rows) if r is not None]
    parsed.sort(key=lambda item: (item[1].t, item[0]))
    if not parsed:
        return None, []
    replayer = Replayer(
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
    return [] if replayer is None else finish(replayer.results())


def cold_result(key: Key, level: int | None, quota: float | None, requests: int) -> dict[str, Any]:
    """The result of a bucket never throttled by its own quota (effective figures come later)."""
    stat = BucketStat(level, quota)
    stat.requests = requests
    return result_of(key, stat)
