"""Memory per connection, accept rate, and quota memory at many client ids, through a real broker.

1. Idle connections: 1,000, then 5,000 client connections opened at once to kthrottle (each
   gets its own upstream connection to the broker, as always); the proxy's RSS before and after,
   per connection, and how fast they were accepted, with any errors.
2. Quota state at 100,000 client ids: one Produce request (acks=0) from each of 100,000
   distinct client ids under a `<default>` client quota, each a bucket of its own; the proxy's
   RSS growth and the buckets it tracks, then again once the idle state has expired.

Prints one JSON line last:
  rss_per_idle_connection_kib   {"1000": .., "5000": ..}    target: under 50 KiB
  accept_rate_per_s             {"1000": .., "5000": ..}
  accept_errors                 {"1000": .., "5000": ..}    target: 0
  quota_memory_mib_100k_clients                            target: under 200 MiB
  tracked_buckets_100k / tracked_buckets_after_expiry      (expiry back to 0)
  rss_after_expiry_mib versus rss_baseline_mib; rss_after_second_wave_mib: 100,000 new ids after
  the expiry reuse the freed memory (CPython keeps freed memory for reuse rather than returning
  it to the OS, so "back to baseline" is the tracked state, and the RSS does not grow again)

Usage: source dev/setup.sh && python bench/connections.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.loadgen import open_many
from dev.proc import rss_bytes
from dev.proxy_process import ProxyProcess, gateway_config
from protocol import messages
from protocol.frames import SIZE, RequestHeader, encode_request_header

KiB, MiB = 1024, 1024 * 1024
IDLE_EXPIRY_S = 20


def wait_metric(proxy: ProxyProcess, name: str, labels: dict[str, str], want: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    value = proxy.metric(name, labels)
    while value != want and time.monotonic() < deadline:
        time.sleep(0.25)
        value = proxy.metric(name, labels)
    return value


def idle_connections(proxy: ProxyProcess, pid: int, count: int) -> dict[str, float]:
    host, port = proxy.bootstrap.split(":")
    loop = asyncio.new_event_loop()
    before = rss_bytes(pid)
    writers, errors, seconds = loop.run_until_complete(open_many(host, int(port), count))
    active = wait_metric(proxy, "kthrottle_connections_active", {"listener": "bootstrap"}, count, 60)
    time.sleep(2)  # upstream connections settle
    after = rss_bytes(pid)
    for writer in writers:
        writer.close()
    loop.run_until_complete(asyncio.sleep(0.5))
    loop.close()
    wait_metric(proxy, "kthrottle_connections_active", {"listener": "bootstrap"}, 0, 60)
    result = {
        "connections": count,
        "active_seen": active,
        "accept_errors": errors,
        "accept_rate_per_s": count / seconds,
        "rss_before_mib": before / MiB,
        "rss_after_mib": after / MiB,
        "rss_per_connection_kib": (after - before) / count / KiB,
    }
    print(json.dumps({"idle": result}), flush=True)
    return result


def produce_frame(topic: str, correlation_id: int, client_id: str, body: bytes) -> bytes:
    header = encode_request_header(RequestHeader(0, 9, correlation_id, client_id, 0))
    return SIZE.pack(len(header) + len(body)) + bytes(header) + body


def acks0_body(topic: str) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=b"x" * 100, headers=[])
    body = {
        "transactional_id": None,
        "acks": 0,
        "timeout_ms": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": bytes(builder.build())}]}],
    }
    return bytes(messages.encode(0, 9, body, response=False))


async def many_client_ids(
    host: str, port: int, topic: str, count: int, wave: int, connections: int = 8
) -> None:
    body = acks0_body(topic)
    per = count // connections

    async def one(c: int) -> None:
        _reader, writer = await asyncio.open_connection(host, port)
        for i in range(per):
            writer.write(produce_frame(topic, i, f"client-{wave}-{c}-{i}", body))
            if i % 500 == 0:
                await writer.drain()
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    await asyncio.gather(*(one(c) for c in range(connections)))


def client_ids(proxy: ProxyProcess, pid: int, cluster: KafkaCluster, count: int) -> dict[str, float]:
    cluster.create_topic("ids", 1)
    host, port = proxy.bootstrap.split(":")
    tracked = {"direction": "produce", "kind": "buckets"}
    time.sleep(1)
    before = rss_bytes(pid)
    began = time.perf_counter()
    asyncio.run(many_client_ids(host, int(port), "ids", count, wave=1))
    seen = wait_metric(proxy, "kthrottle_quota_tracked", tracked, count, 120)
    sent_s = time.perf_counter() - began
    after = rss_bytes(pid)
    expired = wait_metric(proxy, "kthrottle_quota_tracked", tracked, 0, IDLE_EXPIRY_S + 60)
    time.sleep(2)
    after_expiry = rss_bytes(pid)
    # A second wave of as many new ids: the freed memory is reused, so RSS does not grow again.
    asyncio.run(many_client_ids(host, int(port), "ids", count, wave=2))
    wait_metric(proxy, "kthrottle_quota_tracked", tracked, count, 120)
    after_second = rss_bytes(pid)
    result = {
        "client_ids": count,
        "tracked_buckets": seen,
        "seconds_to_send": sent_s,
        "rss_before_mib": before / MiB,
        "rss_after_mib": after / MiB,
        "quota_memory_mib": (after - before) / MiB,
        "tracked_after_expiry": expired,
        "rss_after_expiry_mib": after_expiry / MiB,
        "rss_after_second_wave_mib": after_second / MiB,
    }
    print(json.dumps({"client_ids": result}), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--client-ids", type=int, default=100_000)
    args = parser.parse_args()
    quotas = {
        "clients": {"<default>": {"producer_byte_rate": 100 * MiB}},
        "idle_expiry_seconds": IDLE_EXPIRY_S,
    }
    with KafkaCluster(brokers=1) as cluster:
        cfg = gateway_config(cluster, log_level="WARNING", quotas=quotas)
        with ProxyProcess(cfg) as proxy:
            assert proxy.proc is not None
            pid = proxy.proc.pid
            baseline = rss_bytes(pid)
            idle = {str(n): idle_connections(proxy, pid, n) for n in args.connections}
            ids = client_ids(proxy, pid, cluster, args.client_ids)
    print(
        json.dumps(
            {
                "rss_per_idle_connection_kib": {
                    n: round(r["rss_per_connection_kib"], 1) for n, r in idle.items()
                },
                "accept_rate_per_s": {n: round(r["accept_rate_per_s"]) for n, r in idle.items()},
                "accept_errors": {n: r["accept_errors"] for n, r in idle.items()},
                "quota_memory_mib_100k_clients": round(ids["quota_memory_mib"], 1),
                "tracked_buckets_100k": ids["tracked_buckets"],
                "tracked_buckets_after_expiry": ids["tracked_after_expiry"],
                "rss_baseline_mib": round(baseline / MiB, 1),
                "rss_after_expiry_mib": round(ids["rss_after_expiry_mib"], 1),
                "rss_after_second_wave_mib": round(ids["rss_after_second_wave_mib"], 1),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
    )


if __name__ == "__main__":
    main()
