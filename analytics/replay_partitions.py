"""The replay's pruning for topic-partition quotas (KIP-1010's producer/consumer byte rates).

Why apart from the client buckets (analytics/replay_prune.py): a partition bucket is fed by the
exploded partitions of every request, not by an entity's rows; only partitions of topics with a
quota are looked at. Same idea: bound each partition's rate from per-slot sums (the statistics'
seconds, or one pass), look again at the setup's slot at those near their quota, and leave cold
those that cannot go over it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analytics.replay_bounds import rate_bound, shifted_rate_bound
from analytics.replay_frames import ReplayInput, lookup, part_key, part_key_col, partition_seconds, to_pandas
from analytics.replayer import FETCH, PRODUCE, TOPIC_CONSUMER, TOPIC_ID_SQL, TOPIC_PRODUCER, cold_result
from quota.keys import DEFAULT as DEFAULT_TOPIC

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from pyspark.sql import Column

    from analytics.replay_prune import Pruned, ReplaySetup
    from analytics.stats import Seconds


@dataclass
class PartitionSlots:
    """Per (api, topic, partition, slot): requests and bytes, each row's bucket, each bucket's bound."""

    frame: pd.DataFrame
    group: np.ndarray  # row -> partition bucket id, in order of first appearance
    bounds: dict[int, float]


def partition_condition(setup: ReplaySetup) -> Column | None:
    """Rows of partitions of topics with a quota in the request's direction (None: no such quota)."""
    from pyspark.sql import functions as F

    part_cond = None
    for direction, q in ((PRODUCE, setup.produce), (FETCH, setup.fetch)):
        names_q = {
            n
            for n, tq in setup.cfg.topics.items()
            if (tq.producer_byte_rate if q.produce else tq.consumer_byte_rate)
        }
        if names_q:
            topic_cond = F.lit(True) if DEFAULT_TOPIC in names_q else F.col("topic").isin(*sorted(names_q))
            cond = (F.col("api") == direction) & topic_cond
            part_cond = cond if part_cond is None else part_cond | cond
    return part_cond


def partition_slots(rows: ReplayInput, cond: Column) -> pd.DataFrame:
    """Requests and bytes per (api, topic, partition, slot) of the partitions ``cond`` keeps."""
    from pyspark.sql import functions as F

    return to_pandas(
        rows.base.filter(F.col("api").isin(PRODUCE, FETCH))
        .select("api", rows.slot_col, F.explode("partitions").alias("p"))
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


def partition_table(
    rows: ReplayInput, setup: ReplaySetup, seconds: Seconds | None, cond: Column
) -> PartitionSlots:
    """The partitions' slots and bounds: from the records at the setup's slot, or from the
    statistics' seconds (1 s slots, shifted by the fetches' upstream time)."""
    from pyspark.sql import functions as F

    if seconds is None:
        frame = partition_slots(rows, ~F.col("topic").rlike(TOPIC_ID_SQL) & cond)
        group = frame.groupby(["api", "topic", "partition"], sort=False).ngroup().to_numpy()
        return PartitionSlots(
            frame, group, rate_bound(group, frame["slot"], frame["bytes"], setup.window, setup.slot)
        )
    frame = partition_seconds(seconds.partitions, setup.produce, setup.fetch)
    group = frame.groupby(["api", "topic", "partition"], sort=False).ngroup().to_numpy()
    bounds = shifted_rate_bound(group, frame["slot"], frame["bytes"], frame["shift"], setup.window, 1000.0)
    return PartitionSlots(frame, group, bounds)


def _buckets(frame: pd.DataFrame) -> Iterator[tuple[int, int, str, int]]:
    """(bucket id, direction, topic, partition) of each partition bucket, in bucket id order."""
    heads = frame.drop_duplicates(["api", "topic", "partition"])
    for gid, (direction, topic, partition) in enumerate(
        heads[["api", "topic", "partition"]].itertuples(index=False, name=None)
    ):
        yield gid, direction, topic, int(partition)


def refine_partition_bounds(
    rows: ReplayInput, setup: ReplaySetup, table: PartitionSlots, total_requests: int
) -> None:
    """The bound at the setup's slot, in place, for partitions over their quota but not far over,
    when they have requests enough to be worth one more pass over the records."""
    import numpy as np
    from pyspark.sql import functions as F

    left = {}
    for gid, direction, topic, partition in _buckets(table.frame):
        quota = (setup.produce if direction == PRODUCE else setup.fetch).topic_quota(topic)
        if quota is not None and quota < table.bounds.get(gid, 0.0) <= quota * setup.refine_below:
            left[f"{direction}\u0000{part_key(topic, partition)}"] = gid
    requests_per_group = np.bincount(table.group, weights=table.frame["n"].to_numpy())
    asked = sum(int(requests_per_group[gid]) for gid in left.values())
    if not left or asked * setup.row_cost < total_requests:
        return
    left_map = lookup(dict.fromkeys(left, 1))
    api_part = F.concat_ws(
        "\u0000", F.col("api").cast("string"), part_key_col(F.col("topic"), F.col("partition"))
    )
    fine = partition_slots(rows, F.element_at(left_map, api_part).isNotNull())
    fine_group = np.array(
        [
            left[f"{a}\u0000{part_key(t, int(pn))}"]
            for a, t, pn in zip(fine["api"], fine["topic"], fine["partition"], strict=True)
        ],
        dtype=np.int64,
    )
    refined = rate_bound(fine_group, fine["slot"], fine["bytes"], setup.window, setup.slot)
    for gid in left.values():
        table.bounds[gid] = refined.get(gid, 0.0)


def partition_results(setup: ReplaySetup, table: PartitionSlots, pruned: Pruned) -> None:
    """Each partition bucket's request count as its cold result, and the hot ones."""
    import numpy as np

    group = table.group
    part_counts = np.bincount(group, weights=table.frame["n"].to_numpy()) if len(group) else np.zeros(0)
    for gid, direction, topic, partition in _buckets(table.frame):
        quota = (setup.produce if direction == PRODUCE else setup.fetch).topic_quota(topic)
        if quota is None:
            continue
        name = TOPIC_PRODUCER if direction == PRODUCE else TOPIC_CONSUMER
        key = (name, "", "", topic, partition)
        pruned.results[key] = cold_result(key, None, quota, int(part_counts[gid]))
        if table.bounds.get(gid, 0.0) > quota:
            pruned.hot_parts[int(direction)].add((topic, partition))


def partition_bounds(rows: ReplayInput, setup: ReplaySetup, seconds: Seconds | None, pruned: Pruned) -> bool:
    """Step 4 of the pruning, for topic partitions; False when no topic has a quota."""
    cond = partition_condition(setup)
    if cond is None:
        return False
    table = partition_table(rows, setup, seconds, cond)
    if seconds is not None:
        refine_partition_bounds(rows, setup, table, pruned.total_requests)
    partition_results(setup, table, pruned)
    return True
