"""What a capture costs on disk per record, at the rates a proxy sees: a quiet one and a busy one.

One proxy with capture on (the defaults: files closed after 300 s or 128 MiB, row groups of
``capture.batch_records``) in front of one broker. Kafka's perf producer sends 1 KiB records
through it, first at a quiet rate with ``linger.ms=0`` (about one request per record), then as
fast as it goes; each phase gets a capture directory of its own (the proxy is restarted between
them, which closes its files), and the bytes of the finished Parquet files are divided by the
records they hold. Prints the phases, then one JSON line:

  capture_bytes_per_record_quiet   bytes per capture record (one per request), about 100 requests/s
                                   for 60 s
  capture_bytes_per_record_busy    1,000,000 records as fast as they go (bigger requests, fewer)
  records_quiet, records_busy      capture records (one per request, Produce and the rest)

Usage: source dev/setup.sh && python bench/capture_size.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq

from dev.harness import KafkaCluster
from dev.perf_tools import produce
from dev.proxy_process import ProxyProcess, gateway_config

QUIET_RATE = 100
QUIET_SECONDS = 60
BUSY_RECORDS = 1_000_000


def captured(directory: Path) -> tuple[int, int]:
    """(records, bytes) of the finished capture files in ``directory``."""
    files = sorted(directory.glob("*.parquet"))
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files), sum(f.stat().st_size for f in files)


def phase(
    cluster: KafkaCluster, workdir: Path, name: str, records: int, rate: int, linger_ms: int
) -> tuple[int, int]:
    """Run one phase through a capturing proxy; its capture's (records, bytes)."""
    directory = workdir / name
    capture = {"enabled": True, "directory": str(directory), "instance": name}
    with ProxyProcess(gateway_config(cluster, capture=capture, log_level="WARNING")) as proxy:
        result = produce(proxy.bootstrap, "size", records, rate, linger_ms=linger_ms)
    count, size = captured(directory)
    print(
        f"{name}: {result['rate']:.0f} records/s sent, {count:,} capture records, {size:,} bytes, "
        f"{size / count:.1f} bytes/record",
        flush=True,
    )
    return count, size


def main() -> None:
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="capture-size-") as tmp, KafkaCluster(brokers=1) as cluster:
        cluster.create_topic("size", 6)
        workdir = Path(tmp)
        for name, records, rate, linger in (
            ("quiet", QUIET_RATE * QUIET_SECONDS, QUIET_RATE, 0),
            ("busy", BUSY_RECORDS, -1, 5),
        ):
            count, size = phase(cluster, workdir, name, records, rate, linger)
            figures[f"capture_bytes_per_record_{name}"] = round(size / count, 1)
            figures[f"records_{name}"] = count
    figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
