"""The traffic generator writes valid capture files with the shapes it promises (no Spark here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from analytics.generate import CREATE_TOPICS, DELETE_TOPICS, GeneratedTruth, generate, main
from quota.capture_schema import CAPTURE_VERSION_KEY, arrow_schema
from quota.keys import ANONYMOUS


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[GeneratedTruth, object]:
    out = tmp_path_factory.mktemp("gen")
    truth = generate(out, 60_000, seed=3, span_s=600, rows_per_file=25_000)
    table = pq.ParquetDataset(truth.files).read()
    return truth, table


def test_files_records_and_schema(small: tuple[GeneratedTruth, object]) -> None:
    truth, table = small
    assert len(truth.files) == 3
    assert all(Path(f).name.startswith("capture-gen-") and f.endswith(".parquet") for f in truth.files)
    assert table.num_rows == 60_000  # type: ignore[attr-defined]
    expected = arrow_schema()
    for f in truth.files:
        schema = pq.read_schema(f)
        # (list item names are the Parquet writer's business: compare without them)
        assert schema.equals(expected), f
        assert schema.metadata == expected.metadata == {CAPTURE_VERSION_KEY.encode(): b"1"}  # type: ignore[attr-defined]
    assert sum(truth.counts.values()) == 60_000


def test_files_are_consecutive_time_slices(small: tuple[GeneratedTruth, object]) -> None:
    truth, _ = small
    last = None
    for f in truth.files:
        ts = pq.read_table(f, columns=["ts_ms"]).column("ts_ms").to_numpy()
        assert np.all(np.diff(ts) >= 0)
        assert ts.min() >= truth.start_ms and ts.max() < truth.end_ms
        if last is not None:
            assert ts.min() >= last
        last = ts.max()


def test_same_seed_same_files(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", 5_000, seed=11, span_s=120)
    b = generate(tmp_path / "b", 5_000, seed=11, span_s=120)
    for fa, fb in zip(a.files, b.files, strict=True):
        assert pq.read_table(fa).equals(pq.read_table(fb))


def test_api_mix_and_sizes(small: tuple[GeneratedTruth, object]) -> None:
    _, table = small
    df = table.select(["api_key", "request_bytes", "response_bytes", "mutations"]).to_pandas()  # type: ignore[attr-defined]
    mix = df["api_key"].value_counts(normalize=True)
    assert mix[0] > 0.3 and mix[1] > 0.3 and mix[3] > 0.01  # Produce, Fetch, some Metadata
    # Produce charges request bytes that include every partition's records; Fetch the response.
    parts = table.column("partitions")  # type: ignore[attr-defined]
    sums = pc.list_value_length(parts)
    totals = np.array([sum(p["bytes"] for p in row) for row in parts.to_pylist()[:3000]])
    head = df.iloc[:3000]
    produce = head["api_key"].to_numpy() == 0
    fetch = head["api_key"].to_numpy() == 1
    assert np.all(head["request_bytes"].to_numpy()[produce] > totals[produce])
    assert np.all(head["response_bytes"].to_numpy()[fetch] >= totals[fetch])
    assert pc.max(sums).as_py() <= 6
    # Only admin requests carry mutations.
    is_admin = df["api_key"].isin([CREATE_TOPICS, DELETE_TOPICS])
    assert (df.loc[~is_admin, "mutations"] == -1).all()
    assert (df.loc[is_admin, "mutations"] > 0).all()


def test_planted_shapes(small: tuple[GeneratedTruth, object]) -> None:
    truth, table = small
    df = table.select(  # type: ignore[attr-defined]
        ["principal", "client_id", "api_key", "request_bytes", "response_bytes", "mutations"]
    ).to_pandas()
    produce = df[df["api_key"] == 0].groupby(["principal", "client_id"])["request_bytes"].sum()
    fetch = df[df["api_key"] == 1].groupby(["principal", "client_id"])["response_bytes"].sum()
    steady_produce = produce.drop(truth.heavy_producers, errors="ignore")
    steady_produce = steady_produce[[k for k in steady_produce.index if k[0] != "reporting"]]
    for pair in truth.heavy_producers:
        assert produce[pair] > 10 * steady_produce.median()
    for pair in truth.heavy_consumers:
        assert fetch[pair] > 10 * fetch.drop(truth.heavy_consumers).median()
    assert ("ANONYMOUS", "legacy-mirror") in truth.heavy_producers
    assert any(u == ANONYMOUS for u, _ in truth.steady_pairs)
    # The abusive admin client creates far more partitions than any well-behaved one.
    muts = df[df["mutations"] > 0].groupby(["principal", "client_id"])["mutations"].sum()
    assert muts[truth.abusive_admin] > 20 * max(muts[p] for p in truth.admin_clients if p in muts)
    # The storm user brings far more distinct producer ids than anyone else.
    ids = table.select(["principal", "producer_ids"]).to_pandas().explode("producer_ids").dropna()  # type: ignore[attr-defined]
    ids = ids[ids["producer_ids"] >= 0].groupby("principal")["producer_ids"].nunique()
    assert ids.idxmax() == truth.storm_user
    assert ids[truth.storm_user] > 20 * ids.drop(truth.storm_user).max()


def test_truth_round_trip(small: tuple[GeneratedTruth, object]) -> None:
    truth, _ = small
    saved = Path(truth.files[0]).parent / "truth.json"
    assert GeneratedTruth.from_json(saved.read_text()) == truth


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--records", "2000", "--output", str(tmp_path), "--span-s", "120"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 2000 and len(list(tmp_path.glob("capture-gen-*.parquet"))) == len(out["files"])
    assert main(["--records", "10", "--output", str(tmp_path)]) == 2


def test_a_million_records_are_written_whole(tmp_path: Path) -> None:
    """Every record reaches a file at a bench's scale (how long it takes is bench/tune_scale.py's
    log line, never a test's verdict)."""
    truth = generate(tmp_path, 1_000_000, seed=1)
    assert sum(pq.read_metadata(f).num_rows for f in truth.files) == 1_000_000
