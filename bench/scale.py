"""How the proxy's cost grows with the cluster: each figure at two sizes, so the growth shows.

1. Metadata: the time the proxy's response path (the address stage, then the bytes that go out)
   takes to pass on a Metadata v12 answer of 10,000 and of 100,000 partitions over 100 brokers,
   built as a broker writes it. Only the broker addresses change, so it should not cost per
   partition. In process, on the proxy's own classes: no broker here has 100,000 partitions.
   For comparison, the cost of decoding the whole answer, rewriting and encoding it (what a
   proxy that decodes every response pays), and of reading its topic ids once, which the proxy
   does only when a request names a topic id it does not know.
2. Idle connections: 1,000 and 10,000 client connections held open through a real proxy in
   front of a real broker, saying nothing; the proxy's CPU over 20 s, in cores.
3. Quota cost per request at 10,000 and 100,000 client ids: ``bench/quota_overhead.py`` run at
   each (its proxies with quotas off, on, and every control on, side by side).

Prints one JSON line last:
  metadata_10k_partitions_ms, metadata_100k_partitions_ms, metadata_growth_10k_to_100k
                                          target: 100k <= 20 ms, growth <= 2x
  metadata_100k_partitions_throttled_ms   the same answer with a throttle patched in
  metadata_full_decode_100k_ms, metadata_topic_ids_read_100k_ms      (for comparison)
  idle_cpu_1k_connections, idle_cpu_10k_connections                  target: 10k <= 0.02 core
  quota_overhead_us_per_request_10k_ids, quota_overhead_us_per_request_100k_ids
                                          target: 100k <= 20

Usage: source dev/setup.sh && python bench/scale.py [--skip metadata,idle,quota] [--requests 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.loadgen import open_many
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import encode_response_header

REPO = Path(__file__).resolve().parent.parent
BROKERS = 100
METADATA_VERSION = 12
PARTITIONS_PER_TOPIC = 50


def metadata_frame(partitions: int) -> bytearray:
    """A Metadata v12 response frame (header and body, no size) as a broker of a cluster with
    ``BROKERS`` brokers and ``partitions`` partitions (3 replicas each) would send it."""
    brokers = [
        {"node_id": n, "host": f"broker-{n}.kafka.example.com", "port": 9092, "rack": f"rack-{n % 3}"}
        for n in range(BROKERS)
    ]
    topics = []
    for t in range(partitions // PARTITIONS_PER_TOPIC):
        parts = []
        for p in range(PARTITIONS_PER_TOPIC):
            leader = (t + p) % BROKERS
            replicas = [leader, (leader + 1) % BROKERS, (leader + 2) % BROKERS]
            parts.append(
                {
                    "error_code": 0,
                    "partition_index": p,
                    "leader_id": leader,
                    "leader_epoch": 7,
                    "replica_nodes": replicas,
                    "isr_nodes": replicas,
                    "offline_replicas": [],
                }
            )
        topics.append(
            {
                "error_code": 0,
                "name": f"topic-{t:05d}",
                "topic_id": uuid.UUID(int=t + 1).bytes,
                "is_internal": False,
                "partitions": parts,
                "topic_authorized_operations": -2147483648,
            }
        )
    body = {
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": "scale",
        "controller_id": 1,
        "topics": topics,
    }
    frame = encode_response_header(ApiKey.METADATA, METADATA_VERSION, 42)
    frame += messages.encode_response(ApiKey.METADATA, METADATA_VERSION, body)
    return frame


def _address_stage() -> tuple[Any, Any]:
    """The proxy's address stage on a stand-in connection: what it uses of its server is the
    broker directory's address map, the topic-name table and the metrics."""
    from proxy.metrics import ProxyMetrics
    from proxy.pipeline.stages.addresses import AddressStage
    from proxy.shared.topic_names import TopicNames

    def advertised(node_id: int, _host: str, _port: int) -> tuple[str, int]:
        return "kthrottle.example.com", 19000 + node_id

    server = SimpleNamespace(
        brokers=SimpleNamespace(advertised=advertised), topic_names=TopicNames(), metrics=ProxyMetrics()
    )
    return AddressStage(SimpleNamespace(server=server)), server


def pass_on_ms(frame: bytearray, rounds: int, throttle_ms: int = 0) -> float:
    """Median milliseconds from a Metadata answer's arrival to the bytes that go out (with a
    throttle, as a request-time quota sets one, patched into them)."""
    from proxy.pipeline.stages.base import InFlight, Response

    stage, _server = _address_stage()
    times = []
    for _ in range(rounds):
        entry = InFlight(ApiKey.METADATA, METADATA_VERSION, 42, 0.0)
        entry.throttle_ms = throttle_ms
        resp = Response(entry, bytearray(frame))
        began = time.perf_counter()
        stage.on_response(resp)
        out = resp.finished()  # the changed start; the topics follow as the broker's bytes
        tail = resp.tail
        times.append((time.perf_counter() - began) * 1000)
        assert len(out) + (len(tail) if tail is not None else 0) >= len(frame) - BROKERS * 40
    return statistics.median(times)


def full_decode_ms(frame: bytearray, rounds: int) -> float:
    """Decode, rewrite and encode the whole answer (what it cost before the splice)."""
    from protocol.frames import response_header_size

    hsize = response_header_size(ApiKey.METADATA, METADATA_VERSION, frame)
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        body = messages.decode_response(ApiKey.METADATA, METADATA_VERSION, memoryview(frame)[hsize:])
        messages.rewrite_addresses(ApiKey.METADATA, METADATA_VERSION, body, lambda n, h, p: ("x", 1))
        messages.encode_response(ApiKey.METADATA, METADATA_VERSION, body)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def topic_ids_read_ms(frame: bytearray) -> float:
    """Reading the topic ids of a kept answer: once, when an unknown id is met."""
    from proxy.pipeline.stages.base import InFlight, Response

    stage, server = _address_stage()
    stage.on_response(Response(InFlight(ApiKey.METADATA, METADATA_VERSION, 42, 0.0), bytearray(frame)))
    began = time.perf_counter()
    assert server.topic_names.name(uuid.UUID(int=1).bytes) == "topic-00000"
    return (time.perf_counter() - began) * 1000


def metadata_figures() -> dict[str, float]:
    small, large = metadata_frame(10_000), metadata_frame(100_000)
    print(f"metadata answers: {len(small) / 1e6:.1f} MB and {len(large) / 1e6:.1f} MB", flush=True)
    pass_on_ms(small, 20)  # warm-up
    figures = {
        "metadata_10k_partitions_ms": pass_on_ms(small, 50),
        "metadata_100k_partitions_ms": pass_on_ms(large, 50),
        "metadata_100k_partitions_throttled_ms": pass_on_ms(large, 50, throttle_ms=250),
        "metadata_full_decode_100k_ms": full_decode_ms(large, 3),
        "metadata_topic_ids_read_100k_ms": topic_ids_read_ms(large),
    }
    figures["metadata_growth_10k_to_100k"] = (
        figures["metadata_100k_partitions_ms"] / figures["metadata_10k_partitions_ms"]
    )
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}), flush=True)
    return figures


# --- idle connections --------------------------------------------------------------------------


async def _hold(host: str, port: int, count: int, seconds: float, measure: Any) -> tuple[int, float]:
    """Open ``count`` connections, hold them silent while ``measure`` runs, then close them;
    returns the errors and the measurement."""
    writers, errors, _seconds = await open_many(host, port, count)
    await asyncio.sleep(2)  # accepted and settled
    value = await asyncio.get_running_loop().run_in_executor(None, measure, seconds)
    for writer in writers:
        writer.close()
    await asyncio.sleep(0.5)
    return errors, value


def idle_figures(seconds: float) -> dict[str, float]:
    from dev.harness import KafkaCluster
    from dev.loadgen import cpu_seconds
    from dev.proxy_process import ProxyProcess, gateway_config

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the proxy inherits it
    figures: dict[str, float] = {}
    with (
        KafkaCluster(brokers=1) as cluster,
        ProxyProcess(gateway_config(cluster, log_level="WARNING")) as proxy,
    ):
        assert proxy.proc is not None
        pid = proxy.proc.pid
        host, port = proxy.bootstrap.rsplit(":", 1)

        def cores(span: float) -> float:
            before = cpu_seconds(pid)
            time.sleep(span)
            return (cpu_seconds(pid) - before) / span

        figures["idle_cpu_no_connections"] = cores(seconds)
        for count, name in ((1000, "1k"), (10_000, "10k")):
            errors, used = asyncio.run(_hold(host, int(port), count, seconds, cores))
            active = proxy.metric("kthrottle_connections_total", {"listener": "bootstrap"})
            print(f"{count} idle: {used:.4f} cores, {errors} errors, {active:.0f} accepted", flush=True)
            figures[f"idle_cpu_{name}_connections"] = used
            figures[f"idle_connection_errors_{name}"] = errors
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}), flush=True)
    return figures


# --- quota cost at many client ids -------------------------------------------------------------


def quota_figures(requests: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    for ids, name in ((10_000, "10k"), (100_000, "100k")):
        proc = subprocess.run(
            [
                sys.executable,
                str(REPO / "bench" / "quota_overhead.py"),
                *("--ids", str(ids), "--requests", str(requests)),
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        figures[f"quota_overhead_us_per_request_{name}_ids"] = result["quota_overhead_us_per_request"]
        figures[f"quota_overhead_us_per_request_quotas_only_{name}_ids"] = result[
            "quota_overhead_us_per_request_quotas_only"
        ]
        print(json.dumps({name: result}), flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip", default="", help="parts to leave out, of: metadata,idle,quota")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=200_000, help="per quota_overhead run")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, float] = {}
    if "metadata" not in skip:
        figures.update(metadata_figures())
    if "idle" not in skip:
        figures.update(idle_figures(args.idle_seconds))
    if "quota" not in skip:
        figures.update(quota_figures(args.requests))
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
