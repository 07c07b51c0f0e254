"""Traffic capture: one record per request, written to rolling Parquet files off the hot path.

The event loop only appends a tuple to a bounded queue (a few hundred nanoseconds); a writer
thread turns queued records into Arrow row groups and Parquet files. When the writer falls behind
and the queue is full, new records are dropped and counted: capture never slows traffic.

Files are written as ``<name>.parquet.inprogress`` and renamed to ``<name>.parquet`` once
closed, so a reader (the tuning job) only ever sees complete files. A file is closed when it
reaches ``max_file_bytes`` or ``max_file_seconds``; completed files beyond ``retention_files``,
or older than ``retention_seconds``, are deleted oldest first.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from proxy.config import CaptureConfig
from proxy.metrics import ProxyMetrics
from quota.capture_schema import CAPTURE_FILE_SUFFIX, arrow_schema

log = logging.getLogger(__name__)

INPROGRESS = ".inprogress"
Row = tuple[Any, ...]  # values in quota.capture_schema.FIELD_NAMES order


class CaptureWriter:
    def __init__(
        self, cfg: CaptureConfig, metrics: ProxyMetrics, clock: Any = time.time, start: bool = True
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.instance = cfg.instance or socket.gethostname()
        self.directory = Path(cfg.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.queue: collections.deque[Row] = collections.deque()
        self.limit = cfg.queue_records
        self.dropped = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._writer: Any = None
        self._schema: Any = arrow_schema()
        self._path: Path | None = None
        self._opened_at = 0.0
        self._seq = 0
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
        while not self._stop.is_set():
            self._wake.wait(self.cfg.flush_seconds)
            self._wake.clear()
            self._drain()
        self._drain()
        self._close_file()

    def _drain(self) -> None:
        try:
            while self.queue:
                batch = [self.queue.popleft() for _ in range(min(len(self.queue), self.cfg.batch_records))]
                self._write(batch)
            if self._writer is not None and self.clock() - self._opened_at >= self.cfg.max_file_seconds:
                self._close_file()
        except Exception:  # a full disk must not kill the proxy: count, log, keep going
            self.metrics.capture_errors.inc()
            log.exception("capture: writing to %s failed; records of this batch are lost", self.directory)
            self._abandon_file()

    def _write(self, rows: list[Row]) -> None:
        import pyarrow as pa

        if self._writer is None:
            self._open_file()
        columns = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays(
            [pa.array(col, type=field.type) for col, field in zip(columns, self._schema, strict=True)],
            schema=self._schema,
        )
        self._writer.write_table(table)
        self.metrics.capture_records.inc(len(rows))
        assert self._path is not None
        if os.path.getsize(self._path) >= self.cfg.max_file_bytes:
            self._close_file()

    def _open_file(self) -> None:
        import pyarrow.parquet as pq

        self._seq += 1
        now = self.clock()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        name = f"capture-{_safe(self.instance)}-{stamp}-{os.getpid()}-{self._seq:06d}{CAPTURE_FILE_SUFFIX}"
        self._path = self.directory / (name + INPROGRESS)
        self._writer = pq.ParquetWriter(str(self._path), self._schema, compression="zstd")
        self._opened_at = now

    def _close_file(self) -> None:
        if self._writer is None or self._path is None:
            return
        self._writer.close()
        final = self._path.with_name(self._path.name[: -len(INPROGRESS)])
        self._path.replace(final)
        self._writer, self._path = None, None
        self.metrics.capture_files.inc()
        self._apply_retention()

    def _abandon_file(self) -> None:
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:
            pass
        self._writer, self._path = None, None

    def _apply_retention(self) -> None:
        files = sorted(
            self.directory.glob(f"capture-*{CAPTURE_FILE_SUFFIX}"), key=lambda f: f.stat().st_mtime
        )
        horizon = self.clock() - self.cfg.retention_seconds if self.cfg.retention_seconds else None
        excess = len(files) - self.cfg.retention_files
        for i, f in enumerate(files):
            if i < excess or (horizon is not None and f.stat().st_mtime < horizon):
                f.unlink(missing_ok=True)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the current file and stop the thread."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
