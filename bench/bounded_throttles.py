"""Bounded throttles (``quotas.max_throttle_ms``): a consumer greedy for ten times its quota and
more, of a topic written in 512 KiB record batches on a 256 KiB/s quota (every fetch two seconds
of quota: Kafka returns a batch whole, KIP-74), through two proxies side by side against one real
broker: one unbounded, one with a one-second bound. Over ``--seconds`` (60 by default):

  bounded_max_throttle_ms      the longest throttle librdkafka reported, bounded (target <= 1000)
  bounded_rate_error           the bounded consumer's rate over seconds 12 to the end against the
                               quota (a least-squares slope; target within 0.05)
  bounded_refused_fetches      fetches answered empty while the entity owed
  unbounded_max_throttle_ms    the same consumer unbounded (about 2000: a batch's worth)
  unbounded_rate_error

Prints one JSON line last. Usage: source dev/setup.sh && python bench/bounded_throttles.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import ConsumerRun, greedy_consumer

KiB = 1024
QUOTA = 256 * KiB
BATCH = 512 * KiB
BOUND = 1000
STEADY_FROM = 12.0


def run(seconds: float) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="kthrottle-bounded-") as tmp,
        KafkaCluster(brokers=1, workdir=Path(tmp) / "kafka") as cluster,
    ):
        topics = {}
        for name in ("bounded", "unbounded"):
            topics[name] = f"bench-{name}-{uuid.uuid4().hex[:6]}"
            cluster.create_topic(topics[name], partitions=1)
            # Ten times what the quota lets through, and more: the consumer never runs dry.
            cluster.fill_topic(topics[name], int(12 * QUOTA * seconds / KiB), batch_bytes=BATCH)
        proxies = {
            name: ProxyProcess(
                gateway_config(
                    cluster,
                    quotas={
                        "clients": {f"{name}-c": {"consumer_byte_rate": QUOTA}},
                        "max_throttle_ms": BOUND if name == "bounded" else None,
                    },
                ),
                workdir=Path(tmp) / name,
            ).start()
            for name in topics
        }
        try:
            with ThreadPoolExecutor(2) as pool:
                futures = {
                    name: pool.submit(greedy_consumer, proxies[name].bootstrap, topic, f"{name}-c", seconds)
                    for name, topic in topics.items()
                }
                runs: dict[str, ConsumerRun] = {name: f.result() for name, f in futures.items()}
            refused = proxies["bounded"].metric(
                "kthrottle_bounded_throttles_total", {"api": "Fetch", "outcome": "refused"}
            )
        finally:
            for proxy in proxies.values():
                proxy.stop()
    figures: dict[str, Any] = {"seconds": seconds, "quota_bytes_per_s": QUOTA, "batch_bytes": BATCH}
    for name, got in runs.items():
        figures[f"{name}_max_throttle_ms"] = got.max_throttle(3.0)
        figures[f"{name}_rate_error"] = round(got.slope(STEADY_FROM) / QUOTA - 1, 4)
    figures["bounded_refused_fetches"] = int(refused)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    figures = run(args.seconds)
    print(
        f"bounded: max throttle {figures['bounded_max_throttle_ms']} ms, rate error "
        f"{figures['bounded_rate_error']:+.2%}; unbounded: {figures['unbounded_max_throttle_ms']} ms, "
        f"{figures['unbounded_rate_error']:+.2%}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
