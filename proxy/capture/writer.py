"""Traffic capture: one record per request, written off the hot path to rolling Parquet files or
(``capture.sink: kafka``, proxy/capture/kafka_sink.py) to a Kafka topic.

The event loop only appends a tuple to a bounded queue (a few hundred nanoseconds); a writer
thread hands queued records to the sink in batches. When the writer falls behind and the queue
is full, new records are dropped and counted: capture never slows traffic.

Files sink: files are written as ``<name>.parquet.inprogress`` and renamed to ``<name>.parquet``
once closed, so a reader (the tuning job) only ever sees complete files. A file is closed when it
reaches ``max_file_bytes`` or ``max_file_seconds``; completed files beyond ``retention_files``,
or older than ``retention_seconds``, are deleted oldest first. ``CaptureFiles`` is that format on
its own, so ``kthrottle capture-export`` writes exactly the same files.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from proxy.config import CaptureConfig
from proxy.metrics import ProxyMetrics
from proxy.ratelog import RateLimitedLog
from quota.capture_schema import CAPTURE_FILE_SUFFIX, arrow_schema

log = logging.getLogger(__name__)

INPROGRESS = ".inprogress"
DEFAULT_ROW_GROUP_RECORDS: int = CaptureConfig.model_fields["batch_records"].default
Row = tuple[Any, ...]  # values in quota.capture_schema.FIELD_NAMES order


def instance_name(cfg: CaptureConfig) -> str:
    """The proxy instance named in records, file names and Kafka message keys."""
    return cfg.instance or socket.gethostname()


class Sink(Protocol):
    """Where the writer thread puts records. Every method runs on the writer thread only."""

    close_seconds: float  # how long ``close`` may take, at most

    def open(self) -> None:
        """Called once when the writer thread starts."""

    def write(self, rows: Sequence[Row]) -> None:
        """Take a batch; failures are counted and logged here, never raised."""

    def tick(self) -> None:
        """Periodic upkeep (at least every ``flush_seconds``)."""

    def close(self) -> None:
        """Write out what is buffered and release everything, within ``close_seconds``."""


# --- the Parquet capture file format ------------------------------------------------------------


class CaptureFiles:
    """Rolling Parquet capture files in one directory: the files sink's format, also written by
    ``kthrottle capture-export``. Errors are raised; the callers decide what they cost.

    Rows are written in row groups of ``row_group_records`` (and the rest when the file closes),
    not one per batch handed in: each row group costs a few KB of column metadata, which at a few
    hundred requests a second was most of a file. Nothing is less durable for it: a file is only
    readable once closed (its footer), and a failure loses the open file's rows either way."""

    def __init__(
        self,
        directory: Path,
        instance: str,
        max_file_bytes: int,
        max_file_seconds: float,
        clock: Callable[[], float] = time.time,
        on_closed: Callable[[Path], None] | None = None,
        row_group_records: int = DEFAULT_ROW_GROUP_RECORDS,
    ) -> None:
        self.directory = directory
        self.row_group_records = row_group_records
        self._pending: list[Row] = []
        self.instance = instance
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self.clock = clock
        self.on_closed = on_closed
        self.directory.mkdir(parents=True, exist_ok=True)
        self._schema: Any = arrow_schema()
        self._writer: Any = None
        self._path: Path | None = None
        self._opened_at = 0.0
        self._seq = 0

    @property
    def path(self) -> Path | None:
        """The file being written (``.inprogress``), if one is open."""
        return self._path

    def write(self, rows: Sequence[Row]) -> None:
        """Append rows, writing each full row group; closes the file once it reaches ``max_file_bytes``."""
        if self._writer is None:
            self._open()
        self._pending.extend(rows)
        while len(self._pending) >= self.row_group_records:
            group, self._pending = (
                self._pending[: self.row_group_records],
                self._pending[self.row_group_records :],
            )
            self._write_group(group)
            assert self._path is not None
            if os.path.getsize(self._path) >= self.max_file_bytes:
                rest, self._pending = self._pending, []  # for the next file, not this full one
                self.close()
                self._pending = rest
                if rest:
                    self._open()

    def _write_group(self, rows: Sequence[Row]) -> None:
        import pyarrow as pa

        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(col, type=field.type) for col, field in zip(columns, self._schema, strict=True)],
            schema=self._schema,
        )
        self._writer.write_table(table)

    def roll_if_due(self) -> None:
        """Close the open file once it is ``max_file_seconds`` old."""
        if self._writer is not None and self.clock() - self._opened_at >= self.max_file_seconds:
            self.close()

    def _open(self) -> None:
        import pyarrow.parquet as pq

        self._seq += 1
        now = self.clock()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        name = f"capture-{_safe(self.instance)}-{stamp}-{os.getpid()}-{self._seq:06d}{CAPTURE_FILE_SUFFIX}"
        self._path = self.directory / (name + INPROGRESS)
        self._writer = pq.ParquetWriter(str(self._path), self._schema, compression="zstd")
        self._opened_at = now

    def close(self) -> None:
        """Close the open file, if any, and give it its final name."""
        if self._writer is None or self._path is None:
            return
        if self._pending:
            group, self._pending = self._pending, []
            self._write_group(group)
        self._writer.close()
        final = self._path.with_name(self._path.name[: -len(INPROGRESS)])
        self._path.replace(final)
        self._writer, self._path = None, None
        if self.on_closed is not None:
            self.on_closed(final)

    def abandon(self, delete: bool = False) -> None:
        """Drop the open file after a failure (deleting it if asked); the next write opens another."""
        path = self._path
        self._pending = []
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:
            pass
        self._writer, self._path = None, None
        if delete and path is not None:
            path.unlink(missing_ok=True)


# --- the files sink -------------------------------------------------------------------------------


class FileSink:
    """Rolling capture files with retention; a failed write (a full disk) is counted and logged."""

    close_seconds = 10.0

    def __init__(
        self, cfg: CaptureConfig, metrics: ProxyMetrics, instance: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.files = CaptureFiles(
            Path(cfg.directory),
            instance,
            cfg.max_file_bytes,
            cfg.max_file_seconds,
            clock,
            self._closed,
            row_group_records=cfg.batch_records,
        )
        self.ratelog = RateLimitedLog(log)

    def open(self) -> None:
        pass

    def write(self, rows: Sequence[Row]) -> None:
        try:
            self.files.write(rows)
        except Exception as exc:
            self._failed(exc)
            return
        self.metrics.capture_records.inc(len(rows))

    def tick(self) -> None:
        try:
            self.files.roll_if_due()
        except Exception as exc:
            self._failed(exc)

    def close(self) -> None:
        try:
            self.files.close()
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        # A full disk must not kill the proxy: count, log, keep going with a new file.
        self.metrics.capture_errors.inc()
        self.ratelog.log(
            logging.ERROR,
            "capture-write",
            "capture: writing to %s failed (%r); records of this file are lost",
            self.files.directory,
            exc,
        )
        self.files.abandon()

    def _closed(self, path: Path) -> None:
        self.metrics.capture_files.inc()
        self._apply_retention()

    def _apply_retention(self) -> None:
        directory = self.files.directory
        files = sorted(directory.glob(f"capture-*{CAPTURE_FILE_SUFFIX}"), key=lambda f: f.stat().st_mtime)
        horizon = self.clock() - self.cfg.retention_seconds if self.cfg.retention_seconds else None
        excess = len(files) - self.cfg.retention_files
        for i, f in enumerate(files):
            if i < excess or (horizon is not None and f.stat().st_mtime < horizon):
                f.unlink(missing_ok=True)


# --- the queue and the writer thread ------------------------------------------------------------


class CaptureWriter:
    def __init__(
        self,
        cfg: CaptureConfig,
        metrics: ProxyMetrics,
        clock: Any = time.time,
        start: bool = True,
        sink: Sink | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.instance = instance_name(cfg)
        self.sink: Sink = sink if sink is not None else FileSink(cfg, metrics, self.instance, clock)
        self.queue: collections.deque[Row] = collections.deque()
        self.limit = cfg.queue_records
        self.dropped = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kthrottle-capture", daemon=True)
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start the writer thread (when constructed with ``start=False``, as tests do)."""
        self._thread.start()

    # --- the hot path (event loop) ---------------------------------------------------------------

    def record(self, row: Row) -> None:
        if len(self.queue) >= self.limit:
            self.dropped += 1
            self.metrics.capture_dropped.inc()
            return
        self.queue.append(row)
        if len(self.queue) >= self.cfg.batch_records:
            self._wake.set()

    # --- the writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        self._guarded(self.sink.open)
        while not self._stop.is_set():
            self._wake.wait(self.cfg.flush_seconds)
            self._wake.clear()
            self._drain()
        self._drain()
        self._guarded(self.sink.close)

    def _drain(self) -> None:
        while self.queue:
            batch = [self.queue.popleft() for _ in range(min(len(self.queue), self.cfg.batch_records))]
            self._guarded(self.sink.write, batch)
        self._guarded(self.sink.tick)

    def _guarded(self, step: Callable[..., None], *args: Any) -> None:
        """Sinks count their own failures; this is the last line so the thread never dies."""
        try:
            step(*args)
        except Exception:
            self.metrics.capture_errors.inc()
            log.exception("capture: the %s sink failed unexpectedly", self.cfg.sink)

    def close(self, timeout: float | None = None) -> None:
        """Write what is queued, close the sink and stop the thread, waiting a bounded time."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self.sink.close_seconds + 5.0 if timeout is None else timeout)
            if self._thread.is_alive():
                log.warning("capture: the writer did not finish in time; unwritten records are lost")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
