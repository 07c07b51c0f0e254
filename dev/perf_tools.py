"""Kafka's own perf tools (ProducerPerformance, ConsumerPerformance) as functions for the benchmarks."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from dev.harness import java_command

PRODUCER = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER = "org.apache.kafka.tools.ConsumerPerformance"

_SUMMARY = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec .*?, ([\d.]+) ms avg latency, ([\d.]+) ms max latency, "
    r"(\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th"
)


def run(main: str, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        java_command(main, *args, heap="1g"), capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{main} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc.stdout


def producer_args(
    topic: str, records: int, throughput: int, *options: str, props: list[str], linger_ms: int = 5
) -> list[str]:
    """ProducerPerformance's arguments for ``records`` 1 KiB records (``throughput`` -1: as fast as it
    is let); ``options`` go before the producer settings ``props`` (``linger.ms`` added)."""
    return [
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        "1024",
        "--throughput",
        str(throughput),
        *options,
        "--producer-props",
        *props,
        f"linger.ms={linger_ms}",
    ]


def greedy_producer_command(
    bootstrap: str, topic: str, client_id: str, records: int, *options: str
) -> list[str]:
    """ProducerPerformance sending ``records`` 1 KiB records as fast as it is let (acks=1, linger 5 ms):
    a client held by a quota. ``options`` go before the producer settings (``--print-metrics``)."""
    props = [f"bootstrap.servers={bootstrap}", f"client.id={client_id}", "acks=1"]
    return java_command(PRODUCER, *producer_args(topic, records, -1, *options, props=props))


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    throughput: int,
    acks: str = "1",
    batch_size: int = 65536,
    props: Mapping[str, str] | None = None,
    linger_ms: int = 5,
) -> dict[str, float]:
    """ProducerPerformance's summary; ``props``: more producer settings (TLS, say)."""
    settings = [
        f"bootstrap.servers={bootstrap}",
        f"acks={acks}",
        f"batch.size={batch_size}",
        *(f"{k}={v}" for k, v in (props or {}).items()),
    ]
    out = run(PRODUCER, *producer_args(topic, records, throughput, props=settings, linger_ms=linger_ms))
    match = _SUMMARY.findall(out)
    if not match:
        raise RuntimeError(f"no summary in ProducerPerformance output:\n{out[-2000:]}")
    sent, rate, avg, _mx, p50, _p95, p99 = match[-1]
    return {
        "records": int(sent),
        "rate": float(rate),
        "avg_ms": float(avg),
        "p50_ms": float(p50),
        "p99_ms": float(p99),
    }


def consume(bootstrap: str, topic: str, records: int, command_config: Path | None = None) -> dict[str, float]:
    """ConsumerPerformance's summary; ``command_config``: a properties file of more settings."""
    extra = ["--consumer.config", str(command_config)] if command_config is not None else []
    out = run(
        CONSUMER,
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--messages",
        str(records),
        "--timeout",
        "120000",
        *extra,
    )
    rows = [line for line in out.splitlines() if line[:1].isdigit()]
    if not rows:
        raise RuntimeError(f"no summary in ConsumerPerformance output:\n{out[-2000:]}")
    cols = [c.strip() for c in rows[-1].split(",")]
    # start, end, MB, MB/s, nMsg, nMsg/s, rebalance ms, fetch ms, fetch MB/s, fetch nMsg/s
    return {"records": int(cols[4]), "rate": float(cols[9]), "mb_per_s": float(cols[8])}
