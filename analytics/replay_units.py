"""The replay of the hot buckets: grouped into units, their rows sent to Spark's workers, merged.

Why units: buckets are independent except where one request counts against several (a fetch
throttled by its client or one of its partitions takes its bytes back from both), so each hot
bucket is replayed alone from its own rows, but fetch buckets linked by requests together
(``plan_units``). ``unit_rows`` sends each request to the units that need it, carrying only what
they use; ``run_units`` replays them in parallel (analytics/replay_worker.py); ``merge_units``
puts their figures into the results, each request's throttle the largest of its units'.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from analytics.replay_frames import ReplayInput, lookup, part_key, part_key_col, task_keys, to_pandas
from analytics.replay_worker import (
    EFFECTIVE,
    OUT_SCHEMA,
    REC_EFFECTIVE,
    REC_STAT,
    REC_THROTTLED,
    UNIT_FETCH,
    UNIT_MUTATIONS,
    UNIT_PIDS,
    UNIT_PRODUCE_CLIENT,
    UNIT_PRODUCE_PARTITION,
    Unit,
    UnitJob,
    replay_unit,
)
from analytics.replayer import (
    FETCH,
    INIT_PRODUCER_ID,
    MUTATION_KEYS,
    PRODUCE,
    RESULT_COLUMNS,
    TOPIC_CONSUMER,
    Key,
    cold_result,
)
from quota.keys import PRODUCER_BYTE_RATE
from quota.plain_config import plain

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession

    from analytics.replay_prune import Buckets, Entities, Pruned, ReplaySetup


@dataclass
class UnitPlan:
    """The units, and which unit each hot bucket's requests go to."""

    units: dict[int, Unit]
    pu: dict[int, int]  # produce client bucket id -> unit
    pp: dict[str, int]  # produce partition key -> unit
    uu: dict[int, int]  # producer-id user id -> unit
    fu: dict[int, int]  # fetch client bucket id -> unit
    fp: dict[str, int]  # fetch partition key -> unit
    mu: int | None  # the mutations' unit


def plan_units(
    spark: SparkSession, rows: ReplayInput, setup: ReplaySetup, ents: Entities, pruned: Pruned
) -> UnitPlan:
    """Each hot bucket alone, but fetch buckets that share requests together; mutations as one."""
    units: dict[int, Unit] = {}
    pu: dict[int, int] = {}
    for direction, bid in sorted(pruned.hot_clients):
        if direction == PRODUCE:
            user, client_id = ents.buckets.reps[(PRODUCE, bid)]
            pu[bid] = len(units)
            units[len(units)] = Unit(UNIT_PRODUCE_CLIENT, user, client_id)
    pp: dict[str, int] = {}
    for topic, partition in sorted(pruned.hot_parts[PRODUCE]):
        pp[part_key(topic, partition)] = len(units)
        units[len(units)] = Unit(UNIT_PRODUCE_PARTITION, topic=topic, partition=partition)
    uu: dict[int, int] = {}
    for uid in sorted(pruned.hot_users):
        uu[uid] = len(units)
        units[len(units)] = Unit(UNIT_PIDS, next(u for u, i in ents.pid_users.items() if i == uid))
    fu, fp = _fetch_units(spark, rows.base, ents, pruned.hot_clients, pruned.hot_parts[FETCH], units)
    mu = None
    if setup.mutations_active:
        mu = len(units)
        units[mu] = Unit(UNIT_MUTATIONS)
    return UnitPlan(units, pu, pp, uu, fu, fp, mu)


class _UnionFind:
    """Connected components of fetch buckets and hot partitions linked by requests."""

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


def _fetch_links(
    spark: SparkSession, base: DataFrame, ents: Entities, hot_parts: set[tuple[str, int]], uf: _UnionFind
) -> None:
    """Join in ``uf`` each fetch bucket with the hot partitions its requests fetched from."""
    from pyspark.sql import functions as F

    pairs = ents.pairs
    rows = spark.createDataFrame(
        [(u, c, int(b)) for (u, c), b in zip(pairs, ents.bucket_of[FETCH], strict=True)],
        "principal string, client_id string, fb long",
    )
    hot_map = lookup({part_key(*tp): 1 for tp in hot_parts})
    edges = (
        base.filter(F.col("api") == FETCH)
        .join(F.broadcast(rows), ["principal", "client_id"])
        .select("fb", F.explode("partitions").alias("p"))
        .filter(F.element_at(hot_map, part_key_col(F.col("p.topic"), F.col("p.partition"))).isNotNull())
        .select("fb", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"))
        .distinct()
        .collect()
    )
    for r in edges:
        uf.union(("c", int(r["fb"])), ("p", r["topic"], int(r["partition"])))


def _fetch_units(
    spark: SparkSession,
    base: DataFrame,
    ents: Entities,
    hot_clients: set[tuple[int, int]],
    hot_parts: set[tuple[str, int]],
    units: dict[int, Unit],
) -> tuple[dict[int, int], dict[str, int]]:
    """Fetch units. A fetch throttled by its client's quota takes bytes back from its partitions,
    and one throttled by a partition takes them back from its client: hot fetch buckets linked
    by requests (through any client, hot or not) are replayed together, as connected components.
    Returns unit by fetch bucket id, and by hot partition key."""
    hot = {b for d, b in hot_clients if d == FETCH}
    uf = _UnionFind()
    for b in hot:
        uf.find(("c", b))
    for topic, partition in hot_parts:
        uf.find(("p", topic, partition))
    if hot_parts:
        _fetch_links(spark, base, ents, hot_parts, uf)
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
                    keep.add(ents.buckets.keys[(FETCH, node[1])])
            else:
                fp[part_key(node[1], node[2])] = unit_id
                keep.add((TOPIC_CONSUMER, "", "", node[1], node[2]))
        units[unit_id] = Unit(UNIT_FETCH, keep=frozenset(keep))
    return fu, fp


_PART_T = "array<struct<topic:string,partition:int,bytes:long,records:int>>"
_ENTRY_T = (
    f"struct<unit:long,size:long,bucket:long,parts:{_PART_T},ids:array<long>,user:string,client_id:string>"
)


def _entry(
    unit: Column,
    size: Column,
    bucket: Column,
    parts: Column | None = None,
    ids: Column | None = None,
    who: bool = False,
) -> Column:
    """What one unit gets of a request (``_ENTRY_T``): only the fields it uses, the rest null."""
    from pyspark.sql import functions as F

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


def _client_entries(plan: UnitPlan, valid_ids: Column) -> list[Column]:
    """Per request, its entry for its client's produce unit, its user's producer-id unit and its
    fetch unit (null where it has none). Only what the units use is referenced, so Spark reads
    no nested column it does not need."""
    from pyspark.sql import functions as F

    api = F.col("api")
    singles = []
    if plan.pu:
        singles.append(
            F.when(
                (api == PRODUCE) & F.col("pu").isNotNull(),
                _entry(F.col("pu"), F.col("request_bytes"), F.col("pb")),
            )
        )
    if plan.uu:
        singles.append(
            F.when(
                ((api == INIT_PRODUCER_ID) | ((api == PRODUCE) & (F.size(valid_ids) > 0)))
                & F.col("uu").isNotNull(),
                _entry(F.col("uu"), F.lit(0), F.col("pb"), ids=valid_ids),
            )
        )
    if plan.fu:
        parts_of = F.col("partitions").cast(_PART_T)
        if plan.fp:
            fmap = lookup(plan.fp)
            hot_parts = F.filter(
                parts_of, lambda p: F.element_at(fmap, part_key_col(p["topic"], p["partition"])).isNotNull()
            )
        else:
            hot_parts = F.array().cast(_PART_T)
        singles.append(
            F.when(
                (api == FETCH) & F.col("fu").isNotNull(),
                _entry(F.col("fu"), F.col("response_bytes"), F.col("fb"), hot_parts),
            )
        )
    return singles


def _partition_entries(pp: Mapping[str, int], empty: Column) -> Column:
    """Per produce request, an entry for each of its partitions that has a unit (their bytes)."""
    from pyspark.sql import functions as F

    pmap = lookup(pp)
    parts_of = F.col("partitions").cast(_PART_T)
    return F.when(
        F.col("api") == PRODUCE,
        F.transform(
            F.filter(parts_of, lambda p: _unit_of(pmap, p).isNotNull()),
            lambda p: _entry(_unit_of(pmap, p), p["bytes"], F.col("pb")),
        ),
    ).otherwise(empty)


def _unit_of(pmap: Column, p: Column) -> Column:
    """The unit of a partition (an element of ``partitions``), null when it has none."""
    from pyspark.sql import functions as F

    return F.element_at(pmap, part_key_col(p["topic"], p["partition"]))


def _exploded(df: DataFrame, row_id: Column, entries: Column) -> DataFrame:
    """One row per (request, entry): the request's id, time, api and version beside the entry."""
    from pyspark.sql import functions as F

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


def unit_rows(rows: ReplayInput, em: DataFrame, plan: UnitPlan) -> DataFrame:
    """One row per (request, unit it goes to), carrying only what the unit needs."""
    from pyspark.sql import functions as F

    api = F.col("api")
    singles = _client_entries(plan, rows.valid_ids)
    empty = F.array().cast(f"array<{_ENTRY_T}>")
    entries = F.filter(F.array(*singles), lambda e: e.isNotNull()) if singles else empty
    if plan.pp:
        entries = F.concat(entries, _partition_entries(plan.pp, empty))
    branches = []
    if singles or plan.pp:
        # Without hot produce partitions only the rows of entities with a unit are needed.
        requests = rows.base.filter(api.isin(PRODUCE, FETCH, INIT_PRODUCER_ID)).join(
            F.broadcast(em), ["principal", "client_id"], "left" if plan.pp else "inner"
        )
        branches.append(_exploded(requests, F.monotonically_increasing_id(), entries))
    if plan.mu is not None:  # mutation rows: one unit, and never part of another
        mutations = rows.base.filter(api.isin(*sorted(MUTATION_KEYS)) & (F.col("mutations") >= 0))
        one = F.array(_entry(F.lit(plan.mu), F.col("mutations"), F.lit(-1), who=True))
        branches.append(_exploded(mutations, F.lit(-1).cast("long"), one))
    out = branches[0]
    for more in branches[1:]:
        out = out.unionByName(more)
    return out


def _entity_units(spark: SparkSession, ents: Entities, plan: UnitPlan) -> DataFrame:
    """Per entity: its client buckets and the units of its requests (only entities with one,
    unless hot produce partitions need every produce request)."""
    em_rows = []
    for e, (user, client_id) in enumerate(ents.pairs):
        pb, fb, uid = int(ents.bucket_of[PRODUCE][e]), int(ents.bucket_of[FETCH][e]), int(ents.user_of[e])
        found = (plan.pu.get(pb), plan.fu.get(fb), plan.uu.get(uid) if uid >= 0 else None)
        if plan.pp or any(u is not None for u in found):  # else no row of this entity is needed
            em_rows.append((user, client_id, pb, fb, *found))
    return spark.createDataFrame(
        em_rows or [("", "", -1, -1, None, None, None)],
        "principal string, client_id string, pb long, fb long, pu long, fu long, uu long",
    )


def run_units(
    spark: SparkSession, rows: ReplayInput, setup: ReplaySetup, ents: Entities, plan: UnitPlan, tasks: int
) -> pd.DataFrame:
    """Every unit replayed in Spark's workers, spread round-robin over at most ``tasks`` tasks;
    their output records (analytics/replay_worker.py) on the driver."""
    from pyspark.sql import functions as F

    job = UnitJob(
        plain(setup.cfg),  # executors have no pydantic: the engines get the config as plain attributes
        plan.units,
        {b: r for (d, b), r in ents.buckets.reps.items() if d == FETCH},
        setup.enforce,
        setup.strict,
    )
    requests = unit_rows(rows, _entity_units(spark, ents, plan), plan)
    tasks_of = min(tasks, len(plan.units))
    task = lookup(task_keys(spark, tasks_of))
    spread = F.element_at(task, F.pmod(F.col("unit"), F.lit(tasks_of)).cast("int")).cast("long")
    grouped = requests.withColumn("task", spread).repartition(tasks_of, "task").groupBy("task", "unit")
    with warnings.catch_warnings():
        # applyInPandas looks for the eval type in the function's type hints, which a partial does
        # not carry, and warns (with the job's repr) before taking the grouped map this is.
        warnings.filterwarnings("ignore", "Cannot infer the eval type", UserWarning)
        replayed = grouped.applyInPandas(partial(replay_unit, job), OUT_SCHEMA)
    return to_pandas(replayed)


def merge_units(out: pd.DataFrame, buckets: Buckets, pruned: Pruned) -> int:
    """The replayed buckets' figures into ``pruned.results``, and every client bucket's throttle
    as its requests met it (``EFFECTIVE``); returns the requests replayed."""
    import pandas as pd

    stat_rows = out[out["rec"] == REC_STAT]
    for r in stat_rows.to_dict("records"):
        key = (r["quota"], r["user"], r["client_id"], r["topic"], int(r["partition"]))
        merged = {c: r[c] for c in RESULT_COLUMNS}
        merged["level"] = None if pd.isna(r["level"]) else int(r["level"])
        merged["quota_value"] = None if pd.isna(r["quota_value"]) else float(r["quota_value"])
        pruned.results[key] = merged
    apply_effective(effective_figures(out, buckets), buckets, pruned)
    return int(stat_rows["requests"].sum())


def effective_figures(out: pd.DataFrame, buckets: Buckets) -> dict[Key, tuple[int, int, int]]:
    """Per client bucket: throttled requests, total and longest throttle, each request's throttle
    the largest of its units' (most requests were in one unit only)."""
    import pandas as pd

    parts_of_eff = [out[out["rec"] == REC_EFFECTIVE][["direction", "bucket", *EFFECTIVE]]]
    thr = out[out["rec"] == REC_THROTTLED]
    if len(thr):
        per_row = thr.groupby("row_id").agg(
            ms=("max_throttle_ms", "max"), direction=("direction", "first"), bucket=("bucket", "first")
        )
        per_bucket = per_row.groupby(["direction", "bucket"])["ms"].agg(["count", "sum", "max"]).reset_index()
        per_bucket.columns = ["direction", "bucket", *EFFECTIVE]
        parts_of_eff.append(per_bucket)
    eff = pd.concat(parts_of_eff, ignore_index=True)
    effective: dict[Key, tuple[int, int, int]] = {}
    if len(eff):
        eff = eff.groupby(["direction", "bucket"]).agg(
            n=(EFFECTIVE[0], "sum"), total=(EFFECTIVE[1], "sum"), mx=(EFFECTIVE[2], "max")
        )
        for (direction, bid), r in eff.iterrows():
            key = buckets.keys[(int(direction), int(bid))]
            effective[key] = (int(r["n"]), int(r["total"]), int(r["mx"]))
    return effective


def apply_effective(effective: Mapping[Key, tuple[int, int, int]], buckets: Buckets, pruned: Pruned) -> None:
    """The effective figures into the client buckets' results (a bucket without a quota of its
    own gets a result when another quota throttled its requests)."""
    for key, figures in effective.items():
        if key not in pruned.results:
            direction = PRODUCE if key[0] == PRODUCER_BYTE_RATE else FETCH
            bid = buckets.ids[direction][(key[1], key[2])]
            pruned.results[key] = cold_result(key, None, None, pruned.requests_of.get((direction, bid), 0))
        pruned.results[key].update(dict(zip(EFFECTIVE, figures, strict=True)))
