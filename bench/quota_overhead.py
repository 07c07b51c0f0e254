"""Proxy CPU per request with byte-rate quotas on versus off, at 10,000 distinct client ids.

Two proxies run side by side in front of one broker: one with no quotas, one where every client
id matches a quota (a `<default>` client quota, a `<default>` user quota and a topic quota, all
far above the load, so every request is measured and checked but none is throttled). A load
generator sends the same small Produce requests through each in turn, cycling through 10,000
client ids, and the proxies' own CPU time is read from /proc. A third proxy has the same quotas
and every operator control on top (a throttle bound, exemptions by user, client id and network,
ten client-id prefixes and a client-id group that together cover most of the ids, a client-id
policy rewriting shared ids, consumer-group rates), so each request also resolves through them.
Prints one JSON line last:

  quota_overhead_us_per_request   CPU microseconds per request, all controls on minus quotas off
  quota_overhead_us_per_request_quotas_only   the KIP quotas alone, minus quotas off
  cpu_us_per_request              {off, on, controls}

Usage: source dev/setup.sh && python bench/quota_overhead.py [--requests 200000] [--rounds 3] [--ids 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.loadgen import CORRELATION_OFFSET, cpu_seconds, produce_request
from dev.proxy_process import ProxyProcess, gateway_config

CLIENT_IDS = 10_000
CONNECTIONS = 8
WINDOW = 64  # requests in flight per connection


async def _connection(host: str, port: int, frames: list[bytearray], count: int) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    sem = asyncio.Semaphore(WINDOW)

    async def receive() -> None:
        for _ in range(count):
            size = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(size)
            sem.release()

    receiver = asyncio.create_task(receive())
    for i in range(count):
        await sem.acquire()
        frame = frames[i % len(frames)]
        frame[CORRELATION_OFFSET : CORRELATION_OFFSET + 4] = i.to_bytes(4, "big")
        writer.write(frame)
    await asyncio.wait_for(receiver, 300)
    writer.close()


async def _load(bootstrap: str, requests: int, client_ids: int) -> None:
    host, port = bootstrap.rsplit(":", 1)
    per_conn = requests // CONNECTIONS
    jobs = []
    for c in range(CONNECTIONS):
        # Each connection cycles through its share of the client ids (the id is per request).
        ids = range(c, client_ids, CONNECTIONS)
        frames = [produce_request("overhead", 0, b"v" * 100, f"client-{i}") for i in ids]
        jobs.append(_connection(host, int(port), frames, per_conn))
    await asyncio.gather(*jobs)


def measure(proxy: ProxyProcess, requests: int, client_ids: int) -> float:
    """Proxy CPU microseconds per request for one run of the load."""
    assert proxy.proc is not None
    before = cpu_seconds(proxy.proc.pid)
    asyncio.run(_load(proxy.bootstrap, requests, client_ids))
    return (cpu_seconds(proxy.proc.pid) - before) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ids", type=int, default=CLIENT_IDS, help="distinct client ids cycled through")
    args = parser.parse_args()
    ids = args.ids

    big = 10 * 1024**3
    quotas = {
        "clients": {"<default>": {"producer_byte_rate": big}},
        "users": {"<default>": {"clients": {"<default>": {"producer_byte_rate": big}}}},
        "topics": {"<default>": {"producer.byte.rate": big}},
    }
    controls = {
        **quotas,
        # Consumer-group rates on every client id (they cost Produce only their stage lookup).
        "clients": {
            "<default>": {"producer_byte_rate": big, "join_group_rate": 1.0, "offset_commit_rate": 100.0}
        },
        # Empty and shared ids rewritten: every request's id is checked against the patterns.
        "client_id_policy": {
            "template": "anon-{principal}-{source_ip}",
            "shared_ids": ["rdkafka", "producer-*"],
        },
        "max_throttle_ms": 5000,
        "exempt": {
            "users": ["ops"],
            "client_ids": [f"client-{i}" for i in range(0, ids, 100)],
            "source_cidrs": ["10.99.0.0/16", "fd00::/16"],
        },
        "client_id_prefixes": {f"client-{d}": {"producer_byte_rate": big} for d in range(1, 10)},
        "groups": {
            "tools": {
                "client_ids": [f"client-{i}" for i in range(5, ids, 50)],
                "producer_byte_rate": big,
            }
        },
    }
    with KafkaCluster(brokers=1) as cluster:
        cluster.create_topic("overhead")
        with (
            ProxyProcess(gateway_config(cluster, log_level="WARNING")) as off,
            ProxyProcess(gateway_config(cluster, log_level="WARNING", quotas=quotas)) as on,
            ProxyProcess(gateway_config(cluster, log_level="WARNING", quotas=controls)) as all_on,
        ):
            proxies = {"off": off, "on": on, "controls": all_on}
            for proxy in proxies.values():  # warm-up
                measure(proxy, args.requests // 4, ids)
            results: dict[str, list[float]] = {name: [] for name in proxies}
            for rnd in range(args.rounds):
                names = list(proxies) if rnd % 2 == 0 else list(reversed(proxies))
                for name, proxy in [(n, proxies[n]) for n in names]:
                    us = measure(proxy, args.requests, ids)
                    results[name].append(us)
                    print(f"round {rnd} quotas {name}: {us:.1f} us CPU per request", flush=True)
            entities = on.metric("kthrottle_client_byte_rate") > 0
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        json.dumps(
            {
                "quota_overhead_us_per_request": round(med["controls"] - med["off"], 2),
                "quota_overhead_us_per_request_quotas_only": round(med["on"] - med["off"], 2),
                "cpu_us_per_request": {k: round(v, 2) for k, v in med.items()},
                "distinct_client_ids": ids,
                "requests_per_run": args.requests,
                "rounds": args.rounds,
                "quota_state_exported": entities,
            }
        )
    )


if __name__ == "__main__":
    main()
