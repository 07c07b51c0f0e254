"""How close the proxy holds a client to its quota, next to the broker holding it to the same quota.

For produce and fetch, at two quota sizes, the same client (Kafka's perf producer, or
librdkafka consuming) runs twice in one run: through kthrottle with the quota in its config
(broker without quotas), and straight to a broker whose own quota was set with Kafka's config
command. Produce samples broker-side bytes (log end offsets); fetch samples the response bytes
librdkafka received off the wire (its rxbytes stat), which is what the quota counts. Samples are
taken every 0.25 s; the steady-state rate is the median over every quota.window.num x size (11 s)
window after the first burst. Prints one JSON line last:

  <direction>_<quota KiB>_proxy_error      |steady rate - quota| / quota through the proxy
  <direction>_<quota KiB>_broker_error     the same with the broker's own quota
  max_proxy_error, max_broker_error

Usage: source dev/setup.sh && python bench/quota_accuracy.py [--seconds 45]
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster, run_tool
from dev.perf_tools import greedy_producer_command
from dev.proxy_process import ProxyProcess, gateway_config

KiB = 1024
CYCLE = 11.0
STEADY_FROM = 12.0


def median_cycle_rate(samples: list[tuple[float, float]], t_from: float, t_to: float) -> float:
    times = [t for t, _ in samples]

    def at(x: float) -> float:
        return samples[max(0, bisect.bisect_right(times, x) - 1)][1]

    starts = [t_from + 0.25 * i for i in range(int((t_to - CYCLE - t_from) / 0.25) + 1)]
    return statistics.median((at(x + CYCLE) - at(x)) / CYCLE for x in starts)


def topic(cluster: KafkaCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(name)
    return name


def produce_run(cluster: KafkaCluster, bootstrap: str, client_id: str, seconds: float) -> float:
    from kafka import KafkaConsumer, TopicPartition

    name = topic(cluster, "acc-p")
    cmd = greedy_producer_command(bootstrap, name, client_id, 100_000_000)
    watcher = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers)
    tp = TopicPartition(name, 0)
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - start < seconds:
            samples.append((time.monotonic() - start, watcher.end_offsets([tp])[tp] * 1024.0))
            time.sleep(0.25)
    finally:
        perf.kill()
        perf.wait(30)
        watcher.close()
    return median_cycle_rate(samples, STEADY_FROM, seconds)


def fetch_run(cluster: KafkaCluster, bootstrap: str, client_id: str, seconds: float, quota: float) -> float:
    """Steady rate of fetch response bytes, as librdkafka counted them off the wire (``rxbytes``).

    The quota counts whole responses (record batch framing, headers, the response envelope), so
    that is what is compared with it; value bytes would read several percent low.
    """
    from confluent_kafka import Consumer

    name = topic(cluster, "acc-f")
    records = int(quota * (seconds + 20) / 1024)
    cluster.fill_topic(name, records)
    samples: list[tuple[float, float]] = []
    start = time.monotonic()

    def on_stats(raw: str) -> None:
        brokers = json.loads(raw).get("brokers", {}).values()
        samples.append((time.monotonic() - start, float(sum(b.get("rxbytes", 0) for b in brokers))))

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{name}",
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 262144,
            "statistics.interval.ms": 250,
            "stats_cb": on_stats,
        }
    )
    consumer.subscribe([name])
    samples.append((0.0, 0.0))
    while time.monotonic() - start < seconds:
        consumer.consume(num_messages=1000, timeout=0.25)
    consumer.close()
    return median_cycle_rate(samples, STEADY_FROM, seconds)


def set_broker_quota(cluster: KafkaCluster, client_id: str, key: str, value: int | None) -> None:
    action = ["--add-config", f"{key}={value}"] if value is not None else ["--delete-config", key]
    proc = run_tool(
        "kafka.admin.ConfigCommand",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        client_id,
        *action,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    time.sleep(2)  # let the quota reach the broker's quota manager


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--quotas-kib", default="512,2048", help="two quota sizes in KiB/s")
    args = parser.parse_args()
    sizes = [int(x) * KiB for x in args.quotas_kib.split(",")]

    figures: dict[str, float] = {}
    with KafkaCluster(brokers=1) as cluster:
        for direction, key in (("produce", "producer_byte_rate"), ("fetch", "consumer_byte_rate")):
            for quota in sizes:
                label = f"{direction}_{quota // KiB}"
                client = f"acc-{label}"
                quotas = {"clients": {client: {key: quota}}}
                with ProxyProcess(gateway_config(cluster, quotas=quotas, log_level="WARNING")) as proxy:
                    if direction == "produce":
                        via_proxy = produce_run(cluster, proxy.bootstrap, client, args.seconds)
                    else:
                        via_proxy = fetch_run(cluster, proxy.bootstrap, client, args.seconds, quota)
                set_broker_quota(cluster, client, key, quota)
                try:
                    if direction == "produce":
                        via_broker = produce_run(cluster, cluster.bootstrap_servers, client, args.seconds)
                    else:
                        via_broker = fetch_run(
                            cluster, cluster.bootstrap_servers, client, args.seconds, quota
                        )
                finally:
                    set_broker_quota(cluster, client, key, None)
                figures[f"{label}_proxy_error"] = round(abs(via_proxy - quota) / quota, 4)
                figures[f"{label}_broker_error"] = round(abs(via_broker - quota) / quota, 4)
                print(
                    f"{label}: quota {quota / KiB:.0f} KiB/s, proxy {via_proxy / KiB:.0f} KiB/s, "
                    f"broker {via_broker / KiB:.0f} KiB/s",
                    flush=True,
                )
    figures["max_proxy_error"] = max(v for k, v in figures.items() if k.endswith("_proxy_error"))
    figures["max_broker_error"] = max(v for k, v in figures.items() if k.endswith("_broker_error"))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
