"""What runs in Spark's Python workers: one unit of buckets replayed from its own rows.

Why a module of its own: this is the only replay code that leaves the driver (``applyInPandas``
pickles ``replay_unit`` with its ``UnitJob``), so it may import only the standard library, pandas
and the packages analytics/shipping.py ships; the config arrives as ``quota/plain_config.py``'s
plain attributes. Each unit's rows go through the same ``Replayer`` as ``replay_rows``.

Out of a unit come records of three kinds (``rec``): a bucket's own figures (``REC_STAT``), the
figures of requests no other unit saw, summed per client bucket (``REC_EFFECTIVE``), and each
throttled request other units saw too (``REC_THROTTLED``), so the driver can take the largest
throttle per request (analytics/replay_units.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from analytics.replayer import (
    INIT_PRODUCER_ID,
    TOPIC_PRODUCER,
    Key,
    Replayer,
    partition_usages,
    producer_ids_of,
)
from quota.keys import PRODUCER_BYTE_RATE
from quota.manager import PartitionUsage

if TYPE_CHECKING:
    import pandas as pd

UNIT_PRODUCE_CLIENT, UNIT_PRODUCE_PARTITION, UNIT_FETCH, UNIT_PIDS, UNIT_MUTATIONS = range(5)
REC_STAT, REC_THROTTLED, REC_EFFECTIVE = 0, 1, 2
OUT_SCHEMA = (
    "rec int, quota string, user string, client_id string, topic string, partition int, level int, "
    "quota_value double, requests long, throttled_requests long, throttle_ms_total long, "
    "max_throttle_ms long, rejected_mutations long, effective_throttled_requests long, "
    "effective_throttle_ms_total long, effective_max_throttle_ms long, row_id long, direction int, "
    "bucket long"
)
OUT_FIELDS = [f.split()[0] for f in OUT_SCHEMA.split(", ")]
EFFECTIVE = ("effective_throttled_requests", "effective_throttle_ms_total", "effective_max_throttle_ms")

Shared = list[tuple[int, int, int, int]]  # row id, direction, client bucket, throttle ms
Alone = dict[tuple[int, int], list[int]]  # (direction, client bucket) -> count, total, max


@dataclass(frozen=True, slots=True)
class Unit:
    """Buckets replayed together, from their own rows only."""

    kind: int
    user: str = ""  # an entity of the bucket (produce client), or the user (producer ids)
    client_id: str = ""
    topic: str = ""  # produce partition
    partition: int = -1
    keep: frozenset[Key] = frozenset()  # fetch: the buckets whose figures come from this unit


@dataclass(frozen=True)
class UnitJob:
    """What every unit's replay needs, pickled once with ``replay_unit`` to the workers."""

    cfg: Any  # the proposal as quota.plain_config's plain attributes (executors have no pydantic)
    units: Mapping[int, Unit]
    fetch_reps: Mapping[int, tuple[str, str]]  # fetch bucket id -> an entity of it
    enforce: bool
    strict_from: Mapping[int, int]


def replay_unit(job: UnitJob, pdf: pd.DataFrame) -> pd.DataFrame:
    """The per-unit function of the Spark replay (``functools.partial(replay_unit, job)``).

    Emits the unit's bucket results, and each request it throttled (row id, the client bucket of
    the request, the throttle) so the driver can take the largest per request.
    """
    import pandas as pd

    pdf = pdf.sort_values(["t", "row_id"], kind="stable")
    unit = job.units[int(pdf["unit"].iloc[0])]
    replayer = Replayer(job.cfg, float(pdf["t"].iloc[0]), job.enforce, job.strict_from)
    shared, alone = _feed(replayer, unit, job.fetch_reps, pdf)
    return pd.DataFrame.from_records(_records(replayer, unit, shared, alone), columns=OUT_FIELDS)


def _feed(
    replayer: Replayer, unit: Unit, fetch_reps: Mapping[int, tuple[str, str]], pdf: pd.DataFrame
) -> tuple[Shared, Alone]:
    """The unit's rows, in time order, through the replayer; the throttles of client requests."""
    shared_rows: Shared = []  # requests other units throttle too
    alone: Alone = {}
    cols = [pdf[c].tolist() for c in ("row_id", "t", "api_key", "api_version", "size", "bucket", "shared")]
    parts, ids = pdf["parts"].tolist(), pdf["ids"].tolist()
    users, clients = pdf["user"].tolist(), pdf["client_id"].tolist()
    kind = unit.kind
    for k, (row_id, t, api, version, size, bucket, shared) in enumerate(zip(*cols, strict=True)):
        if kind == UNIT_PRODUCE_CLIENT:
            ms = replayer.produce_request(unit.user, unit.client_id, size, [], [], t)
        elif kind == UNIT_PRODUCE_PARTITION:
            usage = [PartitionUsage(unit.topic, unit.partition, size)]
            ms = replayer.produce_request("", "", 0, usage, [], t)  # 0 bytes: the client never throttles
        elif kind == UNIT_FETCH:
            user, client_id = fetch_reps[bucket]
            ms = replayer.fetch_response(user, client_id, size, partition_usages(parts[k]), t)
        elif kind == UNIT_PIDS:
            if api == INIT_PRODUCER_ID:
                replayer.init_producer_id(unit.user, t)
                continue
            ms = replayer.producer_ids(unit.user, producer_ids_of(ids[k]), t)
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
    return shared_rows, alone


def _keeps(unit: Unit, key: Key) -> bool:
    """Whether a bucket's figures come from this unit (a unit also touches buckets it does not own)."""
    if unit.kind == UNIT_PRODUCE_CLIENT:
        return key[0] == PRODUCER_BYTE_RATE
    if unit.kind == UNIT_PRODUCE_PARTITION:
        return key[0] == TOPIC_PRODUCER
    if unit.kind == UNIT_FETCH:
        return key in unit.keep
    return True


def _records(replayer: Replayer, unit: Unit, shared: Shared, alone: Alone) -> list[dict[str, Any]]:
    """The unit's output rows (``OUT_SCHEMA``): bucket figures, then the client throttles."""
    records = [{**r, "rec": REC_STAT} for r in replayer.results(partial(_keeps, unit))]
    records += [
        {
            "rec": REC_EFFECTIVE,
            "direction": d,
            "bucket": b,
            **dict(zip(EFFECTIVE, figures, strict=True)),
        }
        for (d, b), figures in alone.items()
    ]
    records += [
        {"rec": REC_THROTTLED, "row_id": r, "direction": d, "bucket": b, "max_throttle_ms": ms}
        for r, d, b, ms in shared
    ]
    return records
