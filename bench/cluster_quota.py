"""A cluster-scoped byte-rate quota over three proxy instances: accuracy, convergence, exchange.

A real 3-broker cluster and three proxies in gateway mode; one client id ("spread") produces
through all three at once, each producer offering 4 MiB/s, under a 3 MiB/s producer_byte_rate.
In one run:

1. per instance (scope: instance, Kafka's semantics): the combined rate the three get;
2. scope: cluster: the combined rate over a steady span after the first burst, and its error;
3. a step change: two of the three producers stop; the time until the one left is held within
   15% of the whole quota (its 3 s moving rate), from the step;
4. the exchange: each instance's lag (its report's age when read back) and the report's size, and
   the size of a report for 1,000 active client ids, from which the topic's size per thousand
   clients follows (one report per instance per second, kept for the topic's retention).

Prints progress, then one JSON line last:

  instance_scope_combined_bps, cluster_scope_combined_bps, quota_bps
  combined_rate_error            |cluster combined - quota| / quota over MEASURE_S seconds
  converge_after_step_s          seconds from the step until the producer left is within 15%
  exchange_lag_ms_max            the largest lag seen on the three instances
  report_bytes_per_1000_clients  one instance's report with 1,000 buckets
  topic_bytes_per_1000_clients_per_instance   report bytes x reports kept (retention 600 s)

Usage: source dev/setup.sh && python bench/cluster_quota.py
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import rate_between, steady_producer
from quota.cluster import report

QUOTA = 3 * 1024 * 1024
OFFERED = 4 * 1024 * 1024
WARMUP_S = 20.0
MEASURE_S = 30.0
STEP_WATCH_S = 40.0
RETENTION_S = 600.0


def log(message: str) -> None:
    print(f"cluster_quota: {message}", file=sys.stderr, flush=True)


def start_proxies(cluster: KafkaCluster, scope: str, workdir: Path) -> list[ProxyProcess]:
    topic = f"__kthrottle_cluster_bench_{uuid.uuid4().hex[:8]}"
    quotas = {"clients": {"spread": {"producer_byte_rate": QUOTA, "scope": scope}}}
    proxies = []
    for i in range(3):
        cfg = gateway_config(
            cluster,
            quotas=quotas,
            cluster_quotas={"topic": topic, "instance": f"bench-{i}", "assumed_instances": 3},
        )
        proxies.append(ProxyProcess(cfg, workdir=workdir / f"{scope}-{i}").start())
    if scope == "cluster":
        deadline = time.monotonic() + 60
        while not all(p.metric("kthrottle_cluster_quota_instances") == 3 for p in proxies):
            if time.monotonic() > deadline:
                raise SystemExit("cluster_quota: the three instances never saw each other")
            time.sleep(0.5)
    return proxies


def run_load(proxies: list[ProxyProcess], topic: str, step: bool) -> tuple[float, float | None, list[float]]:
    """Combined rate over the steady span; with ``step``, the convergence time after two of the
    three producers stop; and the lags sampled on the instances meanwhile."""
    stops = [threading.Event() for _ in proxies]
    acked: list[list[tuple[float, int]]] = [[] for _ in proxies]
    threads = [
        threading.Thread(
            target=steady_producer, args=(p.bootstrap, topic, "spread", OFFERED, stops[i], acked[i])
        )
        for i, p in enumerate(proxies)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    lags: list[float] = []
    while time.monotonic() < started + WARMUP_S + MEASURE_S:
        time.sleep(1.0)
        if step:
            lags += [p.metric("kthrottle_cluster_quota_exchange_lag_seconds") * 1000 for p in proxies]
    lo, hi = started + WARMUP_S, started + WARMUP_S + MEASURE_S
    combined = sum(rate_between(a, lo, hi) for a in acked)
    converged: float | None = None
    if step:
        stops[1].set()
        stops[2].set()
        step_at = time.monotonic()
        while time.monotonic() < step_at + STEP_WATCH_S:
            time.sleep(0.5)
            now = time.monotonic()
            if now - step_at >= 3.0 and abs(rate_between(acked[0], now - 3.0, now) - QUOTA) <= 0.15 * QUOTA:
                converged = round(now - step_at, 1)
                break
    for s in stops:
        s.set()
    for t in threads:
        t.join(60)
    return combined, converged, lags


def report_sizes() -> int:
    """Bytes of one instance's report with 1,000 active client ids (realistic names)."""
    rates = [("p", ("", f"client-{i:04d}-app"), 123456.7) for i in range(1000)]
    return len(report("proxy-7f9c-1234", time.time() * 1000, rates).encode())


def main() -> None:
    results: dict[str, Any] = {"quota_bps": QUOTA}
    with (
        tempfile.TemporaryDirectory(prefix="cluster-quota-bench-") as tmp,
        KafkaCluster(brokers=3) as cluster,
    ):
        log(f"3-broker cluster at {cluster.bootstrap_servers}")
        for scope in ("instance", "cluster"):
            topic = f"spread-{scope}-{uuid.uuid4().hex[:6]}"
            cluster.create_topic(topic, partitions=3, replication=1)
            proxies = start_proxies(cluster, scope, Path(tmp))
            try:
                log(f"scope {scope}: three producers at {OFFERED / 2**20:.0f} MiB/s each, quota 3 MiB/s")
                combined, converged, lags = run_load(proxies, topic, step=scope == "cluster")
            finally:
                for p in proxies:
                    with contextlib.suppress(Exception):
                        p.stop()
            log(f"scope {scope}: combined {combined / 2**20:.2f} MiB/s")
            results[f"{scope}_scope_combined_bps"] = round(combined)
            if scope == "cluster":
                results["combined_rate_error"] = round(abs(combined - QUOTA) / QUOTA, 4)
                results["converge_after_step_s"] = converged
                results["exchange_lag_ms_max"] = round(max(lags), 1) if lags else None
                results["exchange_lag_ms_median"] = round(sorted(lags)[len(lags) // 2], 1) if lags else None
                log(f"after the step: within 15% in {converged} s; exchange lag max {max(lags):.0f} ms")
    size = report_sizes()
    results["report_bytes_per_1000_clients"] = size
    results["topic_bytes_per_1000_clients_per_instance"] = int(size * RETENTION_S)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
