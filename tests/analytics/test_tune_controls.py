"""The proposals for the proxy's operator controls (analytics/propose_controls.py): a bound on
throttles when the capture's decided throttles outlast the clients' request timeout, a shared
bucket for a family of churning generated client ids, and a join_group_rate for a consumer in a
join loop; none of them when the capture shows no need.

A small hand-made capture of 600 s, its statistics computed once on the shared session, and
hand-made statistics for the rules alone. The other side, a capture of stable client ids, short
throttles and no JoinGroup proposing none, is the shared generated capture
(tests/analytics/test_tune.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from analytics.propose import ProposeOptions, propose
from analytics.propose_controls import bound_value, join_rate, nice_down
from analytics.stats import Stats, compute
from analytics.stats_controls import JOIN_STAT_COLUMNS, join_stats, stem
from quota.capture_schema import arrow_schema
from quota.entities import resolve
from quota.group_requests import JOIN_GROUP
from quota.keys import ANONYMOUS, DEFAULT, JOIN_GROUP_RATE, PRODUCER_BYTE_RATE

START_MS = 1_767_225_600_000
SPAN_S = 600
GEN_IDS = [f"gen-{hashlib.sha1(str(i).encode()).hexdigest()[:10]}" for i in range(12)]
GEN_BYTES = 10_000  # each generated id's produce bytes per second
CLIENT = ProposeOptions(default_level="client")
LEVELS = (("user-client", "u"), ("client", ""))
LOOPER = "orders-worker"


def record(
    sec: int, client_id: str, api_key: int, size: int, decided: int = 0, user: str = "svc"
) -> dict[str, Any]:
    """One capture record: a Produce of ``size`` request bytes or a Fetch of ``size`` response bytes."""
    produce = api_key == 0
    return {
        "ts_ms": START_MS + sec * 1000,
        "proxy": "p",
        "node": 1,
        "conn": 1,
        "client_addr": "10.0.0.1:5000",
        "principal": user,
        "client_id": client_id,
        "api_key": api_key,
        "api_version": 9 if produce else 13,
        "request_bytes": size if produce else 80,
        "response_bytes": 60 if produce else size,
        "partitions": [{"topic": "t", "partition": 0, "bytes": size, "records": 1}],
        "producer_ids": [],
        "new_producer_ids": -1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": decided,
        "decided_throttle_ms": decided,
        "broker_throttle_ms": 0,
        "upstream_ms": 1.0,
        "dry_run": False,
    }


def churning() -> list[dict[str, Any]]:
    """A steady service beside 12 generated ids (unauthenticated: no user quota holds them
    together), each producing for 60 s, the next starting 45 s after it (two at once for 15 s);
    a reader throttled 60 s at a time, the service 150 ms."""
    rows = [record(s, "billing", 0, 5_000, decided=150 if s % 6 == 0 else 0) for s in range(SPAN_S)]
    for i, cid in enumerate(GEN_IDS):
        rows += [record(s, cid, 0, GEN_BYTES, user=ANONYMOUS) for s in range(45 * i, 45 * i + 60)]
    rows += [record(s, "slow-reader", 1, 20_000, decided=60_000) for s in range(0, SPAN_S, 30)]
    return rows


def join(ms: int, client_id: str, conn: int) -> dict[str, Any]:
    """A JoinGroup ``ms`` after the capture's start, on connection ``conn`` of proxy p."""
    row = record(0, client_id, JOIN_GROUP, 0)
    row.update(ts_ms=START_MS + ms, conn=conn, api_version=9, request_bytes=300, response_bytes=200)
    row.update(partitions=[])
    return row


def joins() -> list[dict[str, Any]]:
    """A consumer crash-looping from 100 s: 20 starts 5 s apart, each a new connection joining
    twice (as a new member, then with the member id the broker gave it, KIP-394); a healthy
    group of 3 members that join at 10-12 s and rejoin on their connections in a rebalance at
    300 s; a job restarted 10 times, 65 s apart (slower than a loop)."""
    rows = [join(100_000 + 5_000 * i + d, LOOPER, 1_000 + i) for i in range(20) for d in (0, 50)]
    rows += [join(s * 1_000, "billing-consumer", 2_000 + s) for s in (10, 11, 12)]
    rows += [join(300_000 + s, "billing-consumer", 2_000 + s) for s in (10, 11, 12)]
    rows += [join(65_000 * i, "nightly-job", 3_000 + i) for i in range(10)]
    return rows


def write(rows: list[dict[str, Any]], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), directory / "capture.parquet")
    return directory


@pytest.fixture(scope="module")
def churning_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(churning() + joins(), tmp_path_factory.mktemp("churning"))


@pytest.fixture(scope="module")
def churning_stats(spark: Any, churning_dir: Path) -> Stats:
    return compute(spark, spark.read.parquet(str(churning_dir)))


def rows_of(proposal: Any, kind: str) -> pd.DataFrame:
    return proposal.table[proposal.table["kind"] == kind]


def test_generated_suffixes() -> None:
    assert stem("app-7f9c1a") == "app-" and stem("orders-v2-7f9c-3") == "orders-v2-"
    assert stem("app_550e8400-e29b-41d4-a716-446655440000") == "app_"
    assert stem("consumer-1") == "consumer-" and stem("job.2024-01-01") == "job."
    assert stem("billing") == "" and stem("app-cafe") == "" and stem("42") == ""
    assert {stem(c) for c in GEN_IDS} == {"gen-"}


def test_a_churning_family_shares_one_bucket(churning_stats: Stats) -> None:
    fams = churning_stats.tables["client_families"].set_index(["prefix", "direction"])
    gen = fams.loc[("gen-", "produce")]
    assert gen["client_ids"] == 12 and gen["peak_ids"] == 2
    assert gen["median_life_s"] == 60 and gen["active_s"] == 45 * 11 + 60
    assert gen["p99_bps"] == 2 * GEN_BYTES  # two ids at once: the family's rate, not one id's
    assert gen["requests"] == 12 * 60

    proposal = propose(churning_stats, CLIENT)
    assert proposal.config.client_id_prefixes["gen-"].producer_byte_rate == 30_000  # p99 x 1.5
    match = resolve(proposal.config, ANONYMOUS, GEN_IDS[3], PRODUCER_BYTE_RATE)
    assert match is not None and match.via == "prefix:gen-" and match.quota == 30_000
    row = rows_of(proposal, "prefix").set_index("client_id").loc["gen-"]
    assert row["written"] and row["key"] == PRODUCER_BYTE_RATE and row["observed"] == 2 * GEN_BYTES
    assert row["entities"] == 12 and row["seconds"] == 555 and row["requests"] == 720
    assert row["basis"] == "the family's p99 (its ids together) x 1.5"
    assert row["note"].startswith(
        "one bucket for 12 generated client ids, at most 2 at once, median lifetime 60 s"
    )
    assert "client_id_prefixes gen- (producer_byte_rate): one bucket" in proposal.yaml

    # Under a <default> user quota a prefix would never apply: proposed, not written, and why.
    pairs = propose(churning_stats, ProposeOptions())
    assert not pairs.config.client_id_prefixes
    note = rows_of(pairs, "prefix").iloc[0]["note"]
    assert note.startswith("client-id prefixes never apply under a <default> user quota")


def test_long_decided_throttles_propose_a_bound(churning_stats: Stats) -> None:
    times = churning_stats.tables["throttle_times"].set_index(["direction", "throttle_ms"])
    assert times.loc[("fetch", 60_000), "requests"] == 20 and times.loc[("fetch", 60_000), "longest_for"] == 1
    assert times.loc[("produce", 200), "requests"] == 100  # 150 ms, to the 100 ms step above
    proposal = propose(churning_stats, CLIENT)
    assert proposal.config.max_throttle_ms == 20_000  # 30 s request timeout / 1.5
    assert next(iter(proposal.quotas)) == "max_throttle_ms"
    row = rows_of(proposal, "bound").iloc[0]
    assert row["written"] and row["requests"] == 20 and row["entities"] == 1 and row["observed"] == 60_000
    assert row["note"].startswith("16.7% (20) of 120 throttled requests decided over the 30 s request")


def test_short_throttles_propose_no_bound(churning_stats: Stats) -> None:
    """The same capture against clients that wait 120 s: 60 s throttles are no reason for a bound."""
    patient = ProposeOptions(default_level="client", request_timeout_ms=120_000)
    proposal = propose(churning_stats, patient)
    assert proposal.config.max_throttle_ms is None and "max_throttle_ms" not in proposal.quotas
    row = rows_of(proposal, "bound").iloc[0]
    assert not row["written"] and row["note"].startswith("not needed: 0.0% (0) of 120 throttled requests")
    # Too few long throttles to rest a bound on: proposed, not written, and why.
    few = propose(churning_stats, ProposeOptions(min_requests=50))
    assert few.config.max_throttle_ms is None
    assert rows_of(few, "bound").iloc[0]["note"].startswith("only 20 long throttles; at least 50 are needed")
    assert "max_throttle_ms (bound, proxy): only 20 long throttles" in few.yaml


def test_rounding_of_the_bound() -> None:
    assert nice_down(20_000.0) == 20_000 and nice_down(23_076.9) == 23_000 and nice_down(0.5) == 0
    assert bound_value(ProposeOptions(headroom=1.3)) == 23_000
    assert bound_value(ProposeOptions(request_timeout_ms=120_000, headroom=1.0)) == 120_000


def test_a_members_own_override_gives_way_to_the_prefix() -> None:
    """A generated id heavy enough for an override of its own would keep a full bucket beside its
    family's: once the prefix is written, the override is taken back and its row says why."""
    rows = [(level, user, f"c{i}", "produce", 1_000.0) for i in range(30) for level, user in LEVELS]
    rows += [(level, user, "gen-0a1b", "produce", 50_000.0) for level, user in LEVELS]
    rows += [(level, user, "gen-admin", "produce", 1_000.0) for level, user in LEVELS]
    rates = pd.DataFrame(rows, columns=["level", "user", "client_id", "direction", "p99_bps"])
    for c in ("total_bytes", "p50_bps", "p95_bps", "max_bps"):
        rates[c] = 1
    rates["active_s"] = 600
    family = {
        "prefix": "gen-",
        "direction": "produce",
        "client_ids": 8,
        "peak_ids": 2,
        "median_life_s": 40.0,
        "first_s": 0,
        "last_s": 599,
        "requests": 900,
        "active_s": 500,
        "p99_bps": 60_000,
    }
    empty = pd.DataFrame(
        columns=["level", "user", "client_id", "max_window", "peak_rate", "sec", "mutations"]
    )
    stats = Stats(
        {
            "entity_rates": rates,
            "topic_rates": pd.DataFrame(columns=["direction", "topic", "partition_p99_max_bps"]),
            "mutations": empty,
            "mutation_series": empty,
            "producer_ids": pd.DataFrame(columns=["user", "peak_ids_per_s", "max_new_per_hour"]),
            "client_families": pd.DataFrame([family]),
        },
        1000,
        0,
        599,
    )
    alone = propose(stats, ProposeOptions(default_level="client", prefix_min_ids=9)).config
    assert alone.users["u"].clients["gen-0a1b"].producer_byte_rate == 15_000  # capped: 10 x 1,500
    proposal = propose(stats, CLIENT)
    assert "u" not in proposal.config.users and DEFAULT in proposal.config.clients
    assert proposal.config.client_id_prefixes["gen-"].producer_byte_rate == 15_000  # capped too
    rows = proposal.table[
        (proposal.table["client_id"] == "gen-0a1b") & (proposal.table["level"] == "user-client")
    ]
    assert (
        not rows.iloc[0]["written"] and rows.iloc[0]["note"] == "shares the bucket of client_id_prefixes gen-"
    )
    match = resolve(proposal.config, "u", "gen-0a1b", PRODUCER_BYTE_RATE)
    assert match is not None and match.via == "prefix:gen-"
    prefix = proposal.table[proposal.table["kind"] == "prefix"].iloc[0]
    assert prefix["note"].endswith(
        "it would also take in 1 other client id (gen-admin); capped at 10 x the client-id default;"
        " replaces 1 of its ids' own overrides"
    )


def test_a_join_loop_proposes_join_group_rate(churning_stats: Stats) -> None:
    """The looper's 20 connections are 20 new-member joins (its 40 JoinGroups are not); the
    healthy group's rejoins on their connections are no new joins."""
    joined = churning_stats.tables["group_joins"].set_index(["level", "user", "client_id"])
    loop = joined.loc[("user-client", "svc", LOOPER)]
    assert loop["joins"] == 20 and loop["join_requests"] == 40 and loop["span_s"] == 95.0
    assert loop["first_ms"] == START_MS + 100_000 and loop["last_ms"] == START_MS + 195_000
    assert loop["peak_per_min"] == 12 and loop["median_interval_s"] == 5.0
    assert joined.loc[("client", "", LOOPER), "joins"] == 20  # its users together
    healthy = joined.loc[("user-client", "svc", "billing-consumer")]
    assert healthy["joins"] == 3 and healthy["join_requests"] == 6 and healthy["median_interval_s"] == 1.0
    assert joined.loc[("user-client", "svc", "nightly-job"), "median_interval_s"] == 65.0

    proposal = propose(churning_stats, ProposeOptions())  # defaults per (user, client-id): the pair's
    assert proposal.config.users["svc"].clients[LOOPER].join_group_rate == 0.0083
    match = resolve(proposal.config, "svc", LOOPER, JOIN_GROUP_RATE)
    assert match is not None and match.level == 1 and match.bucket == ("svc", LOOPER)
    assert resolve(proposal.config, "svc", "billing-consumer", JOIN_GROUP_RATE) is None
    rows = proposal.table[proposal.table["key"] == JOIN_GROUP_RATE]
    row = rows[rows["written"]].iloc[0]
    assert len(rows[rows["written"]]) == 1 and row["kind"] == "override" and row["level"] == "user-client"
    assert (row["user"], row["client_id"], row["value"], row["observed"]) == ("svc", LOOPER, 0.0083, 12)
    assert (row["requests"], row["seconds"], row["entities"]) == (20, 95, 1)
    assert row["basis"] == (
        "a join loop (10+ new-member joins, median interval at most 60 s): one join per 120 s,"
        " to 2 significant digits"
    )
    assert row["note"] == (
        "join loop: 20 new-member joins (one per connection) from 2026-01-01 00:01:40Z to"
        " 2026-01-01 00:03:15Z (95 s), at most 12 in a minute, median interval 5 s"
    )
    assert f"# join_group_rate 0.0083 (svc/{LOOPER}): join loop: 20 new-member joins" in proposal.yaml
    rest = rows[~rows["written"]].iloc[0]
    assert rest["entities"] == 2 and rest["note"].startswith(
        "no join loop for any other entity (10 or more new-member joins of one entity at a median"
        " interval of at most 60 s): svc/nightly-job: 10 new-member joins"
    )
    assert (
        rest["note"].endswith("at most 3 in a minute, median interval 1 s, fewer than 10 joins")
        and "median interval 65 s, a median interval over 60 s; svc/billing-consumer" in rest["note"]
    )

    # With the defaults at the client level, where a byte-rate override of a client id goes.
    clients = propose(churning_stats, CLIENT).config
    assert clients.clients[LOOPER].join_group_rate == 0.0083
    match = resolve(clients, "svc", LOOPER, JOIN_GROUP_RATE)
    assert match is not None and match.level == 7 and match.bucket == ("", LOOPER)


def joins_of(stats: Stats, keep: pd.DataFrame) -> Stats:
    """The churning capture's statistics with other group joins."""
    return Stats({**stats.tables, "group_joins": keep}, stats.records, stats.start_s, stats.end_s)


def test_no_join_loop_proposes_no_join_group_rate(churning_stats: Stats) -> None:
    """Without the looper, a healthy group (3 joins) and a job restarted slowly: nothing written,
    and the row says why for each; a capture with no JoinGroup says that."""
    joined = churning_stats.tables["group_joins"]
    proposal = propose(joins_of(churning_stats, joined[joined["client_id"] != LOOPER]))
    assert resolve(proposal.config, "svc", LOOPER, JOIN_GROUP_RATE) is None
    assert "join_group_rate" not in proposal.yaml
    rows = proposal.table[proposal.table["key"] == JOIN_GROUP_RATE]
    assert len(rows) == 1 and not rows.iloc[0]["written"] and rows.iloc[0]["entities"] == 2
    note = rows.iloc[0]["note"]
    assert note.startswith("not needed: no join loop (10 or more new-member joins of one entity")
    assert "svc/nightly-job: 10 new-member joins" in note and "svc/billing-consumer: 3" in note
    none = propose(joins_of(churning_stats, joined.iloc[0:0]))
    row = none.table[none.table["key"] == JOIN_GROUP_RATE].iloc[0]
    assert not row["written"] and row["note"].endswith(": no JoinGroup in the capture")


def test_a_loop_slower_than_the_rate_says_so(churning_stats: Stats) -> None:
    """A loop of joins 45 s apart passes a join every 30 s (a --join-every-s below the loop's
    interval): written as the rule says, with a note
    that it would not be held back; one join per 60 s would hold it."""
    ms = START_MS + np.arange(12) * 45_000
    row = dict(zip(JOIN_STAT_COLUMNS, join_stats(ms), strict=True))
    assert row == {
        "joins": 12,
        "first_ms": START_MS,
        "last_ms": START_MS + 495_000,
        "span_s": 495.0,
        "peak_per_min": 2,
        "median_interval_s": 45.0,
    }
    slow = pd.DataFrame(
        [{"level": "user-client", "user": "svc", "client_id": "slow", "join_requests": 12, **row}]
    )
    hasty = ProposeOptions(join_every_s=30)
    note = propose(joins_of(churning_stats, slow), hasty).table.set_index("client_id").loc["slow", "note"]
    assert note.endswith(
        "; at its median interval the rate would not hold it back (a join every 30.3 s passes):"
        " a --join-every-s over 45 would"
    )
    patient = propose(joins_of(churning_stats, slow), ProposeOptions(join_every_s=60))
    assert patient.config.users["svc"].clients["slow"].join_group_rate == 0.017
    assert "would not hold" not in patient.table.set_index("client_id").loc["slow", "note"]


def test_rounding_of_the_join_rate() -> None:
    assert join_rate(ProposeOptions()) == 0.0083 and join_rate(ProposeOptions(join_every_s=20)) == 0.05
    assert join_rate(ProposeOptions(join_every_s=45)) == 0.022
    with pytest.raises(ValueError, match="join-loop-min"):
        ProposeOptions(join_loop_min=1)
    with pytest.raises(ValueError, match="join-every-s"):
        ProposeOptions(join_every_s=0)


def test_the_proxy_loads_the_controls(churning_stats: Stats, tmp_path: Path) -> None:
    """quotas.yaml with the controls and a join rate loads with the proxy's own loader; the
    report says them."""
    from analytics.report import write_report
    from proxy.config import load_config

    proposal = propose(churning_stats, CLIENT)
    doc = yaml.safe_load(proposal.yaml)
    assert doc["quotas"]["max_throttle_ms"] == 20_000
    assert doc["quotas"]["client_id_prefixes"] == {"gen-": {"producer_byte_rate": 30_000}}
    assert doc["quotas"]["clients"][LOOPER] == {"join_group_rate": 0.0083}
    (tmp_path / "quotas.yaml").write_text(proposal.yaml)
    (tmp_path / "kthrottle.yaml").write_text(
        "gateway: {upstream_bootstrap: ['127.0.0.1:9092']}\nquotas_file: quotas.yaml\n"
    )
    assert load_config(tmp_path / "kthrottle.yaml").quotas == proposal.config
    names = ("client_families", "throttle_times", "group_joins")
    tables = {"proposal": proposal.table, **{n: churning_stats.tables[n] for n in names}}
    write_report(tmp_path / "report.html", tables, proposal.yaml, {})
    html = (tmp_path / "report.html").read_text()
    assert "client ids starting gen- (one bucket together)" in html
    assert "longest throttle (max_throttle_ms)" in html and "20.0 s (20,000)" in html
    assert "Operator controls" in html and "16.7% (20) of 120 throttled requests" in html
    assert "Join loops (join_group_rate)" in html and "new-member joins" in html
    assert f"{LOOPER} join_group_rate 0.0083 /s (a join every 2.0 min), written: join loop: 20" in html
