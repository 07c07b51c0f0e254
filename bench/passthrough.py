"""Throughput and latency of the proxy versus the broker direct, measured side by side in one run.

Kafka's own perf tools run alternately against the broker and through kthrottle (gateway mode,
uvloop, no quotas), so both see the same machine state. Prints per-round figures, then one JSON
line of medians over the rounds:

  producer_throughput_ratio   proxy / direct records/s, ProducerPerformance, 1 KiB records, acks=1
  consumer_throughput_ratio   proxy / direct records/s, ConsumerPerformance over the same topic
  proxy_cpu_s_per_gb          the proxy process's CPU seconds (utime + stime) per GB (1e9 bytes)
                              of record values that went through it, per workload:
                                bulk_produce      the produce run above (64 KiB batches, linger 5 ms)
                                bulk_fetch        the consume run above
                                small_5k          5,000 msg/s of 1 KiB, linger.ms=0: small requests
                                small_saturating  1 KiB records as fast as they go, linger.ms=0
  small_request_cpu_to_floor  small_5k CPU per GB over the bare relay's on the same shape of
                              requests (bench/relay_floor.py, run in the same rounds)
  small_request_cpu_to_relay_same_traffic,
  bulk_fetch_cpu_to_relay_same_traffic
                              small_5k (bulk_fetch) CPU per GB over relay_floor's selector relay's
                              (a process of its own) carrying the same workload from the same
                              Java client to the same broker in the same rounds (the broker
                              advertises the relay's port on a listener of its own): the floor
                              under the same load, records per request and caches
  bulk_fetch_cpu_to_floor     bulk_fetch CPU per GB over the bare relay copying bytes in and out
                              of user space (bench/relay_floor.py's bulk copy, same rounds)
  added_median_latency_ms,    proxy - direct median and p99 of Produce round trips (one 1 KiB
  added_p99_latency_ms        record per request, acks=1, Produce v9, one connection) at a steady
                              5,000 msg/s after a 2 s warm-up, timed to the microsecond
                              (ProducerPerformance only reports whole milliseconds and includes
                              its own JVM warm-up)
  relay_added_median_latency_ms
                              the same for the bare relay: what one more hop in Python adds

Usage: source dev/setup.sh && python bench/passthrough.py [--rounds 3] [--records 2000000]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay_floor

from dev.harness import KafkaCluster
from dev.loadgen import CORRELATION_OFFSET, produce_request
from dev.perf_tools import consume, produce
from dev.proxy_process import ProxyProcess, gateway_config


async def _probe(
    host: str, port: int, topic: str, seconds: float, rate: int, warmup: float
) -> tuple[list[float], list[bytes], float]:
    """Round-trip samples after the warm-up, every response frame, and the seconds the sending
    took (the rate achieved is the requests over that)."""
    import asyncio

    reader, writer = await asyncio.open_connection(host, port)
    template = produce_request(topic, 0, b"x" * 1024, "latency-probe")
    sent_at: dict[int, float] = {}
    samples: list[float] = []
    frames: list[bytes] = []
    total = int((seconds + warmup) * rate)
    keep_from = int(warmup * rate)

    async def receive() -> None:
        for _ in range(total):
            size = int.from_bytes(await reader.readexactly(4), "big")
            frame = await reader.readexactly(size)
            cid = int.from_bytes(frame[:4], "big")
            now = time.perf_counter()
            frames.append(frame)
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
    sending = time.perf_counter() - start
    await asyncio.wait_for(receiver, 60)
    writer.close()
    return samples, frames, sending


def produce_errors(frames: list[bytes]) -> int:
    """Partitions answered with an error code, over Produce v9 response frames (correlation id and
    an empty tag buffer, then the body)."""
    from protocol.messages import decode_response

    errors = 0
    for frame in frames:
        body = decode_response(0, 9, memoryview(frame)[5:])
        for topic in body["responses"]:
            errors += sum(1 for p in topic["partition_responses"] if p["error_code"] != 0)
    return errors


def latency_probe(
    bootstrap: str, topic: str, seconds: float, rate: int = 5000, warmup: float = 2.0
) -> dict[str, float]:
    """Produce round trips (one 1 KiB record per request, acks=1) at a fixed request rate on one
    connection, timed to the microsecond: request written -> response read."""

    import uvloop

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    samples, frames, sending = uvloop.run(_probe(host, int(port), topic, seconds, rate, warmup))
    samples.sort()
    return {
        "p50_ms": samples[len(samples) // 2] * 1000,
        "p99_ms": samples[int(len(samples) * 0.99)] * 1000,
        "sent": len(frames),
        "achieved_rate": len(frames) / sending if sending > 0 else 0.0,
        "errors": produce_errors(frames),
    }


SMALL_RATE = 5000
SMALL_RECORDS = 60_000  # 12 s at 5,000 msg/s
SATURATING_RECORDS = 400_000


def cpu_per_gb(
    pid: int | None, records: int, work: Callable[[], dict[str, float]]
) -> tuple[dict[str, float], float]:
    """Run ``work`` (``records`` 1 KiB records through the proxy); its result and the proxy's CPU
    seconds per GB of the record values it reports done (0 when ``pid`` is None: the run was
    direct). A run that did fewer records than asked is said, and counted as it was."""
    before = relay_floor.cpu_times(pid) if pid is not None else (0.0, 0.0)
    result = work()
    after = relay_floor.cpu_times(pid) if pid is not None else (0.0, 0.0)
    user, system = after[0] - before[0], after[1] - before[1]
    result["user_share"] = user / (user + system) if user + system else 0.0
    done = int(result.get("records", records))
    if done != records:
        print(f"asked for {records} records, {done} done: CPU per GB counts the {done}", flush=True)
    return result, (user + system) / (max(done, 1) * 1024 / 1e9)


def workloads(records: int) -> dict[str, tuple[int, Callable[[str], dict[str, float]]]]:
    """Name -> (records, run against a bootstrap): the throughput and CPU workloads of a round."""

    def small(count: int, rate: int) -> Callable[[str], dict[str, float]]:
        return lambda boot: produce(boot, "small", count, rate, batch_size=16384, linger_ms=0)

    return {
        "bulk_produce": (records, lambda boot: produce(boot, "bench", records, -1)),
        "bulk_fetch": (records, lambda boot: consume(boot, "bench", records)),
        "small_5k": (SMALL_RECORDS, small(SMALL_RECORDS, SMALL_RATE)),
        "small_saturating": (SATURATING_RECORDS, small(SATURATING_RECORDS, -1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=2_000_000, help="records per throughput run")
    parser.add_argument("--latency-seconds", type=float, default=15, help="length of each 5,000 msg/s run")
    parser.add_argument(
        "--only", help="comma-separated workloads to run (a quick look; the figures need them all)"
    )
    args = parser.parse_args()
    plan = workloads(args.records)
    only = args.only.split(",") if args.only else list(plan)
    unknown = [name for name in only if name not in plan]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; the workloads: {', '.join(plan)}")
    if "bulk_fetch" in only and "bulk_produce" not in only:
        parser.error("bulk_fetch reads what bulk_produce wrote in the same round: give both")
    plan = {name: plan[name] for name in only}

    with (
        KafkaCluster(brokers=1, relayed_listeners=("FLOOR",)) as cluster,
        ProxyProcess(gateway_config(cluster, log_level="WARNING")) as proxy,
        relay_floor.RelayServer(
            cluster.nodes[0].relayed["FLOOR"][1], ("127.0.0.1", cluster.nodes[0].relayed["FLOOR"][0])
        ) as relay,
    ):
        direct, proxied = cluster.bootstrap_servers, proxy.bootstrap
        relayed = cluster.nodes[0].relayed_address("FLOOR")
        cluster.create_topic("bench", 6)
        cluster.create_topic("small", 6)
        cluster.create_topic("latency", 1)
        # Warm up the JIT of the broker and the page cache, both ways.
        produce(direct, "bench", 50_000, -1)
        produce(proxied, "bench", 50_000, -1)
        produce(relayed, "small", 10_000, -1)
        assert proxy.proc is not None
        proxy_pid = proxy.proc.pid
        rates: dict[str, dict[str, list[float]]] = {w: {"direct": [], "proxy": []} for w in plan}
        cpu: dict[str, list[float]] = {w: [] for w in plan}
        lat50: dict[str, list[float]] = {"direct": [], "proxy": [], "relay": []}
        lat99: dict[str, list[float]] = {"direct": [], "proxy": [], "relay": []}
        floor: dict[str, list[float]] = {"small_5k": [], "bulk_fetch": []}
        # small_5k and bulk_fetch through the bare relay in front of the broker, its CPU per GB
        relay_cpu: dict[str, list[float]] = {w: [] for w in ("small_5k", "bulk_fetch") if w in plan}
        per_request: dict[str, list[float]] = {"small_5k": []}  # records per Produce request
        for rnd in range(args.rounds):
            order = [("direct", direct), ("proxy", proxied)]
            if rnd % 2:
                order.reverse()
            for workload, (records, run) in plan.items():
                for name, boot in order:
                    pid = proxy_pid if name == "proxy" else None
                    produced = proxy.metric("kthrottle_requests_total", {"api": "Produce"})
                    result, per_gb = cpu_per_gb(pid, records, functools.partial(run, boot))
                    if pid is not None and workload == "small_5k":
                        sent = proxy.metric("kthrottle_requests_total", {"api": "Produce"}) - produced
                        per_request[workload].append(records / max(sent, 1))
                    rates[workload][name].append(result["rate"])
                    if pid is not None:
                        cpu[workload].append(per_gb)
                    note = ""
                    if pid is not None:
                        note = f", proxy CPU {per_gb:.2f} s/GB ({result['user_share']:.0%} user)"
                    print(f"round {rnd} {workload} {name}: {result['rate']:.0f} rec/s{note}", flush=True)
                if workload in relay_cpu:  # the same traffic through the bare relay
                    result, per_gb = cpu_per_gb(relay.pid, records, functools.partial(run, relayed))
                    relay_cpu[workload].append(per_gb)
                    rate = result["rate"]
                    print(f"round {rnd} {workload} relay: {rate:.0f} rec/s, relay CPU {per_gb:.2f} s/GB")
            # The bare relay on this machine in the same round: the floor any proxy pays.
            if "small_5k" in plan:
                floor["small_5k"].append(relay_floor.small_cpu_s_per_gb())
            if "bulk_fetch" in plan:
                floor["bulk_fetch"].append(relay_floor.bulk(relay_floor.copy_relay))
            done = ", ".join(f"{k} {v[-1]:.2f} s/GB" for k, v in floor.items() if v)
            print(f"round {rnd} relay floor: {done}", flush=True)
            for name, boot in [*order, ("relay", relayed)]:
                r = latency_probe(boot, "latency", args.latency_seconds)
                lat50[name].append(r["p50_ms"])
                lat99[name].append(r["p99_ms"])
                print(
                    f"round {rnd} 5k msg/s {name}: p50 {r['p50_ms']:.3f} ms p99 {r['p99_ms']:.3f} ms "
                    f"({r['achieved_rate']:.0f} msg/s, {r['errors']} errors)",
                    flush=True,
                )

    med = statistics.median

    def ratio(workload: str) -> float | None:
        if workload not in rates:
            return None
        return round(med(rates[workload]["proxy"]) / med(rates[workload]["direct"]), 3)

    def to_floor(workload: str) -> float | None:
        if not floor.get(workload) or not cpu.get(workload):
            return None
        return round(med(cpu[workload]) / med(floor[workload]), 2)

    def to_relay(workload: str) -> float | None:
        if not relay_cpu.get(workload) or not cpu.get(workload):
            return None
        return round(med(cpu[workload]) / med(relay_cpu[workload]), 2)

    figures = {
        "small_request_cpu_to_floor": to_floor("small_5k"),
        "small_request_cpu_to_relay_same_traffic": to_relay("small_5k"),
        "bulk_fetch_cpu_to_floor": to_floor("bulk_fetch"),
        "bulk_fetch_cpu_to_relay_same_traffic": to_relay("bulk_fetch"),
        "relay_floor_cpu_s_per_gb": {k: round(med(v), 2) for k, v in floor.items() if v},
        "records_per_request": {k: round(med(v), 2) for k, v in per_request.items() if v},
        "producer_throughput_ratio": ratio("bulk_produce"),
        "consumer_throughput_ratio": ratio("bulk_fetch"),
        "small_saturating_throughput_ratio": ratio("small_saturating"),
        "proxy_cpu_s_per_gb": {k: round(med(v), 2) for k, v in cpu.items()},
        "added_median_latency_ms": round(med(lat50["proxy"]) - med(lat50["direct"]), 3),
        "added_p99_latency_ms": round(med(lat99["proxy"]) - med(lat99["direct"]), 3),
        "relay_added_median_latency_ms": round(med(lat50["relay"]) - med(lat50["direct"]), 3),
        "relay_cpu_s_per_gb_same_traffic": {k: round(med(v), 2) for k, v in relay_cpu.items() if v},
        "records_per_s": {w: {k: round(med(v)) for k, v in r.items()} for w, r in rates.items()},
        "latency_ms_at_5k_msgs": {
            k: {"p50": round(med(lat50[k]), 3), "p99": round(med(lat99[k]), 3)} for k in lat50
        },
        "rounds": args.rounds,
        "records_per_run": args.records,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
