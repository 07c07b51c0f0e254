"""How fast a quota altered with Kafka's own config command through one proxy holds live clients
on every proxy instance.

Three kthrottle instances share one quota store (quota_api mode proxy) in front of one real
broker; a librdkafka producer with client id ``live`` offers 1 MiB/s through each. Kafka's
ConfigCommand sets producer_byte_rate=512 KiB/s for that client id through proxy 0, with
Kafka's default quota window (11 x 1 s). Prints one JSON line last:

  store_propagation_ms     per instance: from the command's return to /quotas/entity showing
                           the new quota
  first_throttled_s        per instance: the first second after the change whose acknowledged
                           bytes fell below half the offered rate (the throttle has begun)
  held_after_s             per instance: seconds after the change from which every full window
                           (11 s, as Kafka measures) of acknowledged bytes stays under 1.2 x the
                           quota (a windowed quota lets bursts through between long throttles)
  within_two_windows       every held_after_s <= 2 x 11 s (the issue's bound)
  rate_before_kib / rate_windows_2_3_kib   per instance, KiB/s

Usage: source dev/setup.sh && python bench/quota_api.py
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster, run_tool
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import rate_between, steady_producer

KiB = 1024
QUOTA, OFFERED = 512 * KiB, 1024 * KiB
WINDOW_S = 11.0
STORE = "__kthrottle_quotas_bench"


def main() -> None:
    with KafkaCluster(brokers=1) as cluster:
        cluster.create_topic("live", 3)
        quotas = {"clients": {"<default>": {"producer_byte_rate": 100 * 1024 * KiB}}}
        quota_api = {"mode": "proxy", "admins": ["User:ANONYMOUS"], "topic": STORE}
        proxies = [
            ProxyProcess(
                gateway_config(cluster, quotas=quotas, quota_api=quota_api, log_level="WARNING")
            ).start()
            for _ in range(3)
        ]
        stop = threading.Event()
        acked: list[list[tuple[float, int]]] = [[], [], []]
        threads = [
            threading.Thread(
                target=steady_producer, args=(p.bootstrap, "live", "live", OFFERED, stop, acked[i])
            )
            for i, p in enumerate(proxies)
        ]
        try:
            for t in threads:
                t.start()
            time.sleep(WINDOW_S + 2)
            proc = run_tool(
                "kafka.admin.ConfigCommand",
                "--bootstrap-server",
                proxies[0].bootstrap,
                "--alter",
                "--entity-type",
                "clients",
                "--entity-name",
                "live",
                "--add-config",
                f"producer_byte_rate={QUOTA}",
            )
            altered = time.monotonic()
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            propagation: list[float | None] = [None, None, None]
            while None in propagation and time.monotonic() - altered < 10:
                for i, proxy in enumerate(proxies):
                    if propagation[i] is None:
                        state = json.loads(proxy.admin_get("/quotas/entity?client_id=live")[1])
                        if state["producer_byte_rate"]["quota"] == QUOTA:
                            propagation[i] = (time.monotonic() - altered) * 1000
                time.sleep(0.02)
            time.sleep(3 * WINDOW_S)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
            for p in proxies:
                p.stop()
    end = 3 * WINDOW_S - 1 - WINDOW_S  # the last full window ends a second before the producers stop
    held: list[float | None] = []
    first: list[int | None] = []
    for a in acked:
        steps = [x / 2 for x in range(int(end * 2) + 1)]
        under = [rate_between(a, altered + t, altered + t + WINDOW_S) <= 1.2 * QUOTA for t in steps]
        last_over = max((i for i, ok in enumerate(under) if not ok), default=-1)
        held.append(steps[last_over + 1] if last_over + 1 < len(steps) else None)
        slow = [s for s in range(30) if rate_between(a, altered + s, altered + s + 1) < OFFERED / 2]
        first.append(slow[0] if slow else None)
    for i, a in enumerate(acked):
        per_second = [round(rate_between(a, altered + s, altered + s + 1) / KiB) for s in range(-3, 30)]
        print(f"instance {i}: KiB/s per second from -3 s: {per_second}", flush=True)
    print(
        json.dumps(
            {
                "store_propagation_ms": [round(p, 1) if p is not None else None for p in propagation],
                "first_throttled_s": first,
                "held_after_s": held,
                "within_two_windows": all(h is not None and h <= 2 * WINDOW_S for h in held),
                "rate_before_kib": [round(rate_between(a, altered - WINDOW_S, altered) / KiB) for a in acked],
                "rate_windows_2_3_kib": [
                    round(rate_between(a, altered + WINDOW_S, altered + 3 * WINDOW_S) / KiB) for a in acked
                ],
                "quota_kib": QUOTA // KiB,
                "window": "11 x 1 s",
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
    )


if __name__ == "__main__":
    main()
