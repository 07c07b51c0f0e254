"""The capture as the Spark replay reads it, and the small Spark helpers the replay's steps share.

Why: every step of the replay at scale (analytics/replay_prune.py, analytics/replay_units.py)
reads the same columns of the captures with the time each request was charged at; they are
selected once here (``ReplayInput``). The statistics' per-second sums (``analytics.stats.Seconds``)
are reshaped here into the per-slot tables the pruning bound takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from analytics.replayer import (
    AT_RESPONSE,
    FETCH,
    INIT_PRODUCER_ID,
    MUTATION_KEYS,
    PRODUCE,
    REPLAYED_KEYS,
    is_topic_id,
)
from quota.manager import ByteRateQuotas
from quota.producer_ids import NO_PRODUCER_ID

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass(frozen=True)
class ReplayInput:
    """The captured requests the replay can decide: who, api, version, charge time ``t``, sizes."""

    base: DataFrame  # principal, client_id, api, version, t, request/response bytes, partitions, ...
    valid_ids: Column  # the request's producer ids, those above NO_PRODUCER_ID
    slot_col: Column  # the bound's time slot of ``t`` (named ``slot``)


def replay_input(captures_df: DataFrame, slot_ms: float, mutations_active: bool) -> ReplayInput:
    """The columns of the captures the replay reads, rows of the api keys it replays (mutations
    only under a controller mutation quota), each at the time the proxy charged it."""
    from pyspark.sql import functions as F

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
    return ReplayInput(base, valid_ids, F.floor(F.col("t") / slot_ms).cast("long").alias("slot"))


def to_pandas(df: DataFrame) -> pd.DataFrame:
    """A (small) Spark result on the driver, through Arrow."""
    return cast("pd.DataFrame", df.toPandas())


def part_key(topic: str, partition: int) -> str:
    """A topic partition as one string: the key of the literal maps below."""
    return f"{topic}\u0000{partition}"


def part_key_col(topic: Column, partition: Column) -> Column:
    """``part_key`` of a row's topic and partition, in Spark."""
    from pyspark.sql import functions as F

    return F.concat_ws("\u0000", topic, partition.cast("string"))


def lookup(mapping: Mapping[Any, int]) -> Column:
    """A literal map column (hot partitions, units per task: few)."""
    from pyspark.sql import functions as F

    return F.create_map(*[F.lit(x) for k in sorted(mapping) for x in (k, mapping[k])])


def task_keys(spark: SparkSession, tasks: int) -> dict[int, int]:
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


def entity_seconds(entities: pd.DataFrame) -> pd.DataFrame:
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
        frames.append(
            pd.DataFrame(
                {
                    "principal": rows["principal"].to_numpy(),
                    "client_id": rows["client_id"].to_numpy(),
                    "api": api,
                    "slot": rows["sec"].astype("int64").to_numpy(),
                    "n": counts[counts > 0].to_numpy(),
                    "bytes": _column(rows, size),
                    "pid_n": _column(rows, pid_n),
                    "pid_ids": _column(rows, pid_ids),
                    "shift": _column(rows, shift),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def _column(frame: pd.DataFrame, name: str | None) -> Any:
    """A column's values with 0 for missing, or 0 for every row when the api has no such column."""
    return frame[name].fillna(0).to_numpy() if name is not None else 0


def partition_seconds(
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
