"""Large Produce requests and Fetch responses go through the proxy as their bytes arrive: the
proxy's memory follows its socket buffers, not the size of the frames. Kafka's own perf tools
with 1 MB batches, 10 MB requests and 50 MB fetches, against the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.perf_tools import consume, produce
from dev.proxy_process import ProxyProcess, gateway_config

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
RECORDS = 64_000  # 1 KiB each: 8 partitions of 8 MiB


def peak_rss(pid: int) -> int:
    """The high-water mark of a process's resident memory (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


@pytest.mark.timeout(300)
def test_large_frames_go_through_in_memory_bounded_by_the_socket_buffers(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"large-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 8)
    consumer_config = tmp_path / "consumer.properties"
    consumer_config.write_text(f"fetch.max.bytes={50 * MiB}\nmax.partition.fetch.bytes={8 * MiB}\n")
    with ProxyProcess(gateway_config(kafka_broker, log_level="WARNING")) as proxy:
        assert proxy.proc is not None
        pid = proxy.proc.pid
        big_requests = {"max.request.size": str(10 * MiB), "max.in.flight.requests.per.connection": "5"}
        produce(proxy.bootstrap, topic, 2_000, -1)  # warm the proxy up (its imports, first buffers)
        start = peak_rss(pid)
        sent = produce(
            proxy.bootstrap, topic, RECORDS, -1, batch_size=1_000_000, props=big_requests, linger_ms=500
        )
        after_produce = peak_rss(pid)
        got = consume(proxy.bootstrap, topic, RECORDS + 2_000, consumer_config)
        after_fetch = peak_rss(pid)
        fetches = proxy.metric("kthrottle_requests_total", {"api": "Fetch"})
        fetched = proxy.metric("kthrottle_response_bytes_total", {"api": "Fetch"})
        produces = proxy.metric("kthrottle_requests_total", {"api": "Produce"})
        produced = proxy.metric("kthrottle_request_bytes_total", {"api": "Produce"})
    produce_growth, fetch_growth = (after_produce - start) / MiB, (after_fetch - after_produce) / MiB
    print(
        f"produce: {produced / produces / MiB:.1f} MiB per request, peak RSS +{produce_growth:.1f} MiB; "
        f"fetch: {fetched / fetches / MiB:.1f} MiB per response, peak RSS +{fetch_growth:.1f} MiB"
    )
    assert sent["records"] == RECORDS
    assert got["records"] == RECORDS + 2_000  # every record came back through the proxy
    assert fetched >= (RECORDS + 2_000) * 1024
    # The frames were large: gathered whole, several of them would have taken tens of MiB.
    assert produced / produces > 2 * MiB
    assert fetched / fetches > 8 * MiB
    assert after_produce - start < 16 * MiB
    assert after_fetch - after_produce < 16 * MiB
