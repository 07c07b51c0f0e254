"""quotas.max_throttle_ms through the proxy, with a real librdkafka consumer and the real broker.

A consumer of a topic written in 512 KiB record batches, with a 256 KiB/s quota: each batch is
two seconds of its quota, and Kafka returns a batch whole (KIP-74), so every fetch costs a 2 s
throttle. Unbounded, the client sees throttles of about two seconds; a hot reload then sets a
one-second bound: from then on no throttle it sees is longer, yet it is still held to its quota
(a fetch made while it owes is answered empty, and it comes back once that is paid).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KiB = 1024
QUOTA = 256 * KiB
BATCH = 512 * KiB
BOUND = 1000


def test_a_reloaded_bound_caps_the_throttle_a_consumer_sees_and_the_quota_still_holds(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer

    topic = f"bound-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=1)
    kafka_broker.fill_topic(topic, 40 * 1024, record_size=1024, batch_bytes=BATCH)  # 40 MiB
    quotas: dict[str, Any] = {"clients": {"bounded-c": {"consumer_byte_rate": QUOTA}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        throttles: list[tuple[float, int]] = []  # (seconds from start, largest throttle lately)
        start = time.monotonic()

        def on_stats(raw: str) -> None:
            for broker in json.loads(raw).get("brokers", {}).values():
                seen = int(broker.get("throttle", {}).get("max", 0))
                if seen:
                    throttles.append((time.monotonic() - start, seen))

        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": f"g-{topic}",
                "client.id": "bounded-c",
                "auto.offset.reset": "earliest",
                "statistics.interval.ms": 500,
                "stats_cb": on_stats,
            }
        )
        consumer.subscribe([topic])
        marks: list[tuple[float, int]] = []
        got, bounded_at = 0, None
        try:
            while time.monotonic() - start < 34:
                for msg in consumer.consume(num_messages=1000, timeout=0.2):
                    if msg.error() is None:
                        got += len(msg.value() or b"")
                now = time.monotonic() - start
                marks.append((now, got))
                if bounded_at is None and now >= 12:
                    applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
                    proxy.config["quotas"]["max_throttle_ms"] = BOUND
                    proxy.config_path.write_text(yaml.safe_dump(proxy.config))
                    wait_until(
                        lambda a=applied: (
                            proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > a
                        ),
                        10,
                        lambda: proxy.log_tail(),
                    )
                    bounded_at = time.monotonic() - start
        finally:
            consumer.close()
        refused = proxy.metric("kthrottle_bounded_throttles_total", {"api": "Fetch", "outcome": "refused"})
    assert bounded_at is not None
    before = [ms for t, ms in throttles if t < bounded_at]
    # librdkafka's statistics window trails by up to its interval and the throttle of the last
    # fetch before the reload: from 3 s after it, every throttle seen is within the bound.
    after = [ms for t, ms in throttles if t > bounded_at + 3]
    assert before and max(before) > 1.5 * BOUND, before  # unbounded: about a batch's 2 s
    assert after and max(after) <= BOUND, after
    assert refused > 0  # fetches made while it owed were answered empty
    # Held to its quota while bounded: the slope of what had arrived, from 4 s after the reload.
    steady = [(t, n) for t, n in marks if t >= bounded_at + 4]
    rate = statistics.linear_regression([t for t, _ in steady], [n for _, n in steady]).slope
    assert rate == pytest.approx(QUOTA, rel=0.2), (rate / QUOTA, steady[0], steady[-1])
