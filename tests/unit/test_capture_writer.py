"""The capture writer: bounded queue with counted drops, rolling files, retention, readable Parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from proxy.capture.writer import INPROGRESS, CaptureFiles, CaptureWriter
from proxy.config import CaptureConfig
from proxy.metrics import ProxyMetrics
from quota.capture_schema import CAPTURE_SCHEMA_VERSION, CAPTURE_VERSION_KEY, FIELD_NAMES


def _row(i: int) -> tuple[Any, ...]:
    values = {
        "ts_ms": 1_700_000_000_000 + i,
        "proxy": "p1",
        "node": 1,
        "conn": i % 7,
        "client_addr": "127.0.0.1:5000",
        "principal": "ANONYMOUS",
        "client_id": f"c{i % 3}",
        "api_key": 0,
        "api_version": 9,
        "request_bytes": 1000 + i,
        "response_bytes": 60,
        "partitions": [{"topic": "t", "partition": i % 2, "bytes": 900, "records": 3}],
        "producer_ids": [42],
        "new_producer_ids": -1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": 0,
        "decided_throttle_ms": 0,
        "broker_throttle_ms": 0,
        "upstream_ms": 1.5,
        "dry_run": False,
    }
    return tuple(values[name] for name in FIELD_NAMES)


def _config(tmp_path: Path, **overrides: Any) -> CaptureConfig:
    return CaptureConfig(enabled=True, directory=tmp_path, instance="p1", **overrides)


def _rows(directory: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for f in sorted(directory.glob("*.parquet")):
        out += pq.read_table(f).to_pylist()
    return out


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    writer = CaptureWriter(_config(tmp_path, queue_records=1000), metrics, start=False)
    for i in range(1500):
        writer.record(_row(i))
    assert writer.dropped == 500
    writer.start()
    writer.close()
    rows = _rows(tmp_path)
    assert len(rows) == 1000 and rows[0]["request_bytes"] == 1000
    assert rows[0]["partitions"] == [{"topic": "t", "partition": 0, "bytes": 900, "records": 3}]
    assert metrics.registry.get_sample_value("kthrottle_capture_dropped_total") == 500
    assert metrics.registry.get_sample_value("kthrottle_capture_records_total") == 1000


def test_files_roll_by_size_carry_the_version_and_keep_retention(tmp_path: Path) -> None:
    writer = CaptureWriter(
        _config(tmp_path, max_file_bytes=64 * 1024, batch_records=500, retention_files=3),
        ProxyMetrics(),
        start=False,
    )
    for i in range(20_000):
        writer.record(_row(i))
    writer.start()
    writer.close()
    files = sorted(tmp_path.glob("*.parquet"))
    assert len(files) == 3  # more were written; the oldest went
    assert not list(tmp_path.glob(f"*{INPROGRESS}"))
    meta = pq.read_schema(files[0]).metadata
    assert meta[CAPTURE_VERSION_KEY.encode()] == str(CAPTURE_SCHEMA_VERSION).encode()
    assert _rows(tmp_path)[-1]["ts_ms"] == 1_700_000_000_000 + 19_999  # the newest are kept


def _file_of_small_batches(directory: Path, row_group_records: int) -> Path:
    """250 flushes of 10 requests, as a proxy at 10 requests/s hands them to the file."""
    files = CaptureFiles(directory, "p1", 1 << 30, float("inf"), row_group_records=row_group_records)
    for batch in range(250):
        files.write([_row(batch * 10 + i) for i in range(10)])
    files.close()
    [path] = directory.glob("*.parquet")
    return path


def test_small_batches_share_row_groups(tmp_path: Path) -> None:
    """A quiet proxy hands the file a few rows per flush: they are gathered into full row groups
    (each costs its column metadata), so a record costs a few bytes, not tens."""
    path = _file_of_small_batches(tmp_path / "gathered", 1000)
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.num_rows == 2500
    assert parquet.metadata.num_row_groups == 3  # 1000, 1000 and the 500 left at close
    assert [r["ts_ms"] for r in _rows(tmp_path / "gathered")] == [1_700_000_000_000 + i for i in range(2500)]
    one_group_per_flush = _file_of_small_batches(tmp_path / "per-flush", 10)
    print(
        f"bytes per record: {path.stat().st_size / 2500:.1f} gathered, "
        f"{one_group_per_flush.stat().st_size / 2500:.1f} one row group per flush"
    )
    assert path.stat().st_size * 3 < one_group_per_flush.stat().st_size


def test_pending_rows_reach_a_file_on_every_roll(tmp_path: Path) -> None:
    """Rows gathered for a row group are written when the file rolls by size (the rest open the
    next file), by time and at close; a failed file loses only its own rows."""
    now = [0.0]
    files = CaptureFiles(tmp_path, "p1", 8 * 1024, 60.0, clock=lambda: now[0], row_group_records=500)
    for batch in range(60):  # 6,000 rows: several row groups, each file full after about one
        files.write([_row(batch * 100 + i) for i in range(100)])
    files.write([_row(6000 + i) for i in range(7)])  # a few pending when the time is up
    now[0] = 61.0
    files.roll_if_due()
    assert files.path is None
    files.write([_row(7000 + i) for i in range(3)])
    files.close()
    written = sorted(r["ts_ms"] - 1_700_000_000_000 for r in _rows(tmp_path))
    assert written == [*range(6007), 7000, 7001, 7002]
    assert len(list(tmp_path.glob("*.parquet"))) > 3 and not list(tmp_path.glob(f"*{INPROGRESS}"))

    files.write([_row(9000)])
    files.abandon(delete=True)  # a failed write: this file's rows are lost, no others
    files.write([_row(9001)])
    files.close()
    assert sorted(r["ts_ms"] - 1_700_000_000_000 for r in _rows(tmp_path))[-2:] == [7002, 9001]
