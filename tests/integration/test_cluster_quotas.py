"""A cluster-scoped byte-rate quota holds across three proxy instances (real 3-broker cluster).

One client id produces through three proxies at once, as a client spread over a gateway's
replicas would. With ``scope: cluster`` its 3 MiB/s quota holds for the three together; per
instance (Kafka's own semantics, each broker alone) it would get 3 MiB/s from each.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUOTA = 3 * 1024 * 1024
OFFERED = 4 * 1024 * 1024  # per producer: per-instance quotas would let the three do 9 MiB/s
WINDOW = {"num": 11, "size_seconds": 0.5}  # Kafka's 11 samples, half-second: a 5.5 s cycle
WARMUP_S = 10.0  # the window lets a new client burst first; the steady span comes after
MEASURE_S = 16.5  # three whole 5.5 s cycles: a greedy client bursts once a cycle, so a span
# that ends mid-cycle counts one burst more or less than its share (15 s measured +17% once)


def test_one_client_over_three_proxies_is_held_to_the_cluster_quota(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"spread-{uuid.uuid4().hex[:6]}"
    kafka_cluster3.create_topic(topic, partitions=3, replication=1)
    exchange_topic = f"__kthrottle_cluster_test_{uuid.uuid4().hex[:8]}"
    quotas = {
        "window": WINDOW,
        "clients": {"spread": {"producer_byte_rate": QUOTA, "scope": "cluster"}},
    }
    proxies = []
    try:
        for i in range(3):
            cfg = gateway_config(
                kafka_cluster3,
                quotas=quotas,
                cluster_quotas={
                    "topic": exchange_topic,
                    "instance": f"proxy-{i}",
                    "staleness_seconds": 5,
                    "assumed_instances": 3,
                },
            )
            proxies.append(ProxyProcess(cfg, workdir=tmp_path / f"p{i}").start())
        deadline = time.monotonic() + 30
        while not all(p.metric("kthrottle_cluster_quota_instances") == 3 for p in proxies):
            assert time.monotonic() < deadline, [p.log_tail(10) for p in proxies]
            time.sleep(0.5)

        stop = threading.Event()
        acked: list[list[tuple[float, int]]] = [[], [], []]
        threads = [
            threading.Thread(
                target=steady_producer, args=(p.bootstrap, topic, "spread", OFFERED, stop, acked[i])
            )
            for i, p in enumerate(proxies)
        ]
        started = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(WARMUP_S + MEASURE_S)
        views = [p.admin_get("/quotas/cluster")[1] for p in proxies]
        stop.set()
        for t in threads:
            t.join(60)
        lo, hi = started + WARMUP_S, started + WARMUP_S + MEASURE_S
        per_proxy = [rate_between(a, lo, hi) for a in acked]
        combined = sum(per_proxy)
        series = [
            [
                round(sum(n for at, n in a if started + s <= at < started + s + 1) / QUOTA, 2)
                for s in range(int(WARMUP_S + MEASURE_S))
            ]
            for a in acked
        ]
        # Every proxy carried its share, and the three together are held to the one quota
        # (the value bytes count a little under the request bytes the quota charges).
        assert all(rate > QUOTA * 0.1 for rate in per_proxy), (per_proxy, series, views)
        assert combined == pytest.approx(QUOTA, rel=0.15), (combined, per_proxy, series, views)
        assert all(p.metric("kthrottle_cluster_quota_fallback") == 0 for p in proxies)
    finally:
        for p in proxies:
            with contextlib.suppress(Exception):
                p.stop()
