"""Throughput and latency of the proxy versus the broker direct, measured side by side in one run.

Kafka's own perf tools run alternately against the broker and through kthrottle (gateway mode,
uvloop), so both see the same machine state. Prints per-round figures, then one JSON line:

  producer_throughput_ratio   proxy / direct records/s, ProducerPerformance, 1 KiB records, acks=1
  consumer_throughput_ratio   proxy / direct records/s, ConsumerPerformance over the same topic
  added_p99_latency_ms        proxy p99 - direct p99 of Produce round trips (one 1 KiB record per
                              request, acks=1, Produce v9, one connection) at a steady 5,000 msg/s
                              after a 2 s warm-up, timed to the microsecond (ProducerPerformance
                              only reports whole milliseconds and includes its own JVM warm-up)

Usage: source dev/setup.sh && python bench/passthrough.py [--rounds 5] [--records 2000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.loadgen import CORRELATION_OFFSET, produce_request
from dev.perf_tools import consume, produce
from dev.proxy_process import ProxyProcess, gateway_config


async def _probe(host: str, port: int, topic: str, seconds: float, rate: int, warmup: float) -> list[float]:
    import asyncio

    reader, writer = await asyncio.open_connection(host, port)
    template = produce_request(topic, 0, b"x" * 1024, "latency-probe")
    sent_at: dict[int, float] = {}
    samples: list[float] = []
    total = int((seconds + warmup) * rate)
    keep_from = int(warmup * rate)

    async def receive() -> None:
        for _ in range(total):
            size = int.from_bytes(await reader.readexactly(4), "big")
            frame = await reader.readexactly(size)
            cid = int.from_bytes(frame[:4], "big")
            now = time.perf_counter()
            if cid >= keep_from:
                samples.append(now - sent_at.pop(cid))
            else:
                sent_at.pop(cid)

    receiver = asyncio.create_task(receive())
    start = time.perf_counter()
    for cid in range(total):
        delay = start + cid / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        template[CORRELATION_OFFSET : CORRELATION_OFFSET + 4] = cid.to_bytes(4, "big")
        sent_at[cid] = time.perf_counter()
        writer.write(template)
    await asyncio.wait_for(receiver, 60)
    writer.close()
    return samples


def latency_probe(
    bootstrap: str, topic: str, seconds: float, rate: int = 5000, warmup: float = 2.0
) -> dict[str, float]:
    """Produce round trips (one 1 KiB record per request, acks=1) at a fixed request rate on one
    connection, timed to the microsecond: request written -> response read."""

    import uvloop

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    samples = uvloop.run(_probe(host, int(port), topic, seconds, rate, warmup))
    samples.sort()
    return {
        "p50_ms": samples[len(samples) // 2] * 1000,
        "p99_ms": samples[int(len(samples) * 0.99)] * 1000,
        "sent": len(samples),
        "achieved_rate": rate,
        "errors": 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=2_000_000, help="records per throughput run")
    parser.add_argument("--latency-seconds", type=float, default=15, help="length of each 5,000 msg/s run")
    args = parser.parse_args()

    with (
        KafkaCluster(brokers=1) as cluster,
        ProxyProcess(gateway_config(cluster, log_level="WARNING")) as proxy,
    ):
        direct, proxied = cluster.bootstrap_servers, proxy.bootstrap
        cluster.create_topic("bench", 6)
        cluster.create_topic("latency", 1)
        # Warm up the JIT of the broker and the page cache, both ways.
        produce(direct, "bench", 50_000, -1)
        produce(proxied, "bench", 50_000, -1)

        prod: dict[str, list[float]] = {"direct": [], "proxy": []}
        cons: dict[str, list[float]] = {"direct": [], "proxy": []}
        lat: dict[str, list[float]] = {"direct": [], "proxy": []}
        for rnd in range(args.rounds):
            order = [("direct", direct), ("proxy", proxied)]
            if rnd % 2:
                order.reverse()
            for name, boot in order:
                r = produce(boot, "bench", args.records, -1)
                prod[name].append(r["rate"])
                print(f"round {rnd} produce {name}: {r['rate']:.0f} rec/s p99 {r['p99_ms']} ms", flush=True)
            for name, boot in order:
                c = consume(boot, "bench", args.records)
                cons[name].append(c["rate"])
                print(
                    f"round {rnd} consume {name}: {c['rate']:.0f} rec/s ({c['mb_per_s']:.1f} MB/s)",
                    flush=True,
                )
            for name, boot in order:
                r = latency_probe(boot, "latency", args.latency_seconds)
                lat[name].append(r["p99_ms"])
                print(
                    f"round {rnd} 5k msg/s {name}: p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms "
                    f"({r['achieved_rate']:.0f} msg/s, {r['errors']} errors)",
                    flush=True,
                )

    med = statistics.median
    figures = {
        "producer_throughput_ratio": round(med(prod["proxy"]) / med(prod["direct"]), 3),
        "consumer_throughput_ratio": round(med(cons["proxy"]) / med(cons["direct"]), 3),
        "added_p99_latency_ms": round(med(lat["proxy"]) - med(lat["direct"]), 3),
        "producer_records_per_s": {k: round(med(v)) for k, v in prod.items()},
        "consumer_records_per_s": {k: round(med(v)) for k, v in cons.items()},
        "p99_latency_ms_at_5k_msgs": {k: round(med(v), 3) for k, v in lat.items()},
        "rounds": args.rounds,
        "records_per_run": args.records,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
