"""What the captured traffic looked like, per entity and per topic, in 1-second windows.

All aggregation is Spark DataFrame expressions (no Python UDFs). The records are read in four
column-pruned passes, each reduced at once to a per-second table; everything after works on those
tables, in as few Spark actions as possible (each action has a fixed cost that small tables feel):

1. Entity pass (ts, principal, client id, api, sizes, throttle, mutations): one row per
   (second, user, client-id) with produce bytes (request_bytes of Produce, api 0: what Kafka's
   produce quota charges), fetch bytes (response_bytes of Fetch, api 1: what the fetch quota
   charges), throttle ms and partition mutations. The user and client-id levels are its sums
   (grouping sets; also the client-id families, analytics/stats_controls.py), and each entity's
   seconds are gathered into one array, from which one projection computes its distribution and
   bursts, and keeps the seconds of the top entities.
2. Partition pass (ts, api, partitions): one row per (topic, partition, second) with the record-set
   bytes produced and fetched; the topic level is its sums, then the same per-array statistics.
3. Producer-id pass (ts, principal, producer ids of Produce): the second each (user, producer id)
   was first seen, counted per user and hour.
4. Controls pass (api, principal, client id, decided throttle; proxy, connection and time of
   JoinGroups): the throttles decided on Produce and Fetch, counted per 100 ms step, and the
   connections that sent a JoinGroup, with the first one's time, per (user, client-id), in one
   grouping (analytics/stats_controls.py: with the families, the evidence for the proxy's
   operator controls and its join guard rail).

Definitions (the tables' columns):

- A second is *active* for an entity and direction when it sent at least one request of that
  kind; p50/p95/p99 are exact nearest-rank percentiles over the active seconds (the value at rank
  ceil(p x n) of n sorted), max is the largest.
- A *burst* is a maximal run of consecutive seconds whose bytes exceed ``burst_factor`` (default
  2) times the entity's median active second; ``max_burst_s`` is the longest such run, ``bursts``
  their number, ``mean_burst_s`` their mean length. The median, not a high percentile, is the
  reference: it says how long a client stays well above its usual rate, whatever its tail.
- *Time throttled* is the sum of ``throttle_ms`` the proxy applied to the entity's requests of
  that direction (``throttled_share``: that over the capture span).
- Mutations: per second, the partitions created or deleted (``mutations`` > 0);
  ``max_window`` is the most in any ``controller_window_s`` seconds (Kafka's burst window,
  11 x 1 s by default), ``peak_rate`` the most in any ``sustained_window_s`` seconds (600) per
  second of it. Seconds with mutations are few (admin requests), so their table is small.
- Producer ids: an id is *new* in the hour (epoch-aligned) its user first used it in the capture;
  ``peak_ids_per_s`` is a user's largest hourly count over the seconds of that hour the capture
  covers (at least 60).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd

from quota.config import WindowConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

LEVELS = ("user", "client", "user-client")  # entity levels: user, client-id, (user, client-id)
PRODUCE, FETCH = "produce", "fetch"
DIRECTIONS = (PRODUCE, FETCH)
ENTITY_KEYS = ["level", "user", "client_id"]
RATE_KEYS = [*ENTITY_KEYS, "direction"]
TOPIC_KEYS = ["direction", "topic"]
DIST_COLUMNS = ["active_s", "total_bytes", "p50_bps", "p95_bps", "p99_bps", "max_bps"]
BURST_COLUMNS = ["max_burst_s", "bursts", "mean_burst_s"]
_KAFKA_WINDOW = WindowConfig()  # Kafka's default controller.quota.window.* (11 x 1 s)


@dataclass(frozen=True)
class StatsOptions:
    burst_factor: float = 2.0
    controller_window_s: int = int(_KAFKA_WINDOW.num * _KAFKA_WINDOW.size_seconds)
    sustained_window_s: int = 600
    top_series: int = 8  # entities (per level and direction) and topics whose seconds are kept for plots
    # Keep the per-second tables the replay prunes with (``Seconds``): one more column or two per
    # pass, and the replay reads no record twice to learn what these passes already summed.
    keep_seconds: bool = False


@dataclass(frozen=True)
class Seconds:
    """Per-second sums the replay prunes with (analytics/replay.py), not written out.

    ``entities``: per (sec, principal, client_id): produce_requests, produce_bytes (request
    bytes), fetch_requests, fetch_bytes (response bytes), fetch_shift_ms (the longest upstream
    time of its fetches, which the proxy charges at their response), init_pid_requests,
    pid_requests (produces carrying producer ids) and pid_ids (the ids they carry).
    ``partitions``: per (topic, partition, sec): produce_n, produce_bytes, fetch_n, fetch_bytes,
    fetch_shift_ms. ``sec`` is ``ts_ms div 1000``, the time the request was sent.
    """

    entities: pd.DataFrame
    partitions: pd.DataFrame


@dataclass
class Stats:
    """The tables (pandas, small) and the facts about the capture they came from."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    records: int = 0
    start_s: int = 0
    end_s: int = 0  # last second seen (inclusive)
    seconds: Seconds | None = None  # with ``StatsOptions.keep_seconds``

    @property
    def span_s(self) -> int:
        return self.end_s - self.start_s + 1


Progress = Callable[[str], None]


def _pandas(df: DataFrame) -> pd.DataFrame:
    """The (small) DataFrame on the driver, through Arrow."""
    return cast(pd.DataFrame, df.toPandas())


def _sec() -> Column:
    from pyspark.sql import functions as F

    return F.expr("ts_ms div 1000")


# --- per-array statistics (Spark array functions: no Python per row) --------------------------------


def _collect(direction: str, points: bool) -> list[Column]:
    """Aggregates of one direction's seconds: values sorted (nulls skipped), total, and, with
    ``points``, the (sec, v) points (unsorted) for bursts and series."""
    from pyspark.sql import functions as F

    v = F.col(f"{direction}_bytes")
    cols = [
        F.array_sort(F.collect_list(v)).alias(f"_{direction}_sorted"),
        F.sum(v).alias(f"_{direction}_total"),
    ]
    if points:
        point = F.when(v.isNotNull(), F.struct(F.col("sec").alias("sec"), v.alias("v")))
        cols.append(F.collect_list(point).alias(f"_{direction}_points"))
    return cols


def _stats(direction: str, burst_factor: float | None) -> Column:
    """DIST_COLUMNS (and with ``burst_factor`` the burst counts) of one direction, as a struct."""
    from pyspark.sql import functions as F

    ordered = F.col(f"_{direction}_sorted")
    n = F.size(ordered)

    def rank(p: float) -> Column:  # nearest rank, 1-based; null for an empty series
        return F.try_element_at(ordered, F.greatest(F.lit(1), F.ceil(n * p).cast("int")))

    fields = [
        n.alias("active_s"),
        F.col(f"_{direction}_total").alias("total_bytes"),
        rank(0.5).alias("p50_bps"),
        rank(0.95).alias("p95_bps"),
        rank(0.99).alias("p99_bps"),
        F.try_element_at(ordered, F.lit(-1)).alias("max_bps"),
    ]
    if burst_factor is not None:
        threshold = rank(0.5) * burst_factor
        above = F.array_sort(
            F.transform(F.filter(f"_{direction}_points", lambda x: x["v"] > threshold), lambda x: x["sec"])
        )
        zero = F.lit(0).cast("long")
        start = F.struct(
            F.lit(-2).cast("long").alias("prev"), zero.alias("cur"), zero.alias("best"), zero.alias("runs")
        )

        def step(acc: Column, sec: Column) -> Column:  # runs of consecutive seconds among those above
            follows = sec == acc["prev"] + 1
            cur = F.when(follows, acc["cur"] + 1).otherwise(F.lit(1).cast("long"))
            return F.struct(
                sec.alias("prev"),
                cur.alias("cur"),
                F.greatest(acc["best"], cur).alias("best"),
                F.when(follows, acc["runs"]).otherwise(acc["runs"] + 1).alias("runs"),
            )

        runs = F.aggregate(above, start, step)
        fields += [
            runs["best"].alias("max_burst_s"),
            runs["runs"].alias("bursts"),
            F.size(above).alias("above_s"),
        ]
    return F.struct(*fields)


def _top(order_by: Column, partition_by: list[str], n: int) -> Column:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    window = Window.partitionBy(*partition_by) if partition_by else Window.partitionBy(F.lit(0))
    return F.row_number().over(window.orderBy(order_by.desc_nulls_last())) <= n


def _with_stats(
    df: DataFrame, rank_keys: list[str], n: int, burst_factor: float | None, series_when: Column | None = None
) -> DataFrame:
    """Per direction a stats struct; for the top n by p99 (within rank_keys) the series, sorted."""
    from pyspark.sql import functions as F

    staged = df.select("*", *[_stats(d, burst_factor).alias(d) for d in DIRECTIONS])
    out = []
    for direction in DIRECTIONS:
        keep = _top(F.col(f"{direction}.p99_bps"), rank_keys, n)
        if series_when is not None:
            keep = keep & series_when
        points = F.array_sort(F.col(f"_{direction}_points"))
        out += [
            F.when(keep, F.transform(points, lambda x: x["sec"])).alias(f"{direction}_secs"),
            F.when(keep, F.transform(points, lambda x: x["v"])).alias(f"{direction}_values"),
        ]
    return staged.select(*[c for c in staged.columns if not c.startswith("_")], *out)


def _melt(wide: pd.DataFrame, keys: list[str], extra: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per direction with activity, from the per-direction struct columns of ``wide``."""
    rows = []
    for direction in DIRECTIONS:
        part = pd.DataFrame(list(wide[direction]), index=wide.index) if len(wide) else pd.DataFrame()
        out = wide[keys].copy()
        out["direction"] = direction
        for c in part.columns:
            out[c] = part[c]
        for target, source in (extra or {}).items():
            out[target] = wide[source.format(direction=direction)]
        rows.append(out[out["active_s"].fillna(0) > 0] if "active_s" in out else out.iloc[0:0])
    out = pd.concat([r for r in rows if not r.empty] or rows[:1], ignore_index=True)
    for c in [*DIST_COLUMNS, "max_burst_s", "bursts"]:
        if c in out:
            out[c] = out[c].astype("int64")
    if "above_s" in out:
        out["mean_burst_s"] = (out["above_s"] / out["bursts"].where(out["bursts"] > 0)).fillna(0.0).round(2)
        out = out.drop(columns=["above_s"])
    return out


def _series_rows(wide: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The kept seconds of the top entities, long: keys, direction, sec, bytes."""
    frames = []
    for direction in DIRECTIONS:
        secs, values = wide[f"{direction}_secs"], wide[f"{direction}_values"]
        for i in np.flatnonzero(secs.notna().to_numpy()):
            frame = pd.DataFrame(
                {
                    **{k: wide[k].iloc[i] for k in keys},
                    "direction": direction,
                    "sec": np.asarray(secs.iloc[i], dtype=np.int64),
                    "bytes": np.asarray(values.iloc[i], dtype=np.int64),
                }
            )
            frames.append(frame)
    columns = [*keys, "direction", "sec", "bytes"]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True)[columns]


# --- pass 1: entities ------------------------------------------------------------------------------


ENTITY_SECOND_COLUMNS = [
    "produce_requests",
    "produce_bytes",
    "fetch_requests",
    "fetch_bytes",
    "fetch_shift_ms",
    "init_pid_requests",
    "pid_requests",
    "pid_ids",
]
PARTITION_SECOND_COLUMNS = ["produce_n", "produce_bytes", "fetch_n", "fetch_bytes", "fetch_shift_ms"]


def _fetch_shift(fetch: Column) -> Column:
    """The longest upstream time of the fetches summed (a fetch is charged at its response)."""
    from pyspark.sql import functions as F

    return F.max(F.when(fetch & (F.col("upstream_ms") >= 0), F.col("upstream_ms")))


def pair_seconds(captures: DataFrame, for_replay: bool = False) -> DataFrame:
    """One row per (second, user, client-id): bytes Kafka's quotas charge, throttle, mutations;
    ``for_replay``: also the columns of ``Seconds.entities``."""
    from pyspark.sql import functions as F

    api = F.col("api_key")
    produce, fetch = api == 0, api == 1
    extra = []
    if for_replay:
        ids = F.size(F.filter("producer_ids", lambda x: x > -1))  # NO_PRODUCER_ID left out
        extra = [
            _fetch_shift(fetch).alias("fetch_shift_ms"),
            F.count(F.when(api == 22, 1)).alias("init_pid_requests"),
            F.count(F.when(produce & (ids > 0), 1)).alias("pid_requests"),
            F.sum(F.when(produce, ids)).alias("pid_ids"),
        ]
    return captures.groupBy(_sec().alias("sec"), F.col("principal").alias("user"), "client_id").agg(
        F.sum(F.when(produce, F.col("request_bytes"))).alias("produce_bytes"),
        F.sum(F.when(fetch, F.col("response_bytes"))).alias("fetch_bytes"),
        F.sum(F.when(produce, F.col("throttle_ms"))).alias("produce_throttle_ms"),
        F.sum(F.when(fetch, F.col("throttle_ms"))).alias("fetch_throttle_ms"),
        F.count(F.lit(1)).alias("requests"),
        F.count(F.when(produce, 1)).alias("produce_requests"),  # the evidence a byte rate rests on
        F.count(F.when(fetch, 1)).alias("fetch_requests"),
        F.sum(F.when(F.col("mutations") > 0, F.col("mutations"))).alias("mutations"),
        F.count(F.when(F.col("mutations") >= 0, 1)).alias("mutation_requests"),
        *extra,
    )


def level_seconds(pairs: DataFrame, columns: list[str], families: bool = False) -> DataFrame:
    """``columns`` summed per second at the three entity levels; '' for the level's missing key.

    ``families``: also per client-id family (level ``family``, its prefix as the client_id, for
    ids with a generated suffix; analytics/stats_controls.py), and the client-id levels carry
    their id's family as ``prefix`` (null for none): one shuffle for all of them.
    """
    from pyspark.sql import functions as F

    sums = [F.sum(c).alias(c) for c in columns]
    keys = ["sec", "user", "client_id"]
    sets = [["sec", "user", "client_id"], ["sec", "user"], ["sec", "client_id"]]
    if families:
        from analytics.stats_controls import family_prefix

        pairs = pairs.withColumn("prefix", family_prefix(F.col("client_id")))
        keys.append("prefix")  # a function of the client id: no more groups at the client levels
        sets = [["sec", "user", "client_id", "prefix"], ["sec", "user"], ["sec", "client_id", "prefix"]]
        sets.append(["sec", "prefix"])
    grouped = pairs.groupingSets(sets, *keys).agg(*sums, *[F.grouping(k).alias(f"g_{k}") for k in keys[1:]])
    by_user, by_client = F.col("g_user") == 0, F.col("g_client_id") == 0
    level = (
        F.when(by_user & by_client, "user-client")
        .when(by_user, "user")
        .when(by_client, "client")
        .otherwise("family")
    )
    client_id = F.coalesce("client_id", F.lit(""))
    out = grouped.select(
        level.alias("level"),
        F.coalesce("user", F.lit("")).alias("user"),
        (F.when(level == "family", F.col("prefix")).otherwise(client_id) if families else client_id).alias(
            "client_id"
        ),
        *(["prefix"] if families else []),
        "sec",
        *columns,
    )
    # The ids without a generated suffix are no family.
    return out.where((F.col("level") != "family") | F.col("client_id").isNotNull()) if families else out


def entity_table(pairs: DataFrame, opts: StatsOptions) -> DataFrame:
    """One row per entity: produce and fetch stats structs, throttle sums, top entities' seconds;
    its first and last second, the most (user, client-id) pairs it had in one second and its
    family's prefix; the client-id families as entities of level ``family`` (no seconds kept)."""
    from pyspark.sql import functions as F

    summed = ["produce_throttle_ms", "fetch_throttle_ms", "produce_requests", "fetch_requests"]
    columns = ["produce_bytes", "fetch_bytes", *summed, "active_pairs"]
    levels = level_seconds(pairs.withColumn("active_pairs", F.lit(1)), columns, families=True)
    per_entity = levels.groupBy(*ENTITY_KEYS).agg(
        *_collect(PRODUCE, points=True),
        *_collect(FETCH, points=True),
        *[F.sum(c).alias(c) for c in summed],
        F.min("sec").alias("first_s"),
        F.max("sec").alias("last_s"),
        F.max("active_pairs").alias("peak_pairs"),
        F.first("prefix", ignorenulls=True).alias("prefix"),
    )
    not_family = F.col("level") != "family"
    return _with_stats(per_entity, ["level"], opts.top_series, opts.burst_factor, series_when=not_family)


# --- pass 2: topic partitions ----------------------------------------------------------------------


def partition_seconds(captures: DataFrame, for_replay: bool = False) -> DataFrame:
    """One row per (topic, partition, second): record-set bytes produced and fetched;
    ``for_replay``: also the columns of ``Seconds.partitions``."""
    from pyspark.sql import functions as F

    # explode of the structs measured cheaper than zipping the three fields used (arrays_zip) or
    # posexplode with element_at, in spite of reading the records counts too.
    data = captures.where(F.col("api_key").isin(0, 1)).select(
        _sec().alias("sec"),
        "api_key",
        *(["upstream_ms"] if for_replay else []),
        F.explode("partitions").alias("p"),
    )
    part = data.select(
        "*", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"), "p.bytes"
    ).drop("p")
    produce, fetch = F.col("api_key") == 0, F.col("api_key") == 1
    extra = []
    if for_replay:
        extra = [
            F.count(F.when(produce, 1)).alias("produce_n"),
            F.count(F.when(fetch, 1)).alias("fetch_n"),
            _fetch_shift(fetch).alias("fetch_shift_ms"),
        ]
    return part.groupBy("topic", "partition", "sec").agg(
        F.sum(F.when(produce, F.col("bytes"))).alias("produce_bytes"),
        F.sum(F.when(fetch, F.col("bytes"))).alias("fetch_bytes"),
        *extra,
    )


def topic_table(parts: DataFrame, opts: StatsOptions) -> DataFrame:
    """One row per partition (``partition`` >= 0) and per topic (``partition`` -1) with stats per
    direction; the top topics keep their seconds. Both branches read the same per-second table
    (``partition_seconds``: Spark reuses its shuffle, the records are exploded once)."""
    from pyspark.sql import functions as F

    per_partition = parts.groupBy("topic", "partition").agg(
        *_collect(PRODUCE, False), *_collect(FETCH, False)
    )
    no_series = [
        F.lit(None).cast("array<long>").alias(f"{d}_{c}") for d in DIRECTIONS for c in ("secs", "values")
    ]
    per_partition = per_partition.select(
        "topic", "partition", *[_stats(d, None).alias(d) for d in DIRECTIONS], *no_series
    )
    topic_seconds = parts.groupBy("topic", "sec").agg(
        *[F.sum(f"{d}_bytes").alias(f"{d}_bytes") for d in DIRECTIONS]
    )
    per_topic = topic_seconds.groupBy("topic").agg(*_collect(PRODUCE, True), *_collect(FETCH, True))
    per_topic = _with_stats(per_topic.withColumn("partition", F.lit(-1)), [], opts.top_series, None)
    return per_partition.unionByName(per_topic)


# --- pass 3: producer ids --------------------------------------------------------------------------


def producer_id_hours(captures: DataFrame) -> DataFrame:
    """New producer ids per (user, epoch hour): ids first seen in that hour (-1, no id, left out)."""
    from pyspark.sql import functions as F

    ids = captures.where((F.col("api_key") == 0) & (F.size("producer_ids") > 0)).select(
        F.col("principal").alias("user"), "ts_ms", F.explode("producer_ids").alias("pid")
    )
    first = ids.where(F.col("pid") >= 0).groupBy("user", "pid").agg(F.min("ts_ms").alias("first_ms"))
    return first.groupBy("user", F.expr("first_ms div 3600000").alias("hour")).agg(
        F.count(F.lit(1)).alias("new_ids")
    )


def _producer_id_tables(hourly: pd.DataFrame, start_s: int, end_s: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    cols = ["user", "hour_start_s", "covered_s", "new_ids", "ids_per_s"]
    user_cols = ["user", "new_ids", "hours", "max_new_per_hour", "mean_new_per_hour", "peak_ids_per_s"]
    if hourly.empty:
        return pd.DataFrame(columns=user_cols), pd.DataFrame(columns=cols)
    h = hourly.copy()
    h["hour_start_s"] = h["hour"].astype("int64") * 3600
    lo = h["hour_start_s"].clip(lower=start_s)
    hi = (h["hour_start_s"] + 3600).clip(upper=end_s + 1)
    h["covered_s"] = (hi - lo).clip(lower=60)
    h["ids_per_s"] = h["new_ids"] / h["covered_s"]
    h = h[cols].sort_values(["user", "hour_start_s"], ignore_index=True)
    users = (
        h.groupby("user")
        .agg(
            new_ids=("new_ids", "sum"),
            hours=("new_ids", "size"),
            max_new_per_hour=("new_ids", "max"),
            mean_new_per_hour=("new_ids", "mean"),
            peak_ids_per_s=("ids_per_s", "max"),
        )
        .reset_index()
        .sort_values("peak_ids_per_s", ascending=False, ignore_index=True)
    )
    users["mean_new_per_hour"] = users["mean_new_per_hour"].round(2)
    return users, h


# --- mutations (small: only seconds with partition mutations) ----------------------------------------


def mutation_seconds(pairs: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return level_seconds(pairs.where(F.col("mutations") > 0), ["mutations", "mutation_requests"])


def _window_max(secs: np.ndarray, values: np.ndarray, window_s: int) -> int:
    """The largest sum of values over any window_s consecutive seconds (secs sorted)."""
    total = np.concatenate([[0], np.cumsum(values)])
    first = np.searchsorted(secs, secs - window_s + 1)
    return int((total[1:] - total[first]).max())


def mutation_tables(series: pd.DataFrame, opts: StatsOptions, span_s: int) -> pd.DataFrame:
    cols = [
        *ENTITY_KEYS,
        "requests",
        "mutations",
        "active_s",
        "max_per_s",
        "max_window",
        "peak_rate",
        "mean_rate",
    ]
    rows = []
    for key, s in series.sort_values("sec").groupby(ENTITY_KEYS, sort=False):
        secs = s["sec"].to_numpy(np.int64)
        m = s["mutations"].to_numpy(np.int64)
        rows.append(
            (
                *key,
                int(s["mutation_requests"].sum()),
                int(m.sum()),
                len(s),
                int(m.max()),
                _window_max(secs, m, opts.controller_window_s),
                _window_max(secs, m, opts.sustained_window_s) / opts.sustained_window_s,
                m.sum() / span_s,
            )
        )
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["level", "max_window"], ascending=[True, False], ignore_index=True)


# --- all of it -------------------------------------------------------------------------------------


def _entities(
    captures: DataFrame, opts: StatsOptions, say: Progress, t0: float
) -> tuple[dict[str, pd.DataFrame], Any]:
    """Pass 1: entity rates and series, mutations; returns the tables and (records, start, end)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from analytics.stats_controls import family_table

    say("entity pass: bytes, throttle and mutations per second per (user, client-id)")
    pairs = pair_seconds(captures, opts.keep_seconds).persist(StorageLevel.MEMORY_AND_DISK)
    seconds = None
    try:
        row = pairs.agg(F.sum("requests"), F.min("sec"), F.max("sec"), F.count(F.lit(1))).first()
        assert row is not None
        records, start_s, end_s = int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)
        took = time.monotonic() - t0
        say(f"entity pass done: {records:,} records, {row[3]:,} entity-seconds, {took:.1f}s")
        span = end_s - start_s + 1
        wide = _pandas(entity_table(pairs, opts))
        mseries = _pandas(mutation_seconds(pairs))
        if opts.keep_seconds:
            used = F.col("produce_requests") + F.col("fetch_requests") + F.col("init_pid_requests") > 0
            seconds = _pandas(
                pairs.where(used).select(
                    "sec", F.col("user").alias("principal"), "client_id", *ENTITY_SECOND_COLUMNS
                )
            )
    finally:
        pairs.unpersist()
    tables: dict[str, pd.DataFrame] = {"_seconds": seconds} if seconds is not None else {}
    tables["client_families"] = family_table(wide)
    wide = wide[wide["level"] != "family"]
    entity = _melt(
        wide, ENTITY_KEYS, {"throttle_ms": "{direction}_throttle_ms", "requests": "{direction}_requests"}
    )
    entity["throttle_ms"] = entity["throttle_ms"].fillna(0).astype("int64")
    entity["requests"] = entity["requests"].fillna(0).astype("int64")
    entity["mean_bps"] = (entity["total_bytes"] / span).round(1)
    entity["throttled_share"] = (entity["throttle_ms"] / (span * 1000.0)).round(6)
    entity = entity[
        [*RATE_KEYS, *DIST_COLUMNS, "requests", "throttle_ms", *BURST_COLUMNS, "mean_bps", "throttled_share"]
    ]
    order = ["level", "direction", "p99_bps"]
    tables["entity_rates"] = entity.sort_values(order, ascending=[True, True, False], ignore_index=True)
    tables["entity_series"] = _series_rows(wide, ENTITY_KEYS)
    say(f"entity rates: {len(entity)} entity-directions, {time.monotonic() - t0:.1f}s")
    tables["mutations"] = mutation_tables(mseries, opts, span)
    tables["mutation_series"] = mseries[[*ENTITY_KEYS, "sec", "mutations"]].sort_values(
        [*ENTITY_KEYS, "sec"], ignore_index=True
    )
    say(f"mutations: {len(tables['mutations'])} entities, {time.monotonic() - t0:.1f}s")
    return tables, (records, start_s, end_s)


def _topics(captures: DataFrame, opts: StatsOptions, say: Progress, t0: float) -> dict[str, pd.DataFrame]:
    """Pass 2: topic and partition rates, top topics' series."""
    from pyspark import StorageLevel

    say("partition pass: bytes per second per topic-partition and topic")
    part_secs = partition_seconds(captures, opts.keep_seconds)
    seconds = None
    if opts.keep_seconds:
        part_secs = part_secs.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        wide = _pandas(topic_table(part_secs, opts))
        if opts.keep_seconds:
            seconds = _pandas(part_secs.select("topic", "partition", "sec", *PARTITION_SECOND_COLUMNS))
    finally:
        if opts.keep_seconds:
            part_secs.unpersist()
    melted = _melt(wide, ["topic", "partition"])
    parts = melted[melted["partition"] >= 0][["direction", "topic", "partition", *DIST_COLUMNS]]
    parts = parts.sort_values(["direction", "topic", "partition"], ignore_index=True)
    topics = melted[melted["partition"] < 0][[*TOPIC_KEYS, *DIST_COLUMNS]]
    per_topic = parts.groupby(TOPIC_KEYS).agg(
        partitions=("partition", "nunique"),
        partition_p99_max_bps=("p99_bps", "max"),
        partition_max_bps=("max_bps", "max"),
    )
    topics = topics.merge(per_topic.reset_index(), on=TOPIC_KEYS, how="left")
    order = ["direction", "partition_p99_max_bps"]
    topics = topics.sort_values(order, ascending=[True, False], ignore_index=True)
    series = _series_rows(wide[wide["partition"] < 0], ["topic"])
    say(f"topic rates: {len(topics)} topic-directions, {len(parts)} partitions, {time.monotonic() - t0:.1f}s")
    return {
        "topic_rates": topics,
        "partition_rates": parts,
        "topic_series": series[["direction", "topic", "sec", "bytes"]],
        **({"_seconds": seconds} if seconds is not None else {}),
    }


def _producer_ids(captures: DataFrame, say: Progress, t0: float) -> pd.DataFrame:
    """Pass 3: new producer ids per user and hour (the per-user table needs the span: later)."""
    say("producer-id pass: new producer ids per user per hour")
    hourly = _pandas(producer_id_hours(captures))
    say(f"producer-id pass done: {len(hourly)} user-hours, {time.monotonic() - t0:.1f}s")
    return hourly


def _controls(captures: DataFrame, say: Progress, t0: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pass 4: decided Produce and Fetch throttles (the evidence for a bound on them), and the
    new-member joins of consumer groups (for a join guard rail)."""
    from analytics.stats_controls import control_tables

    say("controls pass: decided Produce and Fetch throttles, JoinGroup connections")
    times, joins = control_tables(captures)
    throttled = int(times["requests"].sum())
    joined = int((joins["level"] == "user-client").sum())
    took = time.monotonic() - t0
    say(f"controls pass done: {throttled:,} throttled requests, {joined:,} pairs joining groups, {took:.1f}s")
    return times, joins


def compute(
    spark: Any, captures: DataFrame, opts: StatsOptions | None = None, progress: Progress | None = None
) -> Stats:
    """Every table of the report, as pandas DataFrames, from the capture records.

    The four passes are independent Spark jobs, run from four threads: Spark fills each job's
    idle cores (single-task stages, the driver's share of the work) with the others' tasks.
    """
    from concurrent.futures import ThreadPoolExecutor

    opts = opts or StatsOptions()
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    with ThreadPoolExecutor(4, thread_name_prefix="kthrottle-stats") as pool:
        entities = pool.submit(_entities, captures, opts, say, t0)
        topics = pool.submit(_topics, captures, opts, say, t0)
        pids = pool.submit(_producer_ids, captures, say, t0)
        controls = pool.submit(_controls, captures, say, t0)
        tables, (records, start_s, end_s) = entities.result()
        topic_tables = topics.result()
        hourly = pids.result()
        tables["throttle_times"], tables["group_joins"] = controls.result()
    seconds = None
    if opts.keep_seconds:
        seconds = Seconds(tables.pop("_seconds"), topic_tables.pop("_seconds"))
    tables.update(topic_tables)
    users, hours = _producer_id_tables(hourly, start_s, end_s)
    tables["producer_ids"] = users
    tables["producer_ids_hourly"] = hours
    say(f"producer ids: {len(users)} users, {time.monotonic() - t0:.1f}s")
    order = [
        "entity_rates",
        "entity_series",
        "topic_rates",
        "partition_rates",
        "topic_series",
        "mutations",
        "mutation_series",
        "producer_ids",
        "producer_ids_hourly",
        "client_families",
        "throttle_times",
        "group_joins",
    ]
    return Stats({name: tables[name] for name in order}, records, start_s, end_s, seconds)
