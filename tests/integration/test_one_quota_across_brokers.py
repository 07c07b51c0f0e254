"""One quota across connections and brokers: a client producing to partition leaders on three
brokers, with five requests in flight and 1 MiB batches, is held to its quota as a whole. A broker
enforces its own copy of the quota on its own connections, so the same client straight to the
three brokers would get up to three times it; through the proxy its connections share one quota
(steady shaping: one token bucket) and, once it is throttled, are all held until the throttle has
passed (hold_across_connections, the default). A consumer fetching from the three leaders at once
shares its fetch allowance the same way."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from tests.integration.clients import delivery_errors_into, java_rate_consumer, stop_greedy_producer
from tests.integration.test_quotas import CYCLE, STEADY, WINDOW, OffsetSampler, steady_rate

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * KiB


def _leaders(cluster: KafkaCluster, topic: str) -> set[int]:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(topic, timeout=10)
    return {p.leader for p in meta.topics[topic].partitions.values()}


@pytest.mark.timeout(240)
def test_pipelining_client_on_three_brokers_is_held_to_one_quota(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = f"one-quota-{uuid.uuid4().hex[:6]}"
    kafka_cluster3.create_topic(topic, partitions=3, replication=1)
    assert _leaders(kafka_cluster3, topic) == {1, 2, 3}, "the partitions' leaders are not on three brokers"
    quota = 2048 * KiB  # two 1 MiB batches a second: fine enough a grain to measure in seconds
    quotas = {"window": WINDOW, "clients": {"aggressive": {"producer_byte_rate": quota}}}
    with ProxyProcess(gateway_config(kafka_cluster3, quotas=quotas), workdir=tmp_path) as proxy:
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "client.id": "aggressive",
                "acks": 1,
                "linger.ms": 5,
                "batch.size": 1024 * KiB,
                "max.in.flight.requests.per.connection": 5,
                "enable.idempotence": False,
            }
        )
        errors: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            payload = b"a" * 1024
            while not stop.is_set():
                try:
                    producer.produce(topic, payload, on_delivery=delivery_errors_into(errors))
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)

        worker = threading.Thread(target=produce, daemon=True)
        sampler = OffsetSampler(kafka_cluster3, topic)
        start = time.monotonic()
        worker.start()
        try:
            sampler.sample_until(start, STEADY[1])
        finally:
            stop.set()
            worker.join(30)
            sampler.close()
        stop_greedy_producer(producer)
        assert not errors, errors[:3]
        per_partition = {p: s[-1][1] for p, s in sampler.by_partition.items()}
        assert all(per_partition.values()), f"a broker got nothing: {per_partition}"
        rate = steady_rate([(t, n * 1024) for t, n in sampler.samples], *STEADY, cycle=CYCLE)
        assert abs(rate - quota) / quota < 0.10, f"{rate / KiB:.0f} KiB/s over three brokers, quota 2048"
        assert proxy.metric("kthrottle_entity_holds_total", {"api": "Produce"}) > 0


@pytest.mark.timeout(240)
def test_consumer_fetching_from_three_brokers_at_once_shares_its_allowance(
    kafka_cluster3: KafkaCluster, tmp_path: Path
) -> None:
    """Kafka's Java consumer with 50 MB fetches (10 MB per partition) sends one Fetch to each leader
    at once. Were each sized to the whole bucket, the three would bring three bursts at once and the
    consumer would then get nothing for about ten seconds while they are paid back; sized from what
    the fetches in flight have not yet taken, it gets one burst and then its quota steadily."""
    topic = f"one-quota-fetch-{uuid.uuid4().hex[:6]}"
    kafka_cluster3.create_topic(topic, partitions=3, replication=1)
    assert _leaders(kafka_cluster3, topic) == {1, 2, 3}, "the partitions' leaders are not on three brokers"
    # 64 KiB batches: a broker returns whole batches, and a consumer of 1 MiB batches at 1 MiB/s
    # gets 5 or 6 of them in a 5.5 s window, +-9% by the window alone.
    kafka_cluster3.fill_topic(topic, 48 * 1024, batch_bytes=64 * 1024)
    quota = MiB
    quotas = {"window": WINDOW, "clients": {"wide-consumer": {"consumer_byte_rate": quota}}}
    with ProxyProcess(gateway_config(kafka_cluster3, quotas=quotas), workdir=tmp_path) as proxy:
        marks, _out = java_rate_consumer(
            proxy.bootstrap,
            topic,
            "wide-consumer",
            int(STEADY[1]) + 4,  # room for a JVM slow to start on a loaded machine (below)
            "fetch.max.bytes=52428800",
            "max.partition.fetch.bytes=10485760",
        )
    first = next(t for t, n in marks if n > 0)
    growth = [t for (_t0, n0), (t, n) in itertools.pairwise(marks) if n > n0 and t >= first]
    gaps = [(b - a, a) for a, b in itertools.pairwise(growth)]
    silence, silent_from = max(gaps)
    burst = max(n for t, n in marks if t <= first + 1.0)
    assert burst <= 5 * MiB + 3 * 1.1 * MiB, f"{burst / MiB:.1f} MiB at once; the bucket holds 5 MiB"
    assert silence < 6.0, f"the consumer got nothing for {silence:.1f} s from {silent_from:.1f} s"
    # The mean from the end of the burst to the end of the run, not the median of 5.5 s windows:
    # when the consumer, a broker or the machine stalls for a few seconds, the bucket refills
    # meanwhile and the consumer catches up at once, as a broker's window would let it. Windows
    # that hold the catch-up but not the stall read over, those that hold the stall alone under
    # (in CI they once read 1283 and once 916 KiB/s; a simulated 3 s stall mid-span reads 1.26x
    # and 0.96x the quota, 5 s up to 1.44x and 0.64x); the mean over the span stays within 3%.
    t_from, t_to = first + 2.0, marks[-1][0]
    rate = (marks[-1][1] - _bytes_at(marks, t_from)) / (t_to - t_from)
    assert t_to - t_from >= 12.0, f"only {t_to - t_from:.1f} s after the burst"
    assert abs(rate - quota) / quota < 0.10, (
        f"{rate / KiB:.0f} KiB/s from three brokers, quota 1024; longest silence {silence:.1f} s "
        f"from {silent_from:.1f} s; per second: {_per_second(marks)}"
    )


def _bytes_at(marks: list[tuple[float, float]], t: float) -> float:
    """What the consumer had received at ``t`` (its last poll before)."""
    return max(n for s, n in marks if s <= t)


def _per_second(marks: list[tuple[float, float]]) -> str:
    """MiB received in each second of the run, for a failure's message."""
    ends: dict[int, float] = {}
    for t, n in marks:
        ends[int(t)] = n
    out, before = [], 0.0
    for second in sorted(ends):
        out.append(f"{second}:{(ends[second] - before) / MiB:.2f}")
        before = ends[second]
    return " ".join(out)
