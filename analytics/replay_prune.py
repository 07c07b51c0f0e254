"""The replay's pruning: which quota buckets could go over their quota, and the rest's counts.

Why: replaying every request is slow, and a bucket whose traffic provably never exceeds its quota
(analytics/replay_bounds.py) was never throttled: its request count is all its result. So, on the
driver, from per-slot sums (the statistics' seconds when given, else one aggregation pass):

1. ``slot_table``: requests, bytes and producer ids per entity, api and time slot.
2. ``find_entities``: every entity's client buckets, by the quota classes' own matching.
3. ``client_bounds`` (then ``refine_client_bounds``, one finer pass for buckets near their
   quota), ``producer_id_bounds``, ``partition_bounds``: each bucket's bound against its quota.

Out comes a ``Pruned``: the results of the buckets left cold, and the hot ones to replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analytics.replay_bounds import rate_bound, shifted_rate_bound
from analytics.replay_frames import ReplayInput, entity_seconds, to_pandas
from analytics.replayer import (
    FETCH,
    INIT_PRODUCER_ID,
    PRODUCE,
    Key,
    client_key,
    cold_result,
    strict_mutation_versions,
)
from quota.keys import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, PRODUCER_IDS_RATE
from quota.manager import ByteRateQuotas
from quota.mutations import MutationQuotas
from quota.producer_ids import ProducerIdQuotas
from quota.rate import QuotaWindow

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from analytics.stats import Seconds
    from quota.config import QuotaConfig


@dataclass(frozen=True)
class ReplaySetup:
    """The proposal and the replay's settings, decided once before any data is read."""

    cfg: QuotaConfig
    enforce: bool  # take a throttled fetch's bytes back
    strict: dict[int, int]  # KIP-599 strict versions per mutation api key
    window: QuotaWindow  # the byte rates'
    slot: float  # ms per slot of the fine bound
    pid_window: QuotaWindow
    pid_slot: float  # an id seen at t is known until t + window / 2 at least
    produce: ByteRateQuotas  # for matching entities to buckets and reading quotas, never fed
    fetch: ByteRateQuotas
    pids: ProducerIdQuotas
    mutations_active: bool
    refine_below: float  # analytics.replay.REFINE_BELOW
    row_cost: int  # analytics.replay.REPLAY_ROW_COST

    @classmethod
    def of(
        cls,
        cfg: QuotaConfig,
        enforce: bool | None,
        strict_from: Mapping[int, int] | None,
        slot_ms: float | None,
        refine_below: float,
        row_cost: int,
    ) -> ReplaySetup:
        window = cfg.window.quota_window()
        pid_window = cfg.producer_ids.window.quota_window()
        return cls(
            cfg,
            (not cfg.dry_run) if enforce is None else enforce,
            dict(strict_mutation_versions() if strict_from is None else strict_from),
            window,
            float(slot_ms) if slot_ms else window.size_ms / 2.0,
            pid_window,
            pid_window.size_ms / 2.0,
            ByteRateQuotas(cfg, produce=True, now_ms=0.0),
            ByteRateQuotas(cfg, produce=False, now_ms=0.0),
            ProducerIdQuotas(cfg, 0.0),
            MutationQuotas(cfg, 0.0).active,
            refine_below,
            row_cost,
        )


@dataclass
class Buckets:
    """The client buckets of every entity seen, by the quota classes' own matching."""

    ids: dict[int, dict[tuple[str, str], int]]  # direction -> bucket -> id
    keys: dict[tuple[int, int], Key]  # (direction, id) -> result key
    quotas: dict[tuple[int, int], tuple[int | None, float | None]]  # level, quota
    reps: dict[tuple[int, int], tuple[str, str]]  # an entity of the bucket


@dataclass
class SlotTable:
    """Per (entity, api, slot): n, bytes, pid_n, pid_ids and shift (ms the charge may come after)."""

    frame: pd.DataFrame
    slot_ms: float  # 1000 from the statistics' seconds, else the setup's slot
    entity_of: np.ndarray  # row -> entity index (``Entities.pairs``)


@dataclass
class Entities:
    """Every entity seen, its client bucket per direction and (for producer ids) its user."""

    pairs: list[tuple[str, str]]  # (principal, client_id)
    buckets: Buckets
    bucket_of: dict[int, np.ndarray]  # direction -> entity -> bucket id
    pid_users: dict[str, int]  # users under a producer_ids_rate -> id
    user_of: np.ndarray  # entity -> producer-id user id, -1 without one


@dataclass
class ClientBounds:
    """Per direction and client bucket id: the rate bound, the quota (0: none) and requests."""

    bounds: dict[int, dict[int, float]] = field(default_factory=dict)
    quotas: dict[int, np.ndarray] = field(default_factory=dict)
    counts: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Pruned:
    """The pruning's outcome: cold buckets' results (request counts) and the hot buckets."""

    total_requests: int
    results: dict[Key, dict[str, Any]] = field(default_factory=dict)
    requests_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (direction, bucket)
    hot_clients: set[tuple[int, int]] = field(default_factory=set)  # (direction, bucket)
    hot_users: set[int] = field(default_factory=set)  # producer-id user ids
    hot_parts: dict[int, set[tuple[str, int]]] = field(default_factory=lambda: {PRODUCE: set(), FETCH: set()})


def entity_slots(rows: ReplayInput, setup: ReplaySetup, only: DataFrame | None) -> pd.DataFrame:
    """Per entity and slot: requests and bytes; one pass, small (entities x slots) result.
    ``only``: the (principal, client_id, api) still to bound, else all."""
    from pyspark.sql import functions as F

    base = rows.base.filter(F.col("api").isin(PRODUCE, FETCH, INIT_PRODUCER_ID))
    if only is not None:
        base = base.join(F.broadcast(only), ["principal", "client_id", "api"])
    size = (
        F.when(F.col("api") == PRODUCE, F.col("request_bytes"))
        .when(F.col("api") == FETCH, F.col("response_bytes"))
        .otherwise(0)
    )
    # Producer ids are a nested column: read only when a producer_ids_rate is proposed.
    ids = (
        F.when(F.col("api") == PRODUCE, F.size(rows.valid_ids)).otherwise(0)
        if setup.pids.active and only is None
        else F.lit(0)
    )
    return to_pandas(
        base.select("principal", "client_id", "api", rows.slot_col, size.alias("bytes"), ids.alias("pid_ids"))
        .groupBy("principal", "client_id", "api", "slot")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum("bytes").alias("bytes"),
            F.sum((F.col("pid_ids") > 0).cast("long")).alias("pid_n"),
            F.sum("pid_ids").alias("pid_ids"),
        )
    )


def slot_table(rows: ReplayInput, setup: ReplaySetup, seconds: Seconds | None) -> pd.DataFrame:
    """The per-slot table: the statistics' seconds as they are (1 s slots), else one pass."""
    if seconds is not None:
        return entity_seconds(seconds.entities)
    by_slot = entity_slots(rows, setup, None)
    by_slot["shift"] = 0.0
    return by_slot


def find_entities(by_slot: pd.DataFrame, setup: ReplaySetup) -> tuple[Entities, np.ndarray]:
    """The entities of the table with their buckets (driver side: entities are few), and each
    row's entity."""
    import numpy as np

    entity_of = by_slot.groupby(["principal", "client_id"], sort=False).ngroup().to_numpy()
    pairs = list(by_slot[["principal", "client_id"]].drop_duplicates().itertuples(index=False, name=None))
    buckets = Buckets({PRODUCE: {}, FETCH: {}}, {}, {}, {})
    bucket_of = {PRODUCE: np.zeros(len(pairs), np.int64), FETCH: np.zeros(len(pairs), np.int64)}
    pid_users: dict[str, int] = {}
    user_of = np.full(len(pairs), -1, np.int64)
    for e, (user, client_id) in enumerate(pairs):
        for direction, q in ((PRODUCE, setup.produce), (FETCH, setup.fetch)):
            match = q.match(user, client_id)
            bucket = match.bucket if match is not None else ("", client_id)
            table = buckets.ids[direction]
            bid = table.setdefault(bucket, len(table))
            bucket_of[direction][e] = bid
            if (direction, bid) not in buckets.reps:
                buckets.reps[(direction, bid)] = (user, client_id)
                name = PRODUCER_BYTE_RATE if direction == PRODUCE else CONSUMER_BYTE_RATE
                buckets.keys[(direction, bid)] = client_key(name, bucket)
                buckets.quotas[(direction, bid)] = (match.level, match.quota) if match else (None, None)
        if setup.pids.active and setup.pids.match(user) is not None:
            user_of[e] = pid_users.setdefault(user, len(pid_users))
    return Entities(pairs, buckets, bucket_of, pid_users, user_of), entity_of


def client_bounds(table: SlotTable, ents: Entities, setup: ReplaySetup) -> ClientBounds:
    """Per client bucket: requests, quota and the bound of its rate at the table's slots."""
    import numpy as np

    by_slot = table.frame
    api_arr, n_arr = by_slot["api"].to_numpy(), by_slot["n"].to_numpy()
    out = ClientBounds()
    for direction, q in ((PRODUCE, setup.produce), (FETCH, setup.fetch)):
        if direction == FETCH and not q.active:
            continue  # the proxy records no fetch then
        rows_of = api_arr == direction
        bids = ents.bucket_of[direction][table.entity_of[rows_of]]
        out.counts[direction] = np.bincount(
            bids, weights=n_arr[rows_of], minlength=len(ents.buckets.ids[direction])
        )
        quota_of = out.quotas[direction] = np.array(
            [ents.buckets.quotas[(direction, b)][1] or 0.0 for b in range(len(ents.buckets.ids[direction]))]
        )
        limited = quota_of[bids] > 0
        out.bounds[direction] = shifted_rate_bound(
            bids[limited],
            by_slot["slot"].to_numpy()[rows_of][limited],
            by_slot["bytes"].to_numpy()[rows_of][limited],
            by_slot["shift"].to_numpy()[rows_of][limited],
            setup.window,
            table.slot_ms,
        )
    return out


def refine_client_bounds(
    spark: SparkSession,
    rows: ReplayInput,
    setup: ReplaySetup,
    ents: Entities,
    cb: ClientBounds,
    total_requests: int,
) -> None:
    """The bound at the setup's slot, in place, for the buckets whose coarse bound is over their
    quota but not far over; one pass over the records for both directions, and only when those
    buckets have enough requests to make the pass cheaper than replaying them."""
    import numpy as np

    coarse, quota_of = cb.bounds, cb.quotas
    left = {
        direction: {
            b
            for b, bound in bounds.items()
            if quota_of[direction][b] < bound <= quota_of[direction][b] * setup.refine_below
        }
        for direction, bounds in coarse.items()
    }
    asked = sum(cb.counts[direction][b] for direction, bids in left.items() for b in bids)
    if asked * setup.row_cost < total_requests:
        return
    wanted = [
        (user, client_id, direction)
        for direction, bids in left.items()
        for e, (user, client_id) in enumerate(ents.pairs)
        if int(ents.bucket_of[direction][e]) in bids
    ]
    if not wanted:
        return
    only = spark.createDataFrame(wanted, "principal string, client_id string, api int")
    fine = entity_slots(rows, setup, only)
    index = {pair: e for e, pair in enumerate(ents.pairs)}
    fine_rows = np.asarray(
        [index[pair] for pair in zip(fine["principal"], fine["client_id"], strict=True)], dtype=np.int64
    )
    for direction, bids in left.items():
        mine = (fine["api"] == direction).to_numpy()
        of = ents.bucket_of[direction][fine_rows[mine]] if len(fine_rows) else np.zeros(0, np.int64)
        refined = rate_bound(
            of, fine["slot"].to_numpy()[mine], fine["bytes"].to_numpy()[mine], setup.window, setup.slot
        )
        for b in bids:
            coarse[direction][b] = refined.get(b, 0.0)


def client_results(ents: Entities, cb: ClientBounds, pruned: Pruned) -> None:
    """Each client bucket's request count, its cold result when it has a quota, and the hot ones."""
    for direction, counts in cb.counts.items():
        for bid, count in enumerate(counts):
            if count:
                pruned.requests_of[(direction, bid)] = int(count)
                level, quota = ents.buckets.quotas[(direction, bid)]
                if quota is not None:
                    key = ents.buckets.keys[(direction, bid)]
                    pruned.results[key] = cold_result(key, level, quota, int(count))
                    if cb.bounds[direction].get(bid, 0.0) > quota:
                        pruned.hot_clients.add((direction, bid))


def pid_quota(pids: ProducerIdQuotas, user: str) -> float:
    """The producer_ids_rate that applies to a user known to have one."""
    match = pids.match(user)
    assert match is not None
    return match.quota


def producer_id_bounds(
    spark: SparkSession,
    rows: ReplayInput,
    setup: ReplaySetup,
    ents: Entities,
    table: SlotTable,
    pruned: Pruned,
) -> None:
    """Producer ids: requests per user (cold results), then the users whose new ids per half
    window may exceed their quota (``pruned.hot_users``)."""
    import numpy as np

    by_slot, pids = table.frame, setup.pids
    api_arr, n_arr = by_slot["api"].to_numpy(), by_slot["n"].to_numpy()
    uids = ents.user_of[table.entity_of]
    charged = np.where(
        api_arr == PRODUCE, by_slot["pid_n"].to_numpy(), np.where(api_arr == INIT_PRODUCER_ID, n_arr, 0)
    )
    counts = np.bincount(uids[uids >= 0], weights=charged[uids >= 0], minlength=len(ents.pid_users))
    names = {uid: user for user, uid in ents.pid_users.items()}
    for uid, count in enumerate(counts):
        match = pids.match(names[uid])
        assert match is not None
        if count:
            key = (PRODUCER_IDS_RATE, names[uid], "", "", -1)
            pruned.results[key] = cold_result(key, match.level, match.quota, int(count))
    # Every id of a request counted new: a bound that needs no pass over the ids themselves.
    with_ids = (uids >= 0) & (api_arr == PRODUCE)
    bounds = rate_bound(
        uids[with_ids],
        by_slot["slot"].to_numpy()[with_ids],
        by_slot["pid_ids"].to_numpy()[with_ids],
        setup.pid_window,
        table.slot_ms,
    )
    busy = {uid for uid, bound in bounds.items() if bound > pid_quota(pids, names[uid])}
    if busy:
        pruned.hot_users = _distinct_id_hot_users(spark, rows, setup, names, busy)


def _distinct_id_hot_users(
    spark: SparkSession, rows: ReplayInput, setup: ReplaySetup, names: Mapping[int, str], busy: set[int]
) -> set[int]:
    """Of the ``busy`` users, those whose distinct ids per half window (the same id is new at
    most once in it) may still exceed their quota: one pass over those users' ids."""
    from pyspark.sql import functions as F

    users_df = spark.createDataFrame(
        [(names[uid], uid) for uid in sorted(busy)], "principal string, uid long"
    )
    distinct_ids = to_pandas(
        rows.base.filter(F.col("api") == PRODUCE)
        .join(F.broadcast(users_df), "principal")
        .select(
            "uid",
            F.floor(F.col("t") / setup.pid_slot).cast("long").alias("slot"),
            F.explode(rows.valid_ids).alias("pid"),
        )
        .distinct()
        .groupBy("uid", "slot")
        .agg(F.count(F.lit(1)).alias("ids"))
    )
    bounds = rate_bound(
        distinct_ids["uid"], distinct_ids["slot"], distinct_ids["ids"], setup.pid_window, setup.pid_slot
    )
    return {uid for uid, bound in bounds.items() if bound > pid_quota(setup.pids, names[uid])}
