"""Each step of the Spark replay on its own, on a few rows: the input it reads, the pruning, the
partitions' pruning, the units and the worker's function (analytics/replay_*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analytics.replay_frames import entity_seconds, partition_seconds, replay_input, to_pandas
from analytics.replay_partitions import partition_bounds
from analytics.replay_prune import (
    Pruned,
    ReplaySetup,
    SlotTable,
    client_bounds,
    client_results,
    find_entities,
    slot_table,
)
from analytics.replay_units import _UnionFind, effective_figures, plan_units
from analytics.replay_worker import (
    OUT_FIELDS,
    REC_EFFECTIVE,
    REC_STAT,
    REC_THROTTLED,
    UNIT_PRODUCE_CLIENT,
    Unit,
    UnitJob,
    replay_unit,
)
from analytics.replayer import FETCH, PRODUCE, TOPIC_PRODUCER, replay_rows
from quota.config import QuotaConfig
from quota.keys import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE
from quota.plain_config import plain
from tests.analytics.test_replay import STRICT, T0, part, row, to_frame

CFG = QuotaConfig.model_validate(
    {
        "clients": {"hot": {"producer_byte_rate": 1_000}, "cold": {"producer_byte_rate": 1_000_000}},
        "topics": {"orders": {"producer.byte.rate": 2_000}},
    }
)


def setup_of(cfg: QuotaConfig = CFG) -> ReplaySetup:
    return ReplaySetup.of(cfg, None, STRICT, None, refine_below=1.5, row_cost=80)


def few_rows() -> list[dict[str, Any]]:
    """Ten seconds: 'hot' sends 5 KB/s into orders-0 (over both quotas), 'cold' 100 B/s, a
    metadata request (not replayed) and a fetch answered 300 ms after it was sent."""
    rows = []
    for i in range(10):
        rows.append(
            row(T0 + i * 1000, "u", "hot", request_bytes=5_000, partitions=[part("orders", 0, 5_000)])
        )
        rows.append(
            row(T0 + i * 1000 + 10, "u", "cold", request_bytes=100, partitions=[part("logs", 0, 100)])
        )
    rows.append(row(T0 + 500, "u", "cold", api=3))
    rows.append(row(T0 + 700, "u", "cold", api=1, response_bytes=10, upstream_ms=300.0))
    return rows


@pytest.fixture(scope="module")
def frame(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return to_frame(spark, few_rows(), tmp_path_factory.mktemp("replay-steps"))


def test_the_input_is_the_replayed_rows_at_their_charge_time(frame: Any) -> None:
    """Step 1: only api keys the replay decides, a fetch at its response, slots of the bound."""
    rows = replay_input(frame, 500.0, mutations_active=False)
    got = to_pandas(rows.base.select("client_id", "api", "t", rows.slot_col)).sort_values("t")
    assert 3 not in set(got["api"])
    fetch = got[got["api"] == FETCH].iloc[0]
    assert fetch["t"] == T0 + 700 + 300.0
    assert fetch["slot"] == (T0 + 1000) // 500


def test_the_statistics_seconds_take_the_slot_tables_shape() -> None:
    """The statistics' per-second sums become the per-slot tables the bound reads (no Spark)."""
    entities = pd.DataFrame(
        {
            "principal": ["u", "u"],
            "client_id": ["a", "b"],
            "sec": [10, 11],
            "produce_requests": [3, 0],
            "produce_bytes": [300, 0],
            "pid_requests": [1, 0],
            "pid_ids": [2, 0],
            "fetch_requests": [0, 4],
            "fetch_bytes": [0, 40],
            "fetch_shift_ms": [None, 250.0],
            "init_pid_requests": [0, 0],
        }
    )
    table = entity_seconds(entities)
    assert table[["client_id", "api", "slot", "n", "bytes", "pid_ids", "shift"]].values.tolist() == [
        ["a", PRODUCE, 10, 3, 300, 2, 0],
        ["b", FETCH, 11, 4, 40, 0, 250.0],
    ]
    partitions = pd.DataFrame(
        {"topic": ["orders", "logs"], "partition": [0, 0], "sec": [10, 10], "produce_n": [2, 5]}
        | {"produce_bytes": [20, 50], "fetch_n": [0, 0], "fetch_bytes": [0, 0], "fetch_shift_ms": [0, 0]}
    )
    setup = setup_of()
    parts = partition_seconds(partitions, setup.produce, setup.fetch)
    assert parts[["api", "topic", "n", "bytes"]].values.tolist() == [[PRODUCE, "orders", 2, 20]]


def test_pruning_keeps_the_cold_counts_and_finds_the_hot_client(frame: Any) -> None:
    """Steps 2-3: entities to buckets by the quota classes, counts for all, hot only when over."""
    setup = setup_of()
    rows = replay_input(frame, setup.slot, setup.mutations_active)
    by_slot = slot_table(rows, setup, None)
    ents, entity_of = find_entities(by_slot, setup)
    assert sorted(ents.pairs) == [("u", "cold"), ("u", "hot")]
    pruned = Pruned(total_requests=int(by_slot["n"].sum()))
    client_results(ents, client_bounds(SlotTable(by_slot, setup.slot, entity_of), ents, setup), pruned)
    assert pruned.total_requests == 21
    hot = {ents.buckets.keys[bucket] for bucket in pruned.hot_clients}
    assert hot == {(PRODUCER_BYTE_RATE, "", "hot", "", -1)}
    cold = pruned.results[(PRODUCER_BYTE_RATE, "", "cold", "", -1)]
    assert (cold["requests"], cold["throttled_requests"]) == (10, 0)
    assert (CONSUMER_BYTE_RATE, "", "cold", "", -1) not in pruned.results  # no fetch quota


def test_partition_pruning_finds_the_hot_partition(frame: Any) -> None:
    """Step 4: only partitions of topics with a quota; orders-0 at 5 KB/s is over its 2 KB/s."""
    setup = setup_of()
    pruned = Pruned(total_requests=21)
    assert partition_bounds(replay_input(frame, setup.slot, False), setup, None, pruned)
    assert pruned.hot_parts[PRODUCE] == {("orders", 0)}
    assert pruned.results[(TOPIC_PRODUCER, "", "", "orders", 0)]["requests"] == 10
    assert not partition_bounds(replay_input(frame, setup.slot, False), setup_of(QuotaConfig()), None, pruned)


def test_units_one_per_hot_bucket_fetches_linked_together(spark: Any, tmp_path: Path) -> None:
    """Step 5: a hot produce client and a hot produce partition are units of their own; fetch
    buckets that share a hot partition are one unit, keeping both buckets' figures."""
    cfg = QuotaConfig.model_validate(
        {"clients": {"r1": {"consumer_byte_rate": 10}}, "topics": {"t": {"consumer.byte.rate": 10}}}
    )
    rows_in = [row(T0 + i, "u", c, api=1, partitions=[part("t", 0, 100)]) for i, c in enumerate(["r1", "r2"])]
    setup = setup_of(cfg)
    rows = replay_input(to_frame(spark, rows_in, tmp_path), setup.slot, False)
    ents, _ = find_entities(slot_table(rows, setup, None), setup)
    pruned = Pruned(total_requests=2)
    r1 = ents.bucket_of[FETCH][ents.pairs.index(("u", "r1"))]
    pruned.hot_clients = {(FETCH, int(r1))}
    pruned.hot_parts[FETCH] = {("t", 0)}
    plan = plan_units(spark, rows, setup, ents, pruned)
    assert len(plan.units) == 1 and plan.mu is None
    (unit,) = plan.units.values()
    assert unit.keep == {(CONSUMER_BYTE_RATE, "", "r1", "", -1), ("topic_consumer", "", "", "t", 0)}
    uf = _UnionFind()
    uf.union(1, 2)
    assert uf.find(1) == uf.find(2) != uf.find(3)


def test_the_workers_function_replays_one_unit_as_replay_rows_does() -> None:
    """Step 6, in a worker: one produce client's rows through the Replayer, no Spark needed."""
    rows_in = [r for r in few_rows() if r["client_id"] == "hot"]
    pdf = pd.DataFrame(
        {
            "row_id": range(len(rows_in)),
            "t": [float(r["ts_ms"]) for r in rows_in],
            "api_key": PRODUCE,
            "api_version": 9,
            "size": [r["request_bytes"] for r in rows_in],
            "bucket": 0,
            "shared": [i % 2 == 0 for i in range(len(rows_in))],
            "parts": [None] * len(rows_in),
            "ids": [None] * len(rows_in),
            "user": None,
            "client_id": None,
            "unit": 0,
        }
    )
    job = UnitJob(plain(CFG), {0: Unit(UNIT_PRODUCE_CLIENT, "u", "hot")}, {}, True, STRICT)
    out = replay_unit(job, pdf)
    assert list(out.columns) == OUT_FIELDS
    (stat,) = out[out["rec"] == REC_STAT].to_dict("records")
    (expected,) = [
        r for r in replay_rows(rows_in, CFG, strict_from=STRICT) if r["quota"] == PRODUCER_BYTE_RATE
    ]
    for column in ("requests", "throttled_requests", "throttle_ms_total", "max_throttle_ms"):
        assert stat[column] == expected[column]
    throttled = out[out["rec"] == REC_THROTTLED]
    alone = out[out["rec"] == REC_EFFECTIVE]
    assert len(throttled) + int(alone["effective_throttled_requests"].sum()) == expected["throttled_requests"]


def test_effective_figures_take_each_requests_largest_throttle() -> None:
    """The merge: a request two units throttled counts once, at the larger of its throttles."""
    out = pd.DataFrame.from_records(
        [
            {"rec": REC_THROTTLED, "row_id": 7, "direction": PRODUCE, "bucket": 0, "max_throttle_ms": 30},
            {"rec": REC_THROTTLED, "row_id": 7, "direction": PRODUCE, "bucket": 0, "max_throttle_ms": 50},
            {
                "rec": REC_EFFECTIVE,
                "direction": PRODUCE,
                "bucket": 0,
                "effective_throttled_requests": 2,
                "effective_throttle_ms_total": 20,
                "effective_max_throttle_ms": 15,
            },
        ],
        columns=OUT_FIELDS,
    )
    setup = setup_of()
    by_slot = pd.DataFrame(
        {"principal": ["u"], "client_id": ["hot"], "api": [PRODUCE], "slot": [0], "n": [1], "bytes": [1]}
        | {"pid_n": [0], "pid_ids": [0], "shift": [0.0]}
    )
    ents, _ = find_entities(by_slot, setup)
    key = (PRODUCER_BYTE_RATE, "", "hot", "", -1)
    assert effective_figures(out, ents.buckets) == {key: (3, 70, 50)}
