"""Quota fidelity over a matrix of clients, settings and cluster sizes, in one run.

Each cell runs one greedy client through kthrottle against a client-id quota (Kafka's default
window, 11 x 1 s) and measures the mean rate of value bytes it had acknowledged (produce) or
received (fetch) over seconds 12-45, against the quota (the slope of a least-squares line through
its arrivals, so a client acknowledged in steps of megabytes is not read by where its steps fall):

  client     Kafka's Java producer/consumer (tests/integration/java/Rate*.java: Produce and Fetch
             by topic id), librdkafka, kafka-python, aiokafka (dev/fidelity_client.py)
  direction  produce (3 partitions), fetch (a 3-partition topic filled beforehand, 64 KiB batches)
  brokers    1, and 3 with the partitions' leaders on all three
  settings   the library's defaults; aggressive: 5 requests in flight, 1 MiB batches, 50 MB
             fetches (10 MB per partition)

plus a topic-quota row for each direction (KIP-1010 per-partition rate, the Java clients, 1
broker), and, on 1 broker, every client and setting against the broker's own quota (set with
Kafka's config command, straight to the broker), for reference. Value bytes read a little under
the bytes a quota counts (record and request framing), through the proxy and the broker alike.

Through the proxy, each cell also measures the bytes the quota counts (the proxy's own request or
response byte counter over the same seconds): its wire error. The broker's wire bytes cannot be
read from outside, so a broker cell's wire error is its value-byte rate times the framing the
same client and setting showed through the proxy. A cell is worse than the broker when its wire
error is further from 0 than the broker's by more than 0.01: a broker that lets a client 1.5%
past its quota reads closer to 0 in value bytes than an enforcer that holds the quota exactly.

Last line, one JSON object: max_abs_error (value bytes, over the proxy cells), cells,
client_errors, cells_worse_than_broker, max_abs_wire_error, max_abs_broker_error, each cell's
signed value-byte error under its name (``<direction>_<client>_<brokers>b_<settings>``,
``topic_<direction>_java_1b``, ``broker_<direction>_<client>_<settings>``), and ``wire_errors``:
each proxy cell's wire error and each broker cell's estimated one.

Usage: source dev/setup.sh && python bench/quota_fidelity.py [--seconds 46] [--only SUBSTRING] [--no-hold]
       [--marks FILE]; python bench/quota_fidelity.py --from-marks FILE (the figures again, no run)
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quota_accuracy import set_broker_quota
from dev.harness import KafkaCluster, java_command, run_tool
from dev.proxy_process import ProxyProcess, gateway_config

KiB = 1024
MiB = 1024 * KiB
QUOTA = 512 * KiB
SPAN = (12.0, 45.0)
# The fetch topics are written in 64 KiB record batches. A broker returns whole batches, so a
# consumer is paced a batch at a time at best: with 1 MiB batches at 512 KiB/s, seconds 12-45
# hold 16 or 17 of them and the span alone reads +-3% whatever the enforcer.
FILL_BATCH = 64 * 1024
REPO = Path(__file__).resolve().parent.parent
JAVA = REPO / "tests" / "integration" / "java"
CLIENTS = ("java", "librdkafka", "kafka-python", "aiokafka")
JAVA_SETTINGS = {
    ("produce", "aggressive"): [
        "max.in.flight.requests.per.connection=5",
        "batch.size=1048576",
        "linger.ms=5",
    ],
    ("fetch", "aggressive"): ["fetch.max.bytes=52428800", "max.partition.fetch.bytes=10485760"],
}


@dataclass
class Cell:
    name: str
    direction: str
    client: str
    settings: str
    rate: float = 0.0
    wire_rate: float | None = None  # bytes the quota counts, per second (proxy cells)
    marks: list[tuple[float, float]] = field(default_factory=list)  # (client seconds, value bytes)
    wire_marks: list[tuple[float, float]] = field(default_factory=list)  # (client seconds, wire bytes)
    errors: int = 0
    first_error: str = ""

    @property
    def error(self) -> float:
        return (self.rate - QUOTA) / QUOTA

    @property
    def wire_error(self) -> float | None:
        return None if self.wire_rate is None else (self.wire_rate - QUOTA) / QUOTA


def wire_counter(proxy: ProxyProcess, direction: str) -> Callable[[], float]:
    """The proxy's count of the bytes a byte-rate quota charges, for the cell running alone."""
    if direction == "produce":
        return lambda: proxy.metric("kthrottle_request_bytes_total", {"api": "Produce"})
    return lambda: proxy.metric("kthrottle_response_bytes_total", {"api": "Fetch"})


def sample_while(
    read: Callable[[], float], start: float, done: threading.Event, out: list[tuple[float, float]]
) -> None:
    while not done.is_set():
        out.append((time.monotonic() - start, read()))
        done.wait(0.25)


def run_timed(cmd: list[str], timeout: float, start: float) -> tuple[int, str, str, float]:
    """Run ``cmd``; its exit code, stdout, stderr, and where its own clock starts on ours: the
    seconds after ``start`` of its first "AT elapsed_ms" line, less that elapsed time."""
    offset: float | None = None
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                first = re.match(r"^AT (\d+) ", line) if offset is None else None
                if first:
                    offset = time.monotonic() - start - int(first[1]) / 1000.0
                lines.append(line)
            code = proc.wait()
        finally:
            killer.cancel()
        err.seek(0)
        return code, "".join(lines), err.read(), offset or 0.0


def span_rate(marks: list[tuple[float, float]]) -> float:
    """The mean rate over SPAN: the slope of a least-squares line through the bytes that had
    arrived at every tenth of a second of it. A client acknowledged in 3 MiB steps (1 MiB batches
    for three partitions in one Produce) has 5 or 6 steps in 33 seconds depending only on where
    the first falls; the difference of two points reads that phase, the line reads the rate."""
    if not marks:
        return 0.0
    times = [t for t, _n in marks]
    counts = [n for _t, n in marks]
    grid = [SPAN[0] + i / 10 for i in range(int((SPAN[1] - SPAN[0]) * 10) + 1)]
    arrived = []
    for t in grid:
        i = bisect.bisect_right(times, t)
        arrived.append(max(counts[:i], default=0.0))
    mean_t = statistics.fmean(grid)
    mean_n = statistics.fmean(arrived)
    spread = sum((t - mean_t) ** 2 for t in grid)
    return sum((t - mean_t) * (n - mean_n) for t, n in zip(grid, arrived, strict=True)) / spread


def run_client(
    cell: Cell,
    bootstrap: str,
    topic: str,
    client_id: str,
    seconds: float,
    wire: Callable[[], float] | None = None,
) -> None:
    """Run the cell's client in its own process; fill in its mean rate over SPAN and its errors,
    and with ``wire`` the rate of the bytes the quota counts over the same seconds."""
    if cell.client == "java":
        program = "RateProducer.java" if cell.direction == "produce" else "RateConsumer.java"
        extra = list(JAVA_SETTINGS.get((cell.direction, cell.settings), []))
        if cell.direction == "fetch":
            extra.append(f"group.id=fid-{cell.name}-{uuid.uuid4().hex[:6]}")  # each cell from the start
        cmd = java_command(str(JAVA / program), bootstrap, topic, client_id, str(int(seconds)), *extra)
    else:
        cmd = [
            sys.executable,
            str(REPO / "dev" / "fidelity_client.py"),
            cell.client,
            cell.direction,
            bootstrap,
            topic,
            client_id,
            str(seconds),
            cell.settings,
        ]
    wire_marks: list[tuple[float, float]] = []
    done = threading.Event()
    start = time.monotonic()
    sampler = threading.Thread(target=sample_while, args=(wire, start, done, wire_marks)) if wire else None
    if sampler is not None:
        sampler.start()
    try:
        code, stdout, stderr, offset = run_timed(cmd, seconds + 120, start)
    finally:
        done.set()
        if sampler is not None:
            sampler.join()
    if wire_marks:  # on the client's clock, so both rates cover the same seconds
        cell.wire_marks = [(t - offset, n) for t, n in wire_marks]
        cell.wire_rate = span_rate(cell.wire_marks)
    marks = [(int(m[1]) / 1000.0, float(m[2])) for m in re.finditer(r"^AT (\d+) (\d+)$", stdout, re.M)]
    errors = re.search(r"^ERRORS (\d+) ?(.*)$", stdout, re.M)
    if errors:
        cell.errors, cell.first_error = int(errors[1]), errors[2]
    if code != 0:
        cell.errors += 1
        cell.first_error = cell.first_error or f"exit {code}: {stderr[-300:]}"

    if not marks or marks[-1][0] < SPAN[1]:
        cell.errors += 1
        cell.first_error = cell.first_error or f"ran {marks[-1][0] if marks else 0:.1f} s of {SPAN[1]}"
    cell.marks = marks
    cell.rate = span_rate(marks)
    wire_note = f"  wire {cell.wire_error:+.3f}" if cell.wire_error is not None else ""
    print(
        f"{cell.name:<40} {cell.rate / KiB:7.0f} KiB/s  error {cell.error:+.3f}{wire_note}"
        f"  client errors {cell.errors}" + (f" ({cell.first_error})" if cell.errors else ""),
        flush=True,
    )


def wait_for_broker_quota(cluster: KafkaCluster, client_id: str, key: str) -> None:
    """Until the broker describes the quota (it then applies it to the next request)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        proc = run_tool(
            "kafka.admin.ConfigCommand",
            "--bootstrap-server",
            cluster.bootstrap_servers,
            "--describe",
            "--entity-type",
            "clients",
            "--entity-name",
            client_id,
        )
        if key in proc.stdout:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the broker never showed {key} for {client_id}")


def matrix(only: str | None) -> list[tuple[int, Cell]]:
    cells: list[tuple[int, Cell]] = []
    for brokers in (1, 3):
        for direction in ("produce", "fetch"):
            for client in CLIENTS:
                for settings in ("defaults", "aggressive"):
                    name = f"{direction}_{client}_{brokers}b_{settings}"
                    cells.append((brokers, Cell(name, direction, client, settings)))
    for direction in ("produce", "fetch"):
        cells.append((1, Cell(f"topic_{direction}_java_1b", direction, "java", "defaults")))
    for direction in ("produce", "fetch"):
        for client in CLIENTS:
            for settings in ("defaults", "aggressive"):
                cells.append(
                    (1, Cell(f"broker_{direction}_{client}_{settings}", direction, client, settings))
                )
    return [(b, c) for b, c in cells if only is None or only in c.name]


def run_cluster(
    brokers: int, cells: list[Cell], seconds: float, hold: bool, produce_shaping: str = "steady"
) -> None:
    with KafkaCluster(brokers=brokers) as cluster:
        fetch_topic = f"fid-fetch-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(fetch_topic, partitions=3, replication=1)
        per_cell = int(QUOTA * (seconds + 20) / KiB) + 16 * 1024  # the burst and the span, with room
        cluster.fill_topic(fetch_topic, per_cell, timeout=600, batch_bytes=FILL_BATCH)
        topic_quota = f"fid-topic-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic_quota, partitions=1, replication=1)
        if any(c.name == "topic_fetch_java_1b" for c in cells):
            cluster.fill_topic(topic_quota, per_cell, timeout=600, batch_bytes=FILL_BATCH)
        proxy_cells = [c for c in cells if not c.name.startswith("broker_")]
        quotas: dict[str, object] = {
            "clients": {
                f"fid-{c.name}": {
                    "producer_byte_rate" if c.direction == "produce" else "consumer_byte_rate": QUOTA
                }
                for c in proxy_cells
                if not c.name.startswith("topic_")
            },
            "topics": {topic_quota: {"producer.byte.rate": QUOTA, "consumer.byte.rate": QUOTA}},
            "hold_across_connections": hold,
            "produce_shaping": produce_shaping,
        }
        cfg = gateway_config(cluster, quotas=quotas, log_level="WARNING")
        with ProxyProcess(cfg) as proxy:
            for cell in proxy_cells:
                if cell.name.startswith("topic_"):
                    topic = topic_quota
                elif cell.direction == "produce":
                    topic = f"fid-p-{uuid.uuid4().hex[:6]}"
                    cluster.create_topic(topic, partitions=3, replication=1)
                else:
                    topic = fetch_topic
                wire = wire_counter(proxy, cell.direction)
                run_client(cell, proxy.bootstrap, topic, f"fid-{cell.name}", seconds, wire)
        for cell in [c for c in cells if c.name.startswith("broker_")]:
            client_id = f"fid-{cell.name}"
            key = "producer_byte_rate" if cell.direction == "produce" else "consumer_byte_rate"
            set_broker_quota(cluster, client_id, key, QUOTA)
            wait_for_broker_quota(cluster, client_id, key)
            if cell.direction == "produce":
                topic = f"fid-p-{uuid.uuid4().hex[:6]}"
                cluster.create_topic(topic, partitions=3, replication=1)
            else:
                topic = fetch_topic
            run_client(cell, cluster.bootstrap_servers, topic, client_id, seconds)


def summarize(cells: list[Cell]) -> dict[str, object]:
    """The figures of a run (the last line's JSON)."""
    ours = [c for c in cells if not c.name.startswith("broker_")]
    brokers_own = {c.name.removeprefix("broker_"): c for c in cells if c.name.startswith("broker_")}
    worse = []
    wire_errors: dict[str, float] = {c.name: round(c.wire_error, 4) for c in ours if c.wire_error is not None}
    for cell in ours:
        direction, client, where, settings = (cell.name.split("_") + [""] * 4)[:4]
        reference = brokers_own.get(f"{direction}_{client}_{settings}") if where == "1b" else None
        if reference is None or cell.wire_rate is None or not cell.rate:
            continue
        framing = cell.wire_rate / cell.rate  # wire bytes per value byte, this client and setting
        broker_wire = reference.rate * framing / QUOTA - 1
        wire_errors[reference.name] = round(broker_wire, 4)
        assert cell.wire_error is not None
        if abs(cell.wire_error) > abs(broker_wire) + 0.01:
            worse.append(cell.name)
    figures: dict[str, object] = {
        "max_abs_error": round(max((abs(c.error) for c in ours), default=0.0), 4),
        "cells": len(ours),
        "client_errors": sum(c.errors for c in ours),
        "cells_worse_than_broker": len(worse),
        "max_abs_wire_error": round(
            max((abs(c.wire_error) for c in ours if c.wire_error is not None), default=0.0), 4
        ),
        "max_abs_broker_error": round(max((abs(c.error) for c in brokers_own.values()), default=0.0), 4),
    }
    if worse:
        figures["worse_than_broker"] = worse
    figures.update({c.name: round(c.error, 4) for c in cells})
    figures["wire_errors"] = wire_errors
    return figures


def cells_from_marks(path: Path) -> list[Cell]:
    """The cells of a run written with --marks, their rates computed again from their arrivals."""
    cells = []
    for name, saved in json.loads(path.read_text()).items():
        parts = name.removeprefix("broker_").removeprefix("topic_").split("_")
        settings = parts[-1] if parts[-1] in ("defaults", "aggressive") else "defaults"
        cell = Cell(name, parts[0], parts[1], settings)
        cell.errors, cell.first_error = int(saved.get("errors", 0)), str(saved.get("first_error", ""))
        cell.marks = [(float(t), float(n)) for t, n in saved["value"]]
        cell.wire_marks = [(float(t), float(n)) for t, n in saved["wire"]]
        cell.rate = span_rate(cell.marks)
        cell.wire_rate = span_rate(cell.wire_marks) if cell.wire_marks else None
        cells.append(cell)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=46.0)
    parser.add_argument("--only", help="run only the cells whose name contains this")
    parser.add_argument(
        "--no-hold",
        action="store_true",
        help="the proxy with hold_across_connections off (each connection held on its own)",
    )
    parser.add_argument(
        "--produce-shaping",
        choices=("steady", "kafka"),
        default="steady",
        help="the proxy's produce_shaping (kafka: Kafka's windowed throttle, to compare)",
    )
    parser.add_argument("--marks", type=Path, help="write every cell's (seconds, bytes) marks here, as JSON")
    parser.add_argument(
        "--from-marks", type=Path, help="no run: the figures of the run whose --marks file this is"
    )
    args = parser.parse_args()
    if args.from_marks is not None:
        cells = cells_from_marks(args.from_marks)
        for cell in cells:
            wire_note = f"  wire {cell.wire_error:+.3f}" if cell.wire_error is not None else ""
            print(f"{cell.name:<40} {cell.rate / KiB:7.0f} KiB/s  error {cell.error:+.3f}{wire_note}")
        print(json.dumps(summarize(cells)))
        return
    planned = matrix(args.only)
    for brokers in (1, 3):
        cells = [c for b, c in planned if b == brokers]
        if cells:
            run_cluster(
                brokers, cells, args.seconds, hold=not args.no_hold, produce_shaping=args.produce_shaping
            )
    cells = [c for _b, c in planned]
    if args.marks is not None:
        saved = {
            c.name: {"value": c.marks, "wire": c.wire_marks, "errors": c.errors, "first_error": c.first_error}
            for c in cells
        }
        args.marks.write_text(json.dumps(saved))
    print(json.dumps(summarize(cells)))


if __name__ == "__main__":
    main()
