"""The replay decides as the proxy's quota classes do, row by row, and Spark agrees with it."""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.replay import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
    RESULT_COLUMNS,
    TOPIC_CONSUMER,
    TOPIC_PRODUCER,
    rate_bound,
    replay_requests,
    replay_rows,
    shifted_rate_bound,
    sliding_peaks,
)
from quota.capture_schema import FIELD_NAMES
from quota.config import QuotaConfig
from quota.manager import ByteRateQuotas, PartitionUsage
from quota.mutations import MutationQuotas
from quota.producer_ids import ProducerIdQuotas
from quota.rate import QuotaWindow
from tests.tools import unavailable

T0 = 1_700_000_000_000
STRICT = {19: 6, 37: 3, 20: 5}
TOPIC_ID = "0123456789abcdef0123456789abcdef"


def row(ts: float, user: str, client: str, api: int = 0, **fields: Any) -> dict[str, Any]:
    """A capture row with the schema's names; what a test does not set is neutral."""
    out: dict[str, Any] = {
        "ts_ms": int(ts),
        "proxy": "p",
        "node": -1,
        "conn": 1,
        "client_addr": "127.0.0.1:1",
        "principal": user,
        "client_id": client,
        "api_key": api,
        "api_version": 9 if api in (0, 1) else 7,
        "request_bytes": 100,
        "response_bytes": 50,
        "partitions": [],
        "producer_ids": [],
        "new_producer_ids": -1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": 0,
        "decided_throttle_ms": 0,
        "broker_throttle_ms": 0,
        "upstream_ms": 2.0,
        "dry_run": False,
    }
    out.update(fields)
    assert set(out) == set(FIELD_NAMES)
    return out


def part(topic: str, partition: int, size: int) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "bytes": size, "records": 1}


def by_key(results: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {(r["quota"], r["user"], r["client_id"], r["topic"], r["partition"]): r for r in results}


# --- replay_rows against the quota classes ----------------------------------------------------------


def test_worked_example_2100_ms() -> None:
    """quota 500 B/s, ten 400 B requests a second apart, then 2300 B half a second later: 6300 B
    over a 10.5 s window is 600 B/s, (600 - 500) / 500 * 10500 = 2100 ms: Kafka's formula
    (``produce_shaping: kafka``); the default's token bucket still holds its burst here."""
    steady = QuotaConfig.model_validate({"clients": {"app": {"producer_byte_rate": 500}}})
    cfg = QuotaConfig.model_validate(
        {"produce_shaping": "kafka", "clients": {"app": {"producer_byte_rate": 500}}}
    )
    rows = [row(T0 + i * 1000, "u", "app", request_bytes=400) for i in range(10)]
    rows.append(row(T0 + 9500, "u", "app", request_bytes=2300))
    decided = replay_requests(rows, cfg, strict_from=STRICT)
    assert [d["throttle_ms"] for d in decided] == [0] * 10 + [2100]
    assert [d["throttle_ms"] for d in replay_requests(rows, steady, strict_from=STRICT)] == [0] * 11
    (result,) = replay_rows(rows, cfg, strict_from=STRICT)
    assert result["quota"] == PRODUCER_BYTE_RATE and (result["user"], result["client_id"]) == ("", "app")
    assert (result["level"], result["quota_value"], result["requests"]) == (7, 500.0, 11)
    assert (result["throttled_requests"], result["throttle_ms_total"], result["max_throttle_ms"]) == (
        1,
        2100,
        2100,
    )
    assert set(result) == set(RESULT_COLUMNS)


def test_produce_row_by_row_matches_byte_rate_quotas() -> None:
    """The same sequence fed straight to ByteRateQuotas gives the same throttle for every request,
    client and topic quota together (the request's throttle is the larger)."""
    cfg = QuotaConfig.model_validate(
        {
            "users": {
                "alice": {"producer_byte_rate": 3000, "clients": {"fast": {"producer_byte_rate": 900}}}
            },
            "topics": {"orders": {"producer.byte.rate": 1500}},
        }
    )
    rng = random.Random(7)
    rows = []
    for i in range(400):
        client = rng.choice(["fast", "slow", "other"])
        parts = [part("orders", rng.randrange(2), rng.randrange(100, 900)), part("logs", 0, 50)]
        rows.append(
            row(
                T0 + i * 37 + rng.randrange(30),
                "alice",
                client,
                request_bytes=rng.randrange(200, 1500),
                partitions=parts,
            )
        )
    q = ByteRateQuotas(cfg, produce=True, now_ms=rows[0]["ts_ms"])
    expected = []
    for r in sorted(rows, key=lambda r: r["ts_ms"]):
        usages = [PartitionUsage(p["topic"], p["partition"], p["bytes"]) for p in r["partitions"]]
        expected.append(
            q.record(r["principal"], r["client_id"], r["request_bytes"], usages, r["ts_ms"]).throttle_ms
        )
    decided = sorted(replay_requests(rows, cfg, strict_from=STRICT), key=lambda d: (d["t_ms"], d["index"]))
    assert [d["throttle_ms"] for d in decided] == expected
    assert sum(1 for ms in expected if ms) > 20  # the test throttles something
    results = by_key(replay_rows(rows, cfg, strict_from=STRICT))
    assert results[(PRODUCER_BYTE_RATE, "alice", "fast", "", -1)]["level"] == 1
    assert results[(PRODUCER_BYTE_RATE, "alice", "", "", -1)]["level"] == 3  # slow and other share it
    assert results[(TOPIC_PRODUCER, "", "", "orders", 0)]["throttled_requests"] > 0
    assert (TOPIC_PRODUCER, "", "", "logs", 0) not in results


def test_fetch_throttled_bytes_are_taken_back_unless_dry_run() -> None:
    """With Kafka's fetch behaviour, a throttled fetch is answered empty: its bytes come off the
    rate, so the next fetch sees a lower rate than in dry-run, where the proxy keeps them."""
    cfg = QuotaConfig.model_validate(
        {"fetch_shaping": "kafka", "clients": {"c": {"consumer_byte_rate": 1000}}}
    )
    rows = [row(T0 + i * 100, "u", "c", api=1, response_bytes=2000, upstream_ms=0.0) for i in range(30)]

    def live(dry_run: bool) -> list[int]:
        q = ByteRateQuotas(cfg, produce=False, now_ms=T0)
        out = []
        for r in rows:
            d = q.record("u", "c", 2000, [], r["ts_ms"])
            if d.throttle_ms and not dry_run:
                q.unrecord(d, 2000, [], r["ts_ms"])
            out.append(d.throttle_ms)
        return out

    enforced = [d["throttle_ms"] for d in replay_requests(rows, cfg, strict_from=STRICT)]
    dry = [
        d["throttle_ms"]
        for d in replay_requests(rows, cfg.model_copy(update={"dry_run": True}), strict_from=STRICT)
    ]
    assert enforced == live(False)
    assert dry == live(True)
    assert sum(dry) > sum(enforced) > 0
    # enforce overrides the config's dry_run either way
    assert [d["throttle_ms"] for d in replay_requests(rows, cfg, enforce=False, strict_from=STRICT)] == dry


def test_a_fetch_shaped_to_the_quota_keeps_its_bytes() -> None:
    """With steady fetch shaping (the default) a throttled fetch is delivered with its throttle:
    the replay keeps its bytes, as the proxy does, and decides the shaper's throttle."""
    cfg = QuotaConfig.model_validate({"clients": {"c": {"consumer_byte_rate": 1000}}})
    rows = [row(T0 + i * 100, "u", "c", api=1, response_bytes=2000, upstream_ms=0.0) for i in range(30)]
    q = ByteRateQuotas(cfg, produce=False, now_ms=T0)
    live = [q.record("u", "c", 2000, [], r["ts_ms"]).throttle_ms for r in rows]
    assert [d["throttle_ms"] for d in replay_requests(rows, cfg, strict_from=STRICT)] == live
    assert sum(live) > 0


def test_fetch_is_charged_at_its_response() -> None:
    """The proxy charges a fetch when the response comes back: ts_ms + upstream_ms."""
    cfg = QuotaConfig.model_validate({"clients": {"c": {"consumer_byte_rate": 1000}}})
    rows = [row(T0, "u", "c", api=1, response_bytes=20_000, upstream_ms=500.0)]
    (decided,) = replay_requests(rows, cfg, strict_from=STRICT)
    assert decided["t_ms"] == T0 + 500.0


def test_topic_ids_are_not_charged_to_topic_quotas() -> None:
    cfg = QuotaConfig.model_validate({"topics": {"<default>": {"consumer.byte.rate": 10}}})
    rows = [
        row(T0 + i, "u", "c", api=1, partitions=[part(TOPIC_ID, 0, 5000), part("t", 0, 5000)])
        for i in range(3)
    ]
    results = by_key(replay_rows(rows, cfg, strict_from=STRICT))
    assert (TOPIC_CONSUMER, "", "", "t", 0) in results
    assert not any(k[3] == TOPIC_ID for k in results)


def test_mutations_strict_and_permissive() -> None:
    """A strict request is refused once the bucket is below zero; a permissive one is charged and
    throttled; each row is one topic of its total cost, decided by MutationQuotas.admit."""
    cfg = QuotaConfig.model_validate({"users": {"admin": {"controller_mutation_rate": 1}}})
    rows = [row(T0 + i * 100, "admin", "tool", api=19, api_version=7, mutations=6) for i in range(4)]
    rows += [row(T0 + 1000 + i * 100, "admin", "old", api=19, api_version=5, mutations=6) for i in range(2)]
    q = MutationQuotas(cfg, T0)
    expected = [q.admit("admin", r["client_id"], [6], r["api_version"] >= 6, r["ts_ms"]) for r in rows]
    decided = replay_requests(rows, cfg, strict_from=STRICT)
    assert [d["throttle_ms"] for d in decided] == [a.throttle_ms for a in expected]
    (result,) = replay_rows(rows, cfg, strict_from=STRICT)
    assert result["quota"] == CONTROLLER_MUTATION_RATE and result["user"] == "admin"
    assert result["rejected_mutations"] == 6 * sum(a.rejected for a in expected) > 0
    assert result["throttled_requests"] == sum(1 for a in expected if a.throttle_ms)


def test_producer_ids_per_user_and_init_producer_id() -> None:
    cfg = QuotaConfig.model_validate(
        {
            "users": {"<default>": {"producer_ids_rate": 0.5}},
            "producer_ids": {"window": {"num": 3, "size_seconds": 10}},
        }
    )
    rows = [row(T0 + i * 200, "storm", f"c{i % 3}", producer_ids=[1000 + i]) for i in range(60)]
    rows += [row(T0 + i * 200, "calm", "c", producer_ids=[7]) for i in range(60)]
    rows.append(row(T0 + 12_000, "storm", "c0", api=22, upstream_ms=1.0))
    results = by_key(replay_rows(rows, cfg, strict_from=STRICT))
    storm = results[(PRODUCER_IDS_RATE, "storm", "", "", -1)]
    assert storm["level"] == 6 and storm["requests"] == 61 and storm["throttled_requests"] > 40
    assert results[(PRODUCER_IDS_RATE, "calm", "", "", -1)]["throttled_requests"] == 0
    # the produce buckets have no quota, but the requests were throttled: listed with effective figures
    eff = [r for k, r in results.items() if k[0] == PRODUCER_BYTE_RATE]
    assert eff and all(r["quota_value"] is None for r in eff)
    assert sum(r["effective_throttled_requests"] for r in eff) == storm["throttled_requests"] - 1


# --- the pruning bound ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_pruning_bound_never_below_what_the_replay_measures(seed: int) -> None:
    """Random traffic around the quota, in windows of several shapes: the rate bound the pruning
    uses is never below a rate the quota classes measure, at any slot size, so a bucket the
    replay would throttle is never pruned (and whenever it throttles, the bound is over quota)."""
    rng = random.Random(seed)
    num = rng.choice([1, 2, 3, 11])
    size = rng.choice([250.0, 1000.0, 1300.0])
    window = QuotaWindow(num, size)
    rows, t = [], float(T0)
    for _ in range(rng.randrange(20, 300)):
        t += rng.expovariate(1 / rng.choice([5, 50, 400, 3000]))
        rows.append(row(t, "u", "c", request_bytes=int(rng.expovariate(1 / rng.choice([50, 200, 600])))))
    # The highest rate ByteRateQuotas measures over the sequence (and what it throttles at 1000 B/s).
    quota = 1000.0
    cfg = QuotaConfig.model_validate(
        {"window": {"num": num, "size_seconds": size / 1000}, "clients": {"c": {"producer_byte_rate": quota}}}
    )
    q = ByteRateQuotas(cfg, produce=True, now_ms=T0)
    measured = []
    for r in rows:
        d = q.record("u", "c", r["request_bytes"], [], r["ts_ms"])
        measured.append(d.client_rate)
    throttled = replay_rows(rows, cfg, strict_from=STRICT)[0]["throttled_requests"] > 0
    for slot_ms in (size / 2, size / 4, size, size / 3, 7.0, 3 * size):
        slots = [int(r["ts_ms"] // slot_ms) for r in rows]
        for steps in (1, 8):
            (bound,) = rate_bound(
                [0] * len(rows), slots, [r["request_bytes"] for r in rows], window, slot_ms, steps
            ).values()
            assert bound >= max(measured) - 1e-6, (seed, slot_ms, steps)
            if throttled:
                assert bound > quota


@pytest.mark.parametrize("seed", range(30))
def test_shifted_bound_never_below_what_fetches_charged_at_their_response_measure(seed: int) -> None:
    """Fetches slotted by the second they were sent but charged at their response (up to the
    shift later): the shifted bound at 1 s slots is never below what ByteRateQuotas measures."""
    rng = random.Random(seed)
    window = QuotaWindow(rng.choice([2, 11]), rng.choice([500.0, 1000.0]))
    cfg = QuotaConfig.model_validate(
        {
            "window": {"num": window.num, "size_seconds": window.size_ms / 1000},
            "clients": {"c": {"consumer_byte_rate": 1e12}},
        }
    )
    q = ByteRateQuotas(cfg, produce=False, now_ms=T0)
    sent, t, most = [], float(T0), rng.choice([50.0, 500.0, 2500.0])
    for _ in range(rng.randrange(20, 300)):
        t += rng.expovariate(1 / rng.choice([5, 50, 400]))
        sent.append((t, t + rng.random() * most, int(rng.expovariate(1 / 400))))
    measured = max(
        q.record("u", "c", size, [], charged).client_rate
        for _, charged, size in sorted(sent, key=lambda x: x[1])
    )
    slots = [int(ts // 1000) for ts, _, _ in sent]
    shifts = [charged - ts for ts, charged, _ in sent]
    (bound,) = shifted_rate_bound(
        [0] * len(sent), slots, [s for _, _, s in sent], shifts, window, 1000.0
    ).values()
    assert bound >= measured - 1e-6
    # Unshifted, the same bound can be too low: the shift is what makes it sound.
    (plain,) = rate_bound([0] * len(sent), slots, [s for _, _, s in sent], window, 1000.0).values()
    assert plain <= bound


@pytest.mark.parametrize("seed", range(15))
def test_producer_id_bound_never_below_what_the_quota_measures(seed: int) -> None:
    """Distinct ids per half filter window bound the new ids: an id is new at most once in it,
    however the two bloom filters rotate."""
    rng = random.Random(seed)
    size_s, num = rng.choice([(10, 3), (4, 11), (30, 2)])
    cfg = QuotaConfig.model_validate(
        {
            "users": {"u": {"producer_ids_rate": 0.1}},
            "producer_ids": {"window": {"num": num, "size_seconds": size_s}},
        }
    )
    q = ProducerIdQuotas(cfg, T0)
    pool = list(range(rng.randrange(2, 40)))
    t, rates, seen = float(T0), [], []
    for _ in range(rng.randrange(50, 400)):
        t += rng.expovariate(1 / rng.choice([20, 300, 2000, 8000]))
        ids = [
            rng.choice(pool) if rng.random() < 0.7 else rng.randrange(10**6)
            for _ in range(rng.randrange(1, 4))
        ]
        rates.append(q.record("u", ids, t).rate)
        seen += [(t, pid) for pid in set(ids)]
    window = cfg.producer_ids.window.quota_window()
    half = window.size_ms / 2
    distinct: dict[int, set[int]] = {}
    for when, pid in seen:
        distinct.setdefault(int(when // half), set()).add(pid)
    slots = sorted(distinct)
    (bound,) = rate_bound([0] * len(slots), slots, [len(distinct[k]) for k in slots], window, half).values()
    assert bound >= max(rates) - 1e-9


def test_pruning_bound_prunes_steady_traffic_below_the_quota() -> None:
    """Steady traffic at 90% of the quota is pruned with slots of a quarter sample, 85% with half
    a sample (the default), but not at 101%."""
    window = QuotaWindow(11, 1000.0)
    slots = list(range(2000))

    def bound(share: float, slot_ms: float) -> float:
        per_slot = 1000.0 * share * slot_ms / 1000.0
        n = int(2000 * 250 / slot_ms)
        return rate_bound([0] * n, slots[:n], [per_slot] * n, window, slot_ms)[0]

    assert bound(0.90, 250.0) <= 1000.0
    assert bound(0.85, 500.0) <= 1000.0
    assert bound(1.01, 250.0) > 1000.0 and bound(1.01, 500.0) > 1000.0
    assert sliding_peaks([0, 0, 1, 0], [1, 2, 5, 3], [1.0, 2.0, 9.0, 4.0], 2) == {0: 6.0, 1: 9.0}


# --- Spark --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replay_spark(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The shared session when a conftest offers one, else a small local one (left running for
    other modules: getOrCreate would hand them this one)."""
    try:
        yield request.getfixturevalue("spark")
        return
    except pytest.FixtureLookupError:
        pass
    if importlib.util.find_spec("pyspark") is None:
        unavailable("the analytics extra (pyspark) is not installed")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    yield (
        SparkSession.builder.master("local[2]")
        .appName("kthrottle-replay-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )


def synthetic(seed: int = 1) -> list[dict[str, Any]]:
    """A few thousand rows over a minute: entities at every kind of level, some over their quota,
    most not; topic quotas in both directions; producer-id churn; mutations; topic ids."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []

    def stream(
        user: str, client: str, api: int, every_ms: float, size: int, parts: list[str], **kw: Any
    ) -> None:
        t: float = T0 + rng.randrange(1000)
        while t < T0 + 60_000:
            ps = [part(p, rng.randrange(3), rng.randrange(size // 2 + 1)) for p in parts]
            fields = (
                {"request_bytes": rng.randrange(size // 2, size * 3 // 2)}
                if api == 0
                else {
                    "response_bytes": rng.randrange(size // 2, size * 3 // 2),
                    "upstream_ms": rng.random() * 50,
                }
            )
            rows.append(row(t, user, client, api, partitions=ps, **fields, **kw))
            t += rng.expovariate(1 / every_ms)

    stream("alice", "fast", 0, 40, 600, ["orders"])  # (user, client) override, over
    stream("alice", "app", 0, 50, 500, ["logs"])  # alice's user bucket, over at times
    stream("alice", "batch", 0, 200, 300, ["logs"])  # shares it
    stream("bob", "x", 0, 30, 400, ["orders", "logs"])  # <default> user: under; orders partitions over
    stream("carol", "reporter", 1, 40, 700, ["logs"])  # client-id quota, over
    stream("dave", "c1", 1, 50, 800, ["orders"])  # under its own quota, orders partitions over
    stream("erin", "c2", 1, 60, 300, ["orders", TOPIC_ID])  # shares orders partitions with dave
    stream("frank", "c3", 1, 100, 300, ["logs"])  # default client quota, under
    for i in range(300):
        ids = [5000 + i] if i % 2 else [42]
        rows.append(row(T0 + i * 180, "grace", "pids", 0, request_bytes=100, producer_ids=ids))
        rows.append(row(T0 + i * 180 + 5, "bob", "x", 0, request_bytes=100, producer_ids=[77]))
    rows += [row(T0 + i * 3000 + 7, "grace", "pids", 22, upstream_ms=3.0) for i in range(20)]
    rows += [
        row(T0 + i * 700, "admin", f"tool{i % 2}", 19, api_version=5 + i % 3, mutations=rng.randrange(1, 9))
        for i in range(80)
    ]
    rows += [row(T0 + i * 900, "admin", "tool0", 20, api_version=6, mutations=-1) for i in range(5)]
    rows += [row(T0 + i * 500, "bob", "x", 3) for i in range(20)]  # metadata: not replayed
    rng.shuffle(rows)
    return rows


SYNTHETIC_CFG = {
    "users": {
        "alice": {"producer_byte_rate": 12_000, "clients": {"fast": {"producer_byte_rate": 9_000}}},
        "<default>": {"producer_byte_rate": 50_000, "controller_mutation_rate": 3, "producer_ids_rate": 0.05},
        "dave": {"consumer_byte_rate": 40_000},
    },
    "clients": {"reporter": {"consumer_byte_rate": 12_000}, "<default>": {"consumer_byte_rate": 60_000}},
    "topics": {"orders": {"producer.byte.rate": 1_500, "consumer.byte.rate": 1_200}},
    "producer_ids": {"window": {"num": 3, "size_seconds": 10}},
}


def to_frame(spark: Any, rows: list[dict[str, Any]], tmp: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quota.capture_schema import arrow_schema

    schema = arrow_schema()
    assert isinstance(schema, pa.Schema)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp / "capture.parquet")
    return spark.read.parquet(str(tmp))


@pytest.mark.parametrize("dry_run", [False, True])
def test_spark_replay_equals_replay_rows(replay_spark: Any, tmp_path: Path, dry_run: bool) -> None:
    from analytics.replay import replay

    rows = synthetic()
    cfg = QuotaConfig.model_validate({**SYNTHETIC_CFG, "dry_run": dry_run})
    expected = replay_rows(rows, cfg, strict_from=STRICT)
    frame = replay(replay_spark, to_frame(replay_spark, rows, tmp_path), cfg, strict_from=STRICT)
    got = frame.astype(object).where(frame.notna(), None).to_dict("records")
    assert list(frame.columns) == list(RESULT_COLUMNS)
    assert by_key(got) == by_key(expected)
    assert got == expected  # same order too
    kinds = {r["quota"] for r in expected if r["throttled_requests"]}
    assert kinds == {
        PRODUCER_BYTE_RATE,
        CONSUMER_BYTE_RATE,
        TOPIC_PRODUCER,
        TOPIC_CONSUMER,
        PRODUCER_IDS_RATE,
        CONTROLLER_MUTATION_RATE,
    }
    info = frame.attrs["replay"]
    assert info["pruned_buckets"] > 0 and info["hot_buckets"] > 0


@pytest.fixture(scope="module")
def with_seconds(replay_spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    """The synthetic records, as a frame, and their statistics with the per-second tables: the
    same for every replay below (the statistics do not depend on the quotas)."""
    from analytics.stats import StatsOptions, compute

    rows = synthetic()
    frame_in = to_frame(replay_spark, rows, tmp_path_factory.mktemp("with-seconds"))
    stats = compute(replay_spark, frame_in, StatsOptions(keep_seconds=True))
    assert stats.seconds is not None
    assert int(stats.seconds.entities["produce_requests"].sum()) == sum(1 for r in rows if r["api_key"] == 0)
    return rows, frame_in, stats


@pytest.mark.parametrize(("dry_run", "refine_below"), [(False, 1.5), (True, 1.5), (False, 1.0), (False, 1e9)])
def test_spark_replay_pruned_from_the_statistics_seconds_equals_replay_rows(
    replay_spark: Any,
    with_seconds: tuple[Any, Any, Any],
    dry_run: bool,
    refine_below: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the statistics' per-second tables (what ``kthrottle tune`` passes), the coarse bound
    comes from them and the records are read again only for what it cannot prune: the results
    are still exactly those of ``replay_rows``, whether buckets over the coarse bound are all
    looked at finely (1e9), none (1.0) or only those near their quota (the default)."""
    from analytics import replay as replay_module
    from analytics.replay import replay

    monkeypatch.setattr(replay_module, "REFINE_BELOW", refine_below)
    rows, frame_in, stats = with_seconds
    cfg = QuotaConfig.model_validate({**SYNTHETIC_CFG, "dry_run": dry_run})
    frame = replay(replay_spark, frame_in, cfg, strict_from=STRICT, seconds=stats.seconds)
    got = frame.astype(object).where(frame.notna(), None).to_dict("records")
    assert got == replay_rows(rows, cfg, strict_from=STRICT)
    info = frame.attrs["replay"]
    assert info["pruned_buckets"] > 0 and info["hot_buckets"] > 0


def test_spark_replay_with_nothing_over_quota(replay_spark: Any, tmp_path: Path) -> None:
    """Everything pruned: no replay at all, request counts from the aggregates alone."""
    from analytics.replay import replay

    rows = synthetic(2)
    cfg = QuotaConfig.model_validate(
        {
            "users": {"<default>": {"producer_byte_rate": 1e9}},
            "topics": {"<default>": {"consumer.byte.rate": 1e9}},
        }
    )
    frame = replay(replay_spark, to_frame(replay_spark, rows, tmp_path), cfg, strict_from=STRICT)
    assert frame.attrs["replay"]["units"] == 0
    got = frame.astype(object).where(frame.notna(), None).to_dict("records")
    assert got == replay_rows(rows, cfg, strict_from=STRICT)
