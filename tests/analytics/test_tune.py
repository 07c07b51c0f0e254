"""The tuning job end to end on generated traffic: it finds what the generator planted, writes a
config the proxy loads as is, and refuses input it cannot trust without writing anything."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from analytics.generate import GeneratedTruth
from analytics.propose import ProposeOptions, propose, token_backlog
from analytics.session import InputError, check_local, check_remote, local_files
from analytics.stats import Stats
from analytics.tune import MARKER, main
from quota.capture_schema import CAPTURE_VERSION_KEY, arrow_schema
from quota.config import CONFIG_VERSION, QuotaConfig
from quota.entities import resolve
from quota.keys import (
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    TOPIC_CONSUMER_BYTE_RATE,
    TOPIC_PRODUCER_BYTE_RATE,
)

TABLES = (
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
    "proposal",
)


@pytest.fixture(scope="module")
def cfg(report: Path) -> QuotaConfig:
    doc = yaml.safe_load((report / "quotas.yaml").read_text())
    assert list(doc) == ["config_version", "quotas"]
    return QuotaConfig.model_validate(doc["quotas"])


def table(report: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(report / "tables" / name / f"{name}.parquet")


def test_writes_the_report(report: Path, captures: tuple[Path, GeneratedTruth]) -> None:
    for name in TABLES:
        parquet = report / "tables" / name / f"{name}.parquet"
        csv = report / "tables" / name / f"{name}.csv"
        assert parquet.exists() and csv.exists(), name
        assert len(pd.read_csv(csv)) == len(pd.read_parquet(parquet)), name
    meta = json.loads((report / "meta.json").read_text())
    assert meta["records"] == captures[1].records
    assert meta["span_s"] == 600
    text = (report / "quotas.yaml").read_text()
    assert text.startswith("# kthrottle quotas proposed by `kthrottle tune`")
    assert not [p for p in report.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_proxy_loads_the_proposal(report: Path, cfg: QuotaConfig, tmp_path: Path) -> None:
    from proxy.config import load_config

    shutil.copy(report / "quotas.yaml", tmp_path / "quotas.yaml")
    main_cfg = tmp_path / "kthrottle.yaml"
    main_cfg.write_text("gateway: {upstream_bootstrap: ['127.0.0.1:9092']}\nquotas_file: quotas.yaml\n")
    assert load_config(main_cfg).quotas == cfg
    assert yaml.safe_load((report / "quotas.yaml").read_text())["config_version"] == CONFIG_VERSION


def test_heavy_outliers_get_overrides(
    report: Path, cfg: QuotaConfig, captures: tuple[Path, GeneratedTruth]
) -> None:
    truth = captures[1]
    rates = table(report, "entity_rates")
    pairs = rates[rates["level"] == "user-client"].set_index(["user", "client_id", "direction"])
    for key, direction, planted in (
        (PRODUCER_BYTE_RATE, "produce", truth.heavy_producers),
        (CONSUMER_BYTE_RATE, "fetch", truth.heavy_consumers),
    ):
        for user, client_id in planted:
            match = resolve(cfg, user, client_id, key)
            assert match is not None and match.level == 1, (user, client_id, key)  # its own (user, client-id)
            assert match.quota >= pairs.loc[(user, client_id, direction), "p99_bps"]
    for user in truth.heavy_users:  # heavy in total only: a cap on the user
        quota = cfg.users[user].producer_byte_rate
        users = rates[(rates["level"] == "user") & (rates["direction"] == "produce")].set_index("user")
        assert quota is not None and quota >= users.loc[user, "p99_bps"]
    for topic in truth.hot_topics_produce:
        assert cfg.topics[topic].producer_byte_rate is not None, topic
    for topic in truth.hot_topics_fetch:
        assert cfg.topics[topic].consumer_byte_rate is not None, topic
    default_topic = cfg.topics[DEFAULT]
    assert default_topic.producer_byte_rate and default_topic.consumer_byte_rate
    # Aliases as Kafka spells them, in the file itself.
    text = (report / "quotas.yaml").read_text()
    assert TOPIC_PRODUCER_BYTE_RATE in text and TOPIC_CONSUMER_BYTE_RATE in text


def test_steady_clients_are_covered_by_the_default(
    report: Path, cfg: QuotaConfig, captures: tuple[Path, GeneratedTruth]
) -> None:
    truth = captures[1]
    rates = table(report, "entity_rates")
    pairs = rates[rates["level"] == "user-client"]
    default = cfg.users[DEFAULT].clients[DEFAULT]
    checked = 0
    for r in pairs.itertuples():
        if (r.user, r.client_id) not in truth.steady_pairs:
            continue
        key = PRODUCER_BYTE_RATE if r.direction == "produce" else CONSUMER_BYTE_RATE
        match = resolve(cfg, r.user, r.client_id, key)
        assert match is not None and match.level == 5, (r.user, r.client_id, key)  # <default>, <default>
        assert match.quota == default.get(key)
        assert r.p99_bps <= match.quota, (r.user, r.client_id, r.direction)
        assert r.quota_bps == match.quota and r.quota_level == 5
        checked += 1
    assert checked >= len(truth.steady_pairs)
    # At the user level too (that default is reported, and named in the file's header).
    proposal = table(report, "proposal")
    users = rates[(rates["level"] == "user") & rates["user"].isin(truth.steady_users)]
    for direction, key in (("produce", PRODUCER_BYTE_RATE), ("fetch", CONSUMER_BYTE_RATE)):
        row = proposal[
            (proposal["kind"] == "default") & (proposal["level"] == "user") & (proposal["key"] == key)
        ]
        limit = float(row["value"].iloc[0])
        assert (users[users["direction"] == direction]["p99_bps"] <= limit).all()
        assert not row["written"].iloc[0]


def test_storm_user_is_singled_out(
    report: Path, cfg: QuotaConfig, captures: tuple[Path, GeneratedTruth]
) -> None:
    truth = captures[1]
    ids = table(report, "producer_ids")
    assert ids.iloc[0]["user"] == truth.storm_user
    assert ids.iloc[0]["peak_ids_per_s"] > 10 * ids.iloc[1]["peak_ids_per_s"]
    assert bool(ids.iloc[0]["over_quota"])
    assert not ids[ids["user"].isin(truth.steady_users)]["over_quota"].any()
    default = cfg.users[DEFAULT].producer_ids_rate
    assert default is not None and default < ids.iloc[0]["peak_ids_per_s"] / 10
    assert cfg.users.get(truth.storm_user) is None  # no override: the default throttles it
    hourly = table(report, "producer_ids_hourly")
    assert hourly[hourly["user"] == truth.storm_user]["new_ids"].sum() == ids.iloc[0]["new_ids"]


def test_abusive_admin_does_not_set_the_mutation_quota(
    report: Path, cfg: QuotaConfig, captures: tuple[Path, GeneratedTruth]
) -> None:
    truth = captures[1]
    mutations = table(report, "mutations")
    pairs = mutations[mutations["level"] == "user-client"].set_index(["user", "client_id"])
    assert not pairs.loc[truth.abusive_admin, "well_behaved"]
    admins = [p for p in truth.admin_clients if p in pairs.index]
    assert len(admins) >= 3 and pairs.loc[admins, "well_behaved"].all()
    rate = cfg.users[DEFAULT].clients[DEFAULT].controller_mutation_rate
    assert rate is not None
    burst = cfg.controller_window.num * cfg.controller_window.size_seconds * rate
    # The burst admits every well-behaved admin client's observed traffic without a throttle...
    series = table(report, "mutation_series")
    series = series[series["level"] == "user-client"]
    for user, client_id in admins:
        s = series[(series["user"] == user) & (series["client_id"] == client_id)].sort_values("sec")
        assert token_backlog(s["sec"].tolist(), s["mutations"].tolist(), rate) <= burst
    # ... and not the abusive one's,
    assert pairs.loc[truth.abusive_admin, "max_window"] > 5 * burst
    # which has no say in it: were it ten times as abusive, the proposal would be the same.
    meta = json.loads((report / "meta.json").read_text())
    tables = {name: table(report, name) for name in TABLES}
    for name in ("mutations", "mutation_series"):
        t = tables[name].copy()
        abuser = (t["user"] == truth.abusive_admin[0]) | (t["client_id"] == truth.abusive_admin[1])
        cols = ["mutations", "max_window", "max_per_s", "peak_rate"] if name == "mutations" else ["mutations"]
        t.loc[abuser, cols] = t.loc[abuser, cols] * 10
        tables[name] = t
    stats = Stats(tables, meta["records"], meta["start_ms"] // 1000, meta["end_ms"] // 1000 - 1)
    again = propose(stats, ProposeOptions()).config
    assert again.users[DEFAULT].clients[DEFAULT].controller_mutation_rate == rate
    assert again.controller_window == cfg.controller_window
    resolved = resolve(cfg, *truth.abusive_admin, CONTROLLER_MUTATION_RATE)
    assert resolved is not None and resolved.level == 5  # held to the default


def test_stable_ids_and_short_throttles_propose_no_control(report: Path, cfg: QuotaConfig) -> None:
    """The generated capture's client ids stay (reporting-job-0 ... 9 all the while), its
    throttles are short (under 400 ms) and it has no JoinGroup: neither a client-id prefix, nor a
    bound, nor a join rate is written, and the proposal's rows say why
    (analytics/propose_controls.py; the other side: test_tune_controls.py)."""
    assert not cfg.client_id_prefixes and cfg.max_throttle_ms is None
    fams = table(report, "client_families").set_index(["prefix", "direction"])
    family = fams.loc[("reporting-job-", "produce")]
    assert family["client_ids"] == 10 and family["median_life_s"] > 500
    proposal = table(report, "proposal")
    prefix = proposal[proposal["kind"] == "prefix"]
    assert list(prefix["client_id"]) == ["reporting-job-"] and not prefix["written"].any()
    assert prefix.iloc[0]["note"].startswith("its ids stay")
    bound = proposal[proposal["kind"] == "bound"].iloc[0]
    assert not bound["written"] and bound["note"].startswith("not needed: 0.0% (0) of")
    assert 0 < table(report, "throttle_times")["throttle_ms"].max() <= 400
    assert table(report, "group_joins").empty  # no consumer in it: no join rate, and the row says why
    joins = proposal[proposal["key"] == "join_group_rate"]
    assert len(joins) == 1 and not joins.iloc[0]["written"]
    assert joins.iloc[0]["note"].endswith("at most 60 s): no JoinGroup in the capture")


def test_report_tables_make_sense(report: Path, captures: tuple[Path, GeneratedTruth]) -> None:
    truth = captures[1]
    rates = table(report, "entity_rates")
    assert set(rates["level"]) == {"user", "client", "user-client"}
    assert (rates["p50_bps"] <= rates["p95_bps"]).all() and (rates["p95_bps"] <= rates["p99_bps"]).all()
    assert (rates["p99_bps"] <= rates["max_bps"]).all() and (rates["active_s"] <= 600).all()
    throttled = rates.set_index(["level", "user", "client_id", "direction"])
    assert throttled.loc[("user-client", "etl", "etl-bulk-loader", "produce"), "throttle_ms"] > 0
    assert throttled.loc[("user-client", "etl", "etl-bulk-loader", "produce"), "max_burst_s"] >= 1
    series = table(report, "entity_series")
    top = series[(series["level"] == "user-client") & (series["direction"] == "produce")]
    assert ("etl", "etl-bulk-loader") in set(zip(top["user"], top["client_id"], strict=True))
    parts = table(report, "partition_rates")
    topics = table(report, "topic_rates").set_index(["direction", "topic"])
    clickstream = parts[(parts["topic"] == "clickstream") & (parts["direction"] == "produce")]
    assert topics.loc[("produce", "clickstream"), "partitions"] == len(clickstream) == 6
    assert topics.loc[("produce", "clickstream"), "total_bytes"] == clickstream["total_bytes"].sum()
    proposal = table(report, "proposal")
    assert {"default", "override"} <= set(proposal["kind"])
    written = proposal[
        (proposal["kind"] == "override") & proposal["written"] & (proposal["level"] == "user-client")
    ]
    assert set(zip(written["user"], written["client_id"], strict=True)) == {
        *truth.heavy_producers,
        *truth.heavy_consumers,
    }


# --- refused input: exit code 2, nothing written ---------------------------------------------------


def _refused(inp: Path | str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    out = tmp_path / "out"
    assert main(["--input", str(inp), "--output", str(out), "--quiet"]) == 2
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    err = capsys.readouterr().err.strip()
    assert err.startswith("tune: error: ") and "\n" not in err
    return err


def _write(path: Path, table: pa.Table) -> None:
    pq.write_table(table, path)


def _one_file(captures: tuple[Path, GeneratedTruth], into: Path) -> pa.Table:
    into.mkdir(parents=True, exist_ok=True)
    src = captures[1].files[0]
    shutil.copy(src, into / "capture-a.parquet")
    return pq.read_table(src).slice(0, 100)


def test_refuses_another_version(captures: tuple[Path, GeneratedTruth], tmp_path: Path, capsys: Any) -> None:
    rows = _one_file(captures, tmp_path / "in")
    _write(tmp_path / "in" / "capture-b.parquet", rows.replace_schema_metadata({CAPTURE_VERSION_KEY: "2"}))
    assert "version 2" in _refused(tmp_path / "in", tmp_path, capsys)


def test_refuses_mixed_schemas(captures: tuple[Path, GeneratedTruth], tmp_path: Path, capsys: Any) -> None:
    rows = _one_file(captures, tmp_path / "in")
    narrower = rows.drop_columns(["upstream_ms"]).replace_schema_metadata(arrow_schema().metadata)  # type: ignore[attr-defined]
    _write(tmp_path / "in" / "capture-b.parquet", narrower)
    assert "upstream_ms" in _refused(tmp_path / "in", tmp_path, capsys)


def test_refuses_unreadable_and_empty(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "in").mkdir()
    assert "no capture files" in _refused(tmp_path / "in", tmp_path, capsys)
    (tmp_path / "in" / "capture-x.parquet").write_bytes(b"not parquet at all")
    assert "unreadable" in _refused(tmp_path / "in", tmp_path, capsys)
    assert "no such file" in _refused(tmp_path / "missing", tmp_path, capsys)
    empty = pa.Table.from_batches([], schema=arrow_schema())
    (tmp_path / "in" / "capture-x.parquet").unlink()
    _write(tmp_path / "in" / "capture-y.parquet", empty)
    assert "no records" in _refused(tmp_path / "in", tmp_path, capsys)


def test_refuses_files_that_are_not_captures(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "other.parquet", pa.table({"a": [1, 2, 3]}))
    assert "not a kthrottle capture file" in _refused(tmp_path / "in", tmp_path, capsys)


def test_will_not_overwrite_what_it_did_not_write(
    captures: tuple[Path, GeneratedTruth], tmp_path: Path, capsys: Any
) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["--input", str(captures[0]), "--output", str(out), "--quiet"]) == 2
    assert (out / "notes.txt").read_text() == "mine"
    assert "not a previous tune report" in capsys.readouterr().err
    (out / "notes.txt").unlink()
    (out / MARKER).write_text("")  # an earlier report may be replaced (tested end to end by the bench)


def test_input_forms(captures: tuple[Path, GeneratedTruth], tmp_path: Path) -> None:
    directory, truth = captures
    assert local_files(str(directory)) == sorted(truth.files)
    assert local_files(str(directory / "capture-gen-*.parquet")) == sorted(truth.files)
    assert local_files(f"file://{truth.files[0]}") == [truth.files[0]]
    (directory / "capture-gen-9999.parquet.inprogress").write_bytes(b"half written")
    try:
        assert check_local(str(directory)).rows == truth.records  # the writer's .inprogress is skipped
    finally:
        (directory / "capture-gen-9999.parquet.inprogress").unlink()


def test_remote_style_input_is_checked_through_spark(
    spark: Any, captures: tuple[Path, GeneratedTruth], tmp_path: Path
) -> None:
    directory, truth = captures
    checked = check_remote(spark, directory.as_uri())
    assert checked.files == len(truth.files) and checked.remote and not checked.notes
    rows = _one_file(captures, tmp_path / "in")
    _write(tmp_path / "in" / "capture-b.parquet", rows.replace_schema_metadata({CAPTURE_VERSION_KEY: "2"}))
    with pytest.raises(InputError, match="version 2"):
        check_remote(spark, (tmp_path / "in").as_uri())
    other = tmp_path / "other"
    other.mkdir()
    _one_file(captures, other)
    _write(other / "capture-b.parquet", pa.table({"ts_ms": pa.array(["not a number"])}))
    with pytest.raises(InputError, match="mixed schemas"):
        check_remote(spark, other.as_uri())


# --- the proposal rules, on hand-made statistics (no Spark) ----------------------------------------


def _rates(rows: list[tuple[str, str, str, str, float]]) -> pd.DataFrame:
    out = pd.DataFrame(rows, columns=["level", "user", "client_id", "direction", "p99_bps"])
    for c in ("total_bytes", "p50_bps", "p95_bps", "max_bps"):
        out[c] = 1
    out["active_s"] = 600  # every entity active the whole 600 s: evidence enough
    return out


def _stats(rates: pd.DataFrame) -> Stats:
    empty = pd.DataFrame(
        columns=["level", "user", "client_id", "max_window", "peak_rate", "sec", "mutations"]
    )
    tables = {
        "entity_rates": rates,
        "topic_rates": pd.DataFrame(columns=["direction", "topic", "partition_p99_max_bps"]),
        "mutations": empty,
        "mutation_series": empty,
        "producer_ids": pd.DataFrame(columns=["user", "peak_ids_per_s", "max_new_per_hour"]),
    }
    return Stats(tables, 1000, 0, 599)


def test_rounding_coverage_and_backlog() -> None:
    from analytics.propose import cover, nice_up

    assert nice_up(1_234_001) == 1_240_000 and nice_up(1_230_000) == 1_230_000
    assert nice_up(0.001234, 2) == 0.0013 and nice_up(0.0) == 0.0
    assert cover(pd.Series([5, 1, 4, 2, 3]), 0.95) == (4.0, 4, 5)  # floor(0.95 x 5) = 4 of 5
    assert cover(pd.Series([7]), 0.95) == (7.0, 1, 1)
    assert cover(pd.Series(range(1, 101)), 0.95) == (95.0, 95, 100)
    # 10 at once, refilled at 1/s: short by 10, back to 0 after 10 s; then 5 more.
    assert token_backlog([0, 20], [10, 5], 1.0) == 10
    assert token_backlog([0, 2], [10, 5], 1.0) == 13


def test_default_levels_and_kip55_shadowing() -> None:
    # 40 ordinary clients of 20 users, one heavy pair, one user heavy only in total.
    rows = [("user-client", f"u{i // 2}", f"c{i}", "produce", 1000.0 + i) for i in range(40)]
    rows += [("user-client", "big", "loader", "produce", 50_000.0)]
    rows += [("user-client", "many", f"m{i}", "produce", 900.0) for i in range(10)]
    rows += [("user", f"u{i}", "", "produce", 2100.0 + i) for i in range(20)]
    rows += [("user", "big", "", "produce", 50_000.0), ("user", "many", "", "produce", 9000.0)]
    rows += [("client", "", f"c{i}", "produce", 1000.0 + i) for i in range(40)]
    rows += [("client", "", "loader", "produce", 50_000.0)]
    rows += [("client", "", f"m{i}", "produce", 900.0) for i in range(10)]
    stats = _stats(_rates(rows))

    pairs = propose(stats, ProposeOptions()).config  # default at (<default> user, <default> client)
    assert resolve(pairs, "u3", "c7", PRODUCER_BYTE_RATE).level == 5  # type: ignore[union-attr]
    assert resolve(pairs, "big", "loader", PRODUCER_BYTE_RATE).level == 1  # type: ignore[union-attr]
    assert resolve(pairs, "many", "m1", PRODUCER_BYTE_RATE).level == 3  # type: ignore[union-attr]
    assert "big" not in pairs.users or pairs.users["big"].producer_byte_rate is None  # its pair has one
    assert not pairs.clients  # client-id quotas would never apply under <default> user quotas

    users = propose(stats, ProposeOptions(default_level="user")).config
    assert users.users[DEFAULT].producer_byte_rate is not None and not users.users[DEFAULT].clients
    assert resolve(users, "u3", "c7", PRODUCER_BYTE_RATE).level == 6  # type: ignore[union-attr]
    assert resolve(users, "many", "m1", PRODUCER_BYTE_RATE).level == 3  # type: ignore[union-attr]

    clients = propose(stats, ProposeOptions(default_level="client")).config
    assert clients.clients[DEFAULT].producer_byte_rate is not None and DEFAULT not in clients.users
    assert resolve(clients, "u3", "c7", PRODUCER_BYTE_RATE).level == 8  # type: ignore[union-attr]
    assert resolve(clients, "big", "loader", PRODUCER_BYTE_RATE).level == 1  # type: ignore[union-attr]

    few = propose(stats, ProposeOptions(top_k=0)).config
    assert resolve(few, "big", "loader", PRODUCER_BYTE_RATE).level == 5  # type: ignore[union-attr]


def _one_create_topics(requests: int) -> Stats:
    """A capture of 240 s with ``requests`` CreateTopics of 7 partitions from one admin client, and
    a producer active for only 12 of its seconds beside 40 steady ones."""
    rows = [("user-client", "u", f"c{i}", "produce", 1000.0 + i) for i in range(40)]
    rows += [("user-client", "u", "brief", "produce", 90_000.0)]
    rates = _rates(rows)
    rates.loc[rates["client_id"] == "brief", "active_s"] = 12
    stats = _stats(rates)
    stats.start_s, stats.end_s = 0, 239
    secs = list(range(0, 10 * requests, 10))
    stats.tables["mutations"] = pd.DataFrame(
        [
            (
                "user-client",
                "ANONYMOUS",
                "admin",
                requests,
                7 * requests,
                requests,
                7,
                7,
                7 * requests / 240,
                0.03,
            )
        ],
        columns=[
            "level",
            "user",
            "client_id",
            "requests",
            "mutations",
            "active_s",
            "max_per_s",
            "max_window",
            "peak_rate",
            "mean_rate",
        ],
    )
    stats.tables["mutation_series"] = pd.DataFrame(
        [("user-client", "ANONYMOUS", "admin", sec, 7) for sec in secs],
        columns=["level", "user", "client_id", "sec", "mutations"],
    )
    return stats


def test_too_little_evidence_is_not_written() -> None:
    """One CreateTopics in four minutes is no basis for a mutation rate, nor 12 seconds of traffic
    for a byte rate: neither is written, each row says what it rested on and why, and so does the
    file's header. With enough requests the same rule writes the rate."""
    proposal = propose(_one_create_topics(1), ProposeOptions())
    assert "controller_window" not in proposal.quotas
    assert proposal.config.users[DEFAULT].clients[DEFAULT].controller_mutation_rate is None
    rows = proposal.table.set_index(["kind", "key"])
    mutation = rows.loc[("default", CONTROLLER_MUTATION_RATE)]
    assert not mutation["written"]
    assert mutation["requests"] == 1 and mutation["seconds"] == 240 and mutation["entities"] == 1
    assert mutation["note"] == "only 1 mutation request; at least 10 are needed (in 240 s)"
    brief = proposal.table[proposal.table["client_id"] == "brief"].iloc[0]
    assert not brief["written"] and brief["seconds"] == 12
    assert brief["note"].startswith("only 12 s of traffic; at least 33 s")
    assert "brief" not in proposal.config.users.get("u", type(proposal.config.users[DEFAULT])()).clients
    assert "Not written, too little evidence" in proposal.yaml
    assert "1 mutation request; at least 10" in proposal.yaml

    enough = propose(_one_create_topics(12), ProposeOptions())
    assert enough.config.users[DEFAULT].clients[DEFAULT].controller_mutation_rate is not None
    assert enough.quotas["controller_window"]["num"] >= 11


def test_a_default_rests_on_typical_entities() -> None:
    """Forty clients seen for one second each are no basis for a default, however many they are:
    the median entity's seconds count, not their sum."""
    rates = _rates([("user-client", "u", f"c{i}", "produce", 1000.0 + i) for i in range(40)])
    rates["active_s"] = 1
    proposal = propose(_stats(rates), ProposeOptions())
    assert DEFAULT not in proposal.config.users
    row = proposal.table[(proposal.table["kind"] == "default") & (proposal.table["level"] == "user-client")]
    assert row.iloc[0]["seconds"] == 1 and row.iloc[0]["entities"] == 40 and not row.iloc[0]["written"]
    assert row.iloc[0]["note"].startswith("only 1 s of traffic per entity (median); at least 33 s")


def test_bad_options_are_refused(captures: tuple[Path, GeneratedTruth], tmp_path: Path, capsys: Any) -> None:
    for bad in (
        ["--coverage", "0"],
        ["--headroom", "0.5"],
        ["--top-k", "-1"],
        ["--prefix-min-ids", "1"],
        ["--bound-share", "0"],
    ):
        assert main(["--input", str(captures[0]), "--output", str(tmp_path / "o"), *bad]) == 2
        assert not (tmp_path / "o").exists()
    assert "coverage" in capsys.readouterr().err


def test_a_python_worker_failure_is_named(
    spark: Any, captures: tuple[Path, GeneratedTruth], tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """A real Spark Python worker raising (as one missing the job's packages would): the last line
    names the worker's exception and message, not "An exception was thrown from the Python
    worker", and nothing is written."""
    import analytics.tune

    def worker_without_packages(*_args: Any) -> Any:
        def fails(pdf: pd.DataFrame) -> pd.DataFrame:
            raise ModuleNotFoundError("No module named 'quota'")

        spark.range(4).groupBy("id").applyInPandas(fails, "id long").collect()

    monkeypatch.setattr(analytics.tune, "compute", worker_without_packages)
    out = tmp_path / "out"
    assert main(["--input", str(captures[0]), "--output", str(out), "--quiet"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    worker = "ModuleNotFoundError: No module named 'quota' (in a Spark Python worker)"
    assert last == f"tune: failed: {worker}; nothing written"
    assert not out.exists()


def test_a_worker_traceback_inside_a_java_error_is_named() -> None:
    """A Java-side error (Py4JJavaError) carries the worker's traceback after a prefix."""
    from analytics.tune import failure_line

    text = (
        "An error occurred while calling o123.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/work/pyspark/worker.py", line 1, in main\n'
        "    import quota\n"
        "ModuleNotFoundError: No module named 'quota'\n"
        "\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n"
    )
    assert failure_line(RuntimeError(text)) == (
        "ModuleNotFoundError: No module named 'quota' (in a Spark Python worker)"
    )
    assert failure_line(ValueError("bad\nmore")) == "ValueError: bad"
