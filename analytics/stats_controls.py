"""The capture's evidence for the proxy's two operator controls, in the Spark session.

Kafka has neither control; the proxy does (docs/quotas.md), and the tuning job proposes them from
two small tables (the rules that read them are in analytics/propose_controls.py):

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
- ``throttle_times`` (for ``max_throttle_ms``, a pass of its own, ``throttle_table``): the
  throttles the proxy decided on Produce and Fetch requests (``decided_throttle_ms`` > 0,
  applied or not: dry-run captures count), in steps of ``THROTTLE_STEP_MS``. Columns: direction,
  throttle_ms (the step's upper end: the decided throttle rounded up), requests (decided a
  throttle in the step), longest_for ((user, client-id) entities whose longest throttle of that
  direction is in the step). Counts above any whole step are exact, percentiles to a step.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import pandas as pd

from analytics.stats import DIST_COLUMNS, FETCH, PRODUCE, _melt, _pandas

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


def throttle_times(captures: DataFrame) -> DataFrame:
    """Decided Produce and Fetch throttles per direction and step (module docstring)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    api, decided = F.col("api_key"), F.col("decided_throttle_ms")
    steps = captures.where(api.isin(0, 1) & (decided > 0)).select(
        F.when(api == 0, F.lit(PRODUCE)).otherwise(F.lit(FETCH)).alias("direction"),
        "principal",
        "client_id",
        (F.ceil(decided / THROTTLE_STEP_MS) * THROTTLE_STEP_MS).cast("long").alias("throttle_ms"),
    )
    entity = ["direction", "principal", "client_id"]
    per_entity = steps.groupBy(*entity, "throttle_ms").agg(F.count(F.lit(1)).alias("requests"))
    longest = F.max("throttle_ms").over(Window.partitionBy(*entity))
    return (
        per_entity.withColumn("longest", longest)
        .groupBy("direction", "throttle_ms")
        .agg(
            F.sum("requests").alias("requests"),
            F.count(F.when(F.col("throttle_ms") == F.col("longest"), 1)).alias("longest_for"),
        )
    )


def step_percentile(steps: pd.Series, counts: pd.Series, p: float) -> int:
    """Nearest rank over a histogram (``steps`` sorted, ``counts`` per step; not empty)."""
    rank = max(1, math.ceil(p * int(counts.sum()) - 1e-9))
    return int(steps[(counts.cumsum() >= rank).to_numpy()].iloc[0])


def throttle_table(captures: DataFrame) -> pd.DataFrame:
    """``throttle_times`` on the driver, by direction and step."""
    out = _pandas(throttle_times(captures)).reindex(columns=THROTTLE_COLUMNS)
    for c in THROTTLE_COLUMNS[1:]:
        out[c] = out[c].fillna(0).astype("int64")
    return out.sort_values(["direction", "throttle_ms"], ignore_index=True)
