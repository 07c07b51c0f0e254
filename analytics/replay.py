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

The steps, each a module with its own typed inputs and outputs (this module runs them in order):

- ``analytics/replayer.py``: ``Replayer``, the quota classes fed row by row; ``replay_rows`` and
  ``replay_requests`` on top of it.
- ``analytics/replay_frames.py``: ``ReplayInput``, the capture's columns the replay reads, at
  their charge time; the statistics' seconds as per-slot tables.
- ``analytics/replay_bounds.py``: the pruning bound (below), plain numpy.
- ``analytics/replay_prune.py`` (client and producer-id buckets) and
  ``analytics/replay_partitions.py`` (topic partitions): ``ReplaySetup`` in, ``Pruned`` out, the
  cold buckets' results and the hot buckets.
- ``analytics/replay_units.py``: hot buckets grouped into units (``UnitPlan``), their rows, the
  Spark run and the merge; ``analytics/replay_worker.py`` is what runs in the workers.

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

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from analytics.replay_bounds import rate_bound, shifted_rate_bound, sliding_peaks
from analytics.replay_frames import replay_input
from analytics.replay_partitions import partition_bounds
from analytics.replay_prune import (
    Entities,
    Pruned,
    ReplaySetup,
    SlotTable,
    client_bounds,
    client_results,
    find_entities,
    producer_id_bounds,
    refine_client_bounds,
    slot_table,
)
from analytics.replay_units import merge_units, plan_units, run_units
from analytics.replayer import (
    AT_RESPONSE,
    MUTATION_KEYS,
    QUOTAS,
    REPLAYED_KEYS,
    RESULT_COLUMNS,
    TOPIC_CONSUMER,
    TOPIC_PRODUCER,
    Key,
    Replayer,
    charge_time_ms,
    finish,
    is_topic_id,
    replay_requests,
    replay_rows,
    strict_mutation_versions,
)
from quota.keys import CONSUMER_BYTE_RATE, CONTROLLER_MUTATION_RATE, PRODUCER_BYTE_RATE, PRODUCER_IDS_RATE

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

    from analytics.replay_frames import ReplayInput
    from analytics.stats import Seconds
    from quota.config import QuotaConfig

__all__ = [
    "AT_RESPONSE",
    "CONSUMER_BYTE_RATE",
    "CONTROLLER_MUTATION_RATE",
    "MUTATION_KEYS",
    "PRODUCER_BYTE_RATE",
    "PRODUCER_IDS_RATE",
    "QUOTAS",
    "REFINE_BELOW",
    "REPLAYED_KEYS",
    "REPLAY_ROW_COST",
    "RESULT_COLUMNS",
    "TOPIC_CONSUMER",
    "TOPIC_PRODUCER",
    "Key",
    "Replayer",
    "charge_time_ms",
    "is_topic_id",
    "rate_bound",
    "replay",
    "replay_requests",
    "replay_rows",
    "shifted_rate_bound",
    "sliding_peaks",
    "strict_mutation_versions",
]

_Replayer = Replayer  # the name tests/unit/test_plain_config.py runs without pydantic

# With the statistics' seconds, a bucket whose coarse bound is over this many times its quota is
# replayed without the finer look (a pass over the records): it is most likely over its quota, and
# replaying one that is not changes no result, only time.
REFINE_BELOW = 1.5
# The finer look is one pass over all records; replaying a request costs about as much as reading
# this many in such a pass (measured on local[2]: ~20 us against ~0.25 us). Buckets with fewer
# requests than records / this, together, are replayed without it.
REPLAY_ROW_COST = 80


class _Timer:
    """Seconds per step of the replay, in the info ``frame.attrs["replay"]`` carries."""

    def __init__(self) -> None:
        self.started = self.last = time.perf_counter()
        self.steps: dict[str, float] = {}
        self.info: dict[str, Any] = {"steps": self.steps}

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.steps[step] = round(now - self.last, 3)
        self.last = now


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
    timer = _Timer()
    setup = ReplaySetup.of(cfg, enforce, strict_from, slot_ms, REFINE_BELOW, REPLAY_ROW_COST)
    rows = replay_input(captures_df, setup.slot, setup.mutations_active)
    ents, pruned = _prune(spark, rows, setup, seconds, timer)
    plan = plan_units(spark, rows, setup, ents, pruned)
    info = timer.info
    info["units"] = len(plan.units)
    info["hot_buckets"] = (
        len(pruned.hot_clients) + len(pruned.hot_users) + sum(len(s) for s in pruned.hot_parts.values())
    )
    info["pruned_buckets"] = len(pruned.results) - info["hot_buckets"]
    timer.lap("units")
    info["replayed_rows"] = 0
    if plan.units:
        nparts = tasks or max(2, spark.sparkContext.defaultParallelism * 2)
        out = run_units(spark, rows, setup, ents, plan, nparts)
        timer.lap("replay")
        info["replayed_rows"] = merge_units(out, ents.buckets, pruned)
    return _result_frame(pruned.results.values(), timer)


def _prune(
    spark: SparkSession, rows: ReplayInput, setup: ReplaySetup, seconds: Seconds | None, timer: _Timer
) -> tuple[Entities, Pruned]:
    """Steps 1-4 of the module docstring: the cold buckets' counts, and which buckets are hot."""
    by_slot = slot_table(rows, setup, seconds)
    timer.lap("entity_slots")
    ents, entity_of = find_entities(by_slot, setup)
    timer.info["entities"] = len(ents.pairs)
    table = SlotTable(by_slot, 1000.0 if seconds is not None else setup.slot, entity_of)
    bounds = client_bounds(table, ents, setup)
    pruned = Pruned(total_requests=int(by_slot["n"].to_numpy().sum()))
    if seconds is not None:
        refine_client_bounds(spark, rows, setup, ents, bounds, pruned.total_requests)
    client_results(ents, bounds, pruned)
    timer.lap("client_bounds")
    if ents.pid_users:
        producer_id_bounds(spark, rows, setup, ents, table, pruned)
        timer.lap("producer_id_bounds")
    del table, by_slot, entity_of  # the largest table on the driver, no longer needed
    if partition_bounds(rows, setup, seconds, pruned):
        timer.lap("partition_bounds")
    return ents, pruned


def _result_frame(results: Iterable[dict[str, Any]], timer: _Timer) -> pd.DataFrame:
    """The results as ``replay_rows`` orders them, typed as the report and the tables expect."""
    import pandas as pd

    frame = pd.DataFrame(finish(results), columns=list(RESULT_COLUMNS))
    for c in ("partition", *RESULT_COLUMNS[7:]):
        frame[c] = frame[c].astype("int64")
    frame["level"] = frame["level"].astype("Int64")  # None where a level does not apply
    frame["quota_value"] = frame["quota_value"].astype("float64")
    timer.info["seconds"] = round(time.perf_counter() - timer.started, 3)
    frame.attrs["replay"] = timer.info
    return frame
