"""The capture's evidence for the proxy's operator controls and its join guard rail, in Spark.

Kafka has none of them; the proxy does (docs/quotas.md), and the tuning job proposes them from
three small tables (the rules that read them are in analytics/propose_controls.py):

- ``client_families`` (for ``client_id_prefixes``): client ids told apart only by a generated
  suffix, one per process (``app-7f9c1a``, ``app-0b31e2``: the family ``app-``), each of which a
  per-id quota would give a full bucket of its own. A suffix is *generated* when every part of
  it (split at ``-``, ``_`` or ``.``) is a UUID or a hex run with a digit (``7f9c1a``, ``42``);
  an id's *stem* is what is left without its longest generated suffix, separator kept
  (``orders-v2-`` for ``orders-v2-7f9c-3``; ``billing`` and ``app-cafe`` have none). The ids of
  one stem, at least two, are a family, the stem its prefix. The entity pass sums the families
  per second in the grouping sets it has anyway (``family_prefix``, level ``family`` in
  analytics.stats.level_seconds), and ``family_table`` reads them from its table. (A prefix
  quota would also take in other ids starting with it, ``app-admin``, or those of a longer
  stem; the proposal names them from ``entity_rates`` rather than this pass matching every id
  against every prefix.) Columns: prefix, direction, client_ids, peak_ids (most (user,
  client-id) pairs of the family with a request in one second: its ids at once, when they have
  one user), median_life_s (median over its ids of last second - first second + 1), first_s,
  last_s, requests, and the distribution of the family's bytes per active second (all its ids
  and users together), as in ``entity_rates``: active_s, total_bytes, p50_bps, p95_bps,
  p99_bps, max_bps.
- ``throttle_times`` (for ``max_throttle_ms``): the throttles the proxy decided on Produce and
  Fetch requests (``decided_throttle_ms`` > 0, applied or not: dry-run captures count), in steps
  of ``THROTTLE_STEP_MS``. Columns: direction, throttle_ms (the step's upper end: the decided
  throttle rounded up), requests (decided a throttle in the step), longest_for ((user,
  client-id) entities whose longest throttle of that direction is in the step). Counts above
  any whole step are exact, percentiles to a step.
- ``group_joins`` (for ``join_group_rate``, the guard rail of quota/group_requests.py): each
  entity's *new-member joins*, a connection (``proxy``, ``conn``) that sent at least one
  JoinGroup (api 11) counting once, at its first JoinGroup's time. The capture has no member id;
  a consumer joins as a new member once per connection, and one that crash-loops makes a new
  connection on every start, while a healthy member rejoins on the connection it has. One row
  per entity with a join, at the levels ``user-client`` (the (user, client-id) pair: the
  evidence) and ``client`` (a client id, its users together: what a ``clients.C`` quota holds).
  Columns: level, user ('' at the client level), client_id, joins, join_requests (every
  JoinGroup of those connections: also a member's second join with the id the broker gave it,
  KIP-394, and its rejoins), first_ms, last_ms (the first and last join), span_s (between
  them), peak_per_min (most joins in any 60 s), median_interval_s (the median time between
  consecutive joins; NaN for one join). A proxy restarted under the same instance name numbers
  its connections anew: a connection id of both runs counts once.

The last two are one read of the capture and one shuffle (``control_requests``: the controls
pass), persisted while each table is taken from it (``control_tables``).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analytics.stats import DIST_COLUMNS, FETCH, PRODUCE, _melt, _pandas
from quota.group_requests import JOIN_GROUP

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

THROTTLE_STEP_MS = 100
_HEX_WITH_DIGIT = r"(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]+"
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_PART = f"(?:{_UUID}|{_HEX_WITH_DIGIT})"
# Group 1 is the stem: the shortest start ending in a separator after which all is generated.
# The same pattern in Java (Spark's regexp_extract) and Python (``stem``).
STEM_PATTERN = rf"^(.*?[-_.]){_PART}(?:[-_.]{_PART})*$"
FAMILY_KEYS = ["prefix", "client_ids", "peak_ids", "median_life_s", "first_s", "last_s"]
FAMILY_COLUMNS = [*FAMILY_KEYS[:1], "direction", *FAMILY_KEYS[1:], "requests", *DIST_COLUMNS]
THROTTLE_COLUMNS = ["direction", "throttle_ms", "requests", "longest_for"]
JOIN = "join"  # the controls pass's direction of JoinGroup requests
JOIN_STAT_COLUMNS = ["joins", "first_ms", "last_ms", "span_s", "peak_per_min", "median_interval_s"]
JOIN_COLUMNS = ["level", "user", "client_id", "joins", "join_requests", *JOIN_STAT_COLUMNS[1:]]


def stem(client_id: str) -> str:
    """A client id without its generated suffix ('' when it has none), as the Spark pass cuts it."""
    found = re.match(STEM_PATTERN, client_id)
    return found.group(1) if found else ""


def family_prefix(client_id: Column) -> Column:
    """A client id's family prefix (its stem), null when it has no generated suffix."""
    from pyspark.sql import functions as F

    found = F.regexp_extract(client_id, STEM_PATTERN, 1)
    return F.when(found != "", found)


def family_table(wide: pd.DataFrame) -> pd.DataFrame:
    """``client_families`` from the entity pass's table (analytics.stats.entity_table: level
    ``family`` rows, and the client-id rows with their first and last second and prefix): one
    row per family of at least two ids and direction with traffic."""
    clients = wide[(wide["level"] == "client") & wide["prefix"].notna()]
    life = (clients["last_s"] - clients["first_s"] + 1).groupby(clients["prefix"])
    ids = pd.DataFrame({"client_ids": life.size(), "median_life_s": life.median()})
    ids = ids[ids["client_ids"] >= 2]
    fams = wide[wide["level"] == "family"].drop(columns=["prefix"])
    fams = fams.rename(columns={"client_id": "prefix", "peak_pairs": "peak_ids"})
    fams = fams.merge(ids, left_on="prefix", right_index=True)
    out = _melt(fams, FAMILY_KEYS, {"requests": "{direction}_requests"}).reindex(columns=FAMILY_COLUMNS)
    for c in ["client_ids", "peak_ids", "first_s", "last_s", "requests", *DIST_COLUMNS]:
        out[c] = out[c].fillna(0).astype("int64")
    out["median_life_s"] = out["median_life_s"].astype("float64")
    return out.sort_values(["direction", "p99_bps"], ascending=[True, False], ignore_index=True)


def control_requests(captures: DataFrame) -> DataFrame:
    """The controls pass, grouped once for both of its tables: decided throttles of Produce and
    Fetch per (direction, principal, client id, step), and JoinGroup requests per (principal,
    client id, proxy, conn) (direction ``join``, no step) with the first one's time, first_ms."""
    from pyspark.sql import functions as F

    api, decided = F.col("api_key"), F.col("decided_throttle_ms")
    join = api == JOIN_GROUP
    step = F.ceil(decided / THROTTLE_STEP_MS) * THROTTLE_STEP_MS
    rows = captures.where((api.isin(0, 1) & (decided > 0)) | join).select(
        F.when(join, F.lit(JOIN)).when(api == 0, F.lit(PRODUCE)).otherwise(F.lit(FETCH)).alias("direction"),
        "principal",
        "client_id",
        F.when(~join, step).cast("long").alias("throttle_ms"),
        *[F.when(join, F.col(c)).alias(c) for c in ("proxy", "conn", "ts_ms")],
    )
    return rows.groupBy("direction", "principal", "client_id", "throttle_ms", "proxy", "conn").agg(
        F.count(F.lit(1)).alias("requests"), F.min("ts_ms").alias("first_ms")
    )


def throttle_times(requests: DataFrame) -> DataFrame:
    """Decided Produce and Fetch throttles per direction and step (module docstring), from the
    controls pass (``control_requests``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_entity = requests.where(F.col("direction") != JOIN)
    entity = ["direction", "principal", "client_id"]
    longest = F.max("throttle_ms").over(Window.partitionBy(*entity))
    return (
        per_entity.withColumn("longest", longest)
        .groupBy("direction", "throttle_ms")
        .agg(
            F.sum("requests").alias("requests"),
            F.count(F.when(F.col("throttle_ms") == F.col("longest"), 1)).alias("longest_for"),
        )
    )


def join_times(requests: DataFrame) -> DataFrame:
    """Per (user, client-id) pair and per client id: the new-member joins' times, sorted (one per
    connection, its first JoinGroup), and the JoinGroup requests of those connections."""
    from pyspark.sql import functions as F

    joins = requests.where(F.col("direction") == JOIN)
    sets = [["principal", "client_id"], ["client_id"]]
    grouped = joins.groupingSets(sets, "principal", "client_id").agg(
        F.array_sort(F.collect_list("first_ms")).alias("join_ms"),
        F.sum("requests").alias("join_requests"),
        F.grouping("principal").alias("g_user"),
    )
    pair = F.col("g_user") == 0
    return grouped.select(
        F.when(pair, F.lit("user-client")).otherwise(F.lit("client")).alias("level"),
        F.when(pair, F.coalesce("principal", F.lit(""))).otherwise(F.lit("")).alias("user"),
        F.coalesce("client_id", F.lit("")).alias("client_id"),
        "join_ms",
        "join_requests",
    )


def step_percentile(steps: pd.Series, counts: pd.Series, p: float) -> int:
    """Nearest rank over a histogram (``steps`` sorted, ``counts`` per step; not empty)."""
    rank = max(1, math.ceil(p * int(counts.sum()) - 1e-9))
    return int(steps[(counts.cumsum() >= rank).to_numpy()].iloc[0])


def throttle_table(requests: DataFrame) -> pd.DataFrame:
    """``throttle_times`` on the driver, by direction and step."""
    out = _pandas(throttle_times(requests)).reindex(columns=THROTTLE_COLUMNS)
    for c in THROTTLE_COLUMNS[1:]:
        out[c] = out[c].fillna(0).astype("int64")
    return out.sort_values(["direction", "throttle_ms"], ignore_index=True)


def join_stats(join_ms: np.ndarray) -> tuple[int, int, int, float, int, float]:
    """One entity's joins (times in ms, sorted): joins, first_ms, last_ms, span_s, peak_per_min,
    median_interval_s."""
    ms = np.asarray(join_ms, dtype=np.int64)
    peak = int((np.searchsorted(ms, ms + 60_000, side="left") - np.arange(len(ms))).max())
    median = float(np.median(np.diff(ms))) / 1000 if len(ms) > 1 else math.nan
    return len(ms), int(ms[0]), int(ms[-1]), (int(ms[-1]) - int(ms[0])) / 1000, peak, median


def join_table(requests: DataFrame) -> pd.DataFrame:
    """``group_joins`` (module docstring): the joins' times from Spark, one row per entity, read
    on the driver."""
    times = _pandas(join_times(requests))
    stats = [join_stats(ms) for ms in times["join_ms"]]
    out = pd.DataFrame(stats, columns=JOIN_STAT_COLUMNS, index=times.index)
    out = pd.concat([times[["level", "user", "client_id", "join_requests"]], out], axis=1)
    out = out.reindex(columns=JOIN_COLUMNS)
    for c in ["joins", "join_requests", "first_ms", "last_ms", "peak_per_min"]:
        out[c] = out[c].astype("int64")
    for c in ["span_s", "median_interval_s"]:
        out[c] = out[c].astype("float64")
    order = ["level", "joins", "user", "client_id"]
    return out.sort_values(order, ascending=[False, False, True, True], ignore_index=True)


def control_tables(captures: DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``throttle_times`` and ``group_joins`` from one controls pass, persisted between them."""
    from pyspark import StorageLevel

    requests = control_requests(captures).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return throttle_table(requests), join_table(requests)
    finally:
        requests.unpersist()
