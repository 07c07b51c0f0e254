"""What traffic capture costs: throughput through the proxy with capture on versus off, in one run.

Two proxies stand in front of the same broker, identical but for `capture.enabled`. Kafka's perf
producer and consumer alternate between them, round by round (the order flips each round), so
both see the same machine state. Prints per-round figures, then one JSON line:

  capture_throughput_ratio           on / off records/s, producer and consumer together (geometric mean)
  producer_ratio, consumer_ratio     each on its own (medians over the rounds)
  records_captured, records_dropped  what the capturing proxy wrote and dropped
  capture_bytes_per_record           Parquet (zstd) bytes per captured request

Target: capture_throughput_ratio >= 0.95.

Usage: source dev/setup.sh && python bench/capture_overhead.py [--rounds 5] [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.perf_tools import consume, produce
from dev.proxy_process import ProxyProcess, gateway_config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000, help="1 KiB records per run")
    parser.add_argument("--batch-size", type=int, default=16384, help="producer batch.size (requests)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kthrottle-capture-") as tmp:
        capture_dir = Path(tmp) / "capture"
        capture = {"enabled": True, "directory": str(capture_dir), "instance": "bench"}
        with (
            KafkaCluster(brokers=1) as cluster,
            ProxyProcess(gateway_config(cluster, log_level="WARNING")) as plain,
            ProxyProcess(gateway_config(cluster, log_level="WARNING", capture=capture)) as capturing,
        ):
            cluster.create_topic("bench", 6)
            for proxy in (plain, capturing):  # warm up the broker's JIT and the page cache both ways
                produce(proxy.bootstrap, "bench", 50_000, -1, batch_size=args.batch_size)
            prod: dict[str, list[float]] = {"off": [], "on": []}
            cons: dict[str, list[float]] = {"off": [], "on": []}
            for rnd in range(args.rounds):
                order = [("off", plain.bootstrap), ("on", capturing.bootstrap)]
                if rnd % 2:
                    order.reverse()
                for name, boot in order:
                    rate = produce(boot, "bench", args.records, -1, batch_size=args.batch_size)["rate"]
                    prod[name].append(rate)
                    print(f"round {rnd} produce capture {name}: {rate:.0f} rec/s", flush=True)
                for name, boot in order:
                    rate = consume(boot, "bench", args.records)["rate"]
                    cons[name].append(rate)
                    print(f"round {rnd} consume capture {name}: {rate:.0f} rec/s", flush=True)
            captured = capturing.metric("kthrottle_capture_records_total", {})
            dropped = capturing.metric("kthrottle_capture_dropped_total", {})
        files = list(capture_dir.glob("*.parquet"))
        size = sum(f.stat().st_size for f in files)

    med = statistics.median
    producer_ratio = med(prod["on"]) / med(prod["off"])
    consumer_ratio = med(cons["on"]) / med(cons["off"])
    figures = {
        "capture_throughput_ratio": round(math.sqrt(producer_ratio * consumer_ratio), 3),
        "producer_ratio": round(producer_ratio, 3),
        "consumer_ratio": round(consumer_ratio, 3),
        "producer_records_per_s": {k: round(med(v)) for k, v in prod.items()},
        "consumer_records_per_s": {k: round(med(v)) for k, v in cons.items()},
        "records_captured": captured,
        "records_dropped": dropped,
        "capture_files": len(files),
        "capture_bytes_per_record": round(size / captured, 1) if captured else None,
        "rounds": args.rounds,
        "records_per_run": args.records,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
