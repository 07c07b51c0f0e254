"""A producer-id storm through the proxy (KIP-936's producer_ids_rate), beside a well-behaved user.

User alice starts short-lived idempotent librdkafka producers (one record each) from several
threads as fast as they go; user bob runs one long-lived idempotent producer. Both are under the
<default> user's producer_ids_rate. The run is done twice in one go: once with the quota off
(how fast the storm goes unchecked) and once with it on. Prints one JSON line last:

  storm_unchecked_ids_per_s   new producer ids per second with no quota
  storm_ids_per_s             the same with the quota, over the steady span
  storm_to_quota_ratio        storm_ids_per_s / quota (target: about 1, at most 1.3)
  long_lived_throttle_ms      the largest throttle bob's producer saw (target: 0)
  filter_bytes_alice          memory of alice's bloom filters, and filter_bytes_bound its bound
  filter_bytes_total          all users' filters

Usage: source dev/setup.sh && python bench/producer_id_storm.py [--seconds 60] [--quota 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import StormResult, librdkafka_sasl, producer_id_storm

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
STEADY_FROM = 15.0


def sasl(user: str) -> dict[str, Any]:
    return librdkafka_sasl(user, USERS[user])


def run(
    cluster: KafkaCluster, quotas: dict[str, Any], seconds: float
) -> tuple[StormResult, dict[str, Any], float]:
    storm, steady = f"storm-{uuid.uuid4().hex[:6]}", f"steady-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(storm)
    cluster.create_topic(steady)
    cfg = gateway_config(cluster, log_level="WARNING")
    cfg["gateway"]["upstream_bootstrap"] = cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "alice", "password": USERS["alice"]}
    cfg["quotas"] = quotas
    with ProxyProcess(cfg) as proxy:
        result = producer_id_storm(proxy.bootstrap, sasl("alice"), sasl("bob"), storm, steady, seconds)
        alice = json.loads(proxy.admin_get("/quotas/entity?user=alice")[1])["producer_ids_rate"]
        total = proxy.metric("kthrottle_producer_id_filter_bytes_total", {})
    return result, alice, total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--quota", type=float, default=4.0, help="producer_ids_rate, new ids per second")
    parser.add_argument("--filter-bytes", type=int, default=8192, help="producer_ids.max_bytes_per_user")
    args = parser.parse_args()
    tracking = {
        "window": {"num": 5, "size_seconds": 2},
        "max_bytes_per_user": args.filter_bytes,
        "false_positive_rate": 0.01,
    }
    with KafkaCluster(brokers=1, sasl_users=USERS) as cluster:
        free, _, _ = run(cluster, {"producer_ids": tracking}, args.seconds / 2)
        unchecked = free.rate(5.0, args.seconds / 2)
        print(f"unchecked storm: {unchecked:.1f} new producer ids/s", flush=True)
        quotas = {"users": {"<default>": {"producer_ids_rate": args.quota}}, "producer_ids": tracking}
        held, alice, total = run(cluster, quotas, args.seconds)
    rate = held.rate(STEADY_FROM, args.seconds)
    print(
        f"with quota {args.quota:g}/s: {rate:.1f} new ids/s; bob's largest throttle "
        f"{held.steady_throttles.max} ms; alice's filters {alice['filters']}",
        flush=True,
    )
    figures = {
        "storm_unchecked_ids_per_s": round(unchecked, 2),
        "storm_ids_per_s": round(rate, 2),
        "quota_ids_per_s": args.quota,
        "storm_to_quota_ratio": round(rate / args.quota, 3),
        "long_lived_throttle_ms": held.steady_throttles.max,
        "long_lived_errors": len(held.steady_errors),
        "filter_bytes_alice": alice["filters"]["bytes"],
        "filter_bytes_bound": args.filter_bytes,
        "filter_bytes_total": total,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
