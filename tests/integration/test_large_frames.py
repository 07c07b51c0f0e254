"""Large Produce requests and Fetch responses go through the proxy as their bytes arrive: the
proxy's memory follows its socket buffers, not the size of the frames. Kafka's own perf tools
with 8 MiB batches and 50 MiB fetches, against the real broker."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from dev.harness import KafkaCluster
from dev.perf_tools import consume, produce
from dev.proc import rss_bytes
from dev.proxy_process import ProxyProcess, gateway_config

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
RECORDS = 64_000  # 1 KiB each: eight 8 MiB batches


class PeakRss:
    """The largest resident memory of a process while a block runs, over what it held before
    (sampled every 2 ms: a frame gathered whole lives for tens of them)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.growth = 0

    def __enter__(self) -> PeakRss:
        self._before = rss_bytes(self.pid)
        self._peak = self._before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self._peak = max(self._peak, rss_bytes(self.pid))

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.growth = self._peak - self._before


@pytest.mark.timeout(300)
def test_large_frames_go_through_in_memory_bounded_by_the_socket_buffers(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    stored, written = f"large-in-{uuid.uuid4().hex[:8]}", f"large-out-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:  # batches of 8 MiB, one per request
        for topic in (stored, written):
            kafka_broker.create_topic(topic, 1)
            big = {"max.message.bytes": str(16 * MiB)}
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=big)])
    finally:
        admin.close()
    big_requests = {"max.request.size": str(16 * MiB), "max.in.flight.requests.per.connection": "5"}
    # What the consumer reads is written straight to the broker: the proxy's memory is measured
    # first while it only streams responses, then while it only streams requests.
    produce(
        kafka_broker.bootstrap_servers,
        stored,
        RECORDS,
        -1,
        batch_size=8 * MiB,
        props=big_requests,
        linger_ms=2000,
    )
    consumer_config = tmp_path / "consumer.properties"
    consumer_config.write_text(f"fetch.max.bytes={50 * MiB}\nmax.partition.fetch.bytes={50 * MiB}\n")
    with ProxyProcess(gateway_config(kafka_broker, log_level="WARNING")) as proxy:
        assert proxy.proc is not None
        pid = proxy.proc.pid
        consume(proxy.bootstrap, stored, 100)  # warm the proxy up (its imports, first buffers)
        fetches0 = proxy.metric("kthrottle_requests_total", {"api": "Fetch"})
        with PeakRss(pid) as fetching:
            got = consume(proxy.bootstrap, stored, RECORDS, consumer_config)
        fetches = proxy.metric("kthrottle_requests_total", {"api": "Fetch"}) - fetches0
        fetched = proxy.metric("kthrottle_response_bytes_total", {"api": "Fetch"})
        with PeakRss(pid) as producing:
            sent = produce(
                proxy.bootstrap, written, RECORDS, -1, batch_size=8 * MiB, props=big_requests, linger_ms=2000
            )
        produces = proxy.metric("kthrottle_requests_total", {"api": "Produce"})
        produced = proxy.metric("kthrottle_request_bytes_total", {"api": "Produce"})
    produce_growth, fetch_growth = producing.growth / MiB, fetching.growth / MiB
    print(
        f"fetch: {fetched / fetches / MiB:.1f} MiB per response, peak RSS +{fetch_growth:.1f} MiB; "
        f"produce: {produced / produces / MiB:.1f} MiB per request, peak RSS +{produce_growth:.1f} MiB "
        f"({fetches:.0f} fetches, {produces:.0f} produce requests)"
    )
    assert got["records"] == RECORDS  # every record came back through the proxy
    assert sent["records"] == RECORDS
    assert fetched >= RECORDS * 1024
    # The frames were large: gathered whole, several of them would have taken tens of MiB.
    assert fetched / fetches > 4 * MiB
    assert produced / produces > 4 * MiB
    assert producing.growth < 8 * MiB
    assert fetching.growth < 8 * MiB
