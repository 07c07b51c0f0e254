"""quotas.max_throttle_ms through the proxy, with a real librdkafka consumer and the real broker.

A consumer of a topic written in 512 KiB record batches, with a 256 KiB/s quota: each batch is
two seconds of its quota, and Kafka returns a batch whole (KIP-74), so every fetch costs a 2 s
throttle. Unbounded, the client sees throttles of about two seconds; a hot reload then sets a
one-second bound: from then on no throttle it sees is longer, yet it is still held to its quota
(a fetch made while it owes is answered empty, and it comes back once that is paid).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until
from dev.workloads import greedy_consumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KiB = 1024
QUOTA = 256 * KiB
BATCH = 512 * KiB
BOUND = 1000


def test_a_reloaded_bound_caps_the_throttle_a_consumer_sees_and_the_quota_still_holds(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"bound-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=1)
    kafka_broker.fill_topic(topic, 16 * 1024, record_size=1024, batch_bytes=BATCH)  # 16 MiB: never runs dry
    quotas: dict[str, Any] = {"clients": {"bounded-c": {"consumer_byte_rate": QUOTA}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        reloaded: list[float] = []
        start = time.monotonic()

        def set_the_bound() -> None:
            applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
            proxy.config["quotas"]["max_throttle_ms"] = BOUND
            proxy.config_path.write_text(yaml.safe_dump(proxy.config))
            wait_until(
                lambda: proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > applied,
                10,
                lambda: proxy.log_tail(),
            )
            reloaded.append(time.monotonic() - start)

        run = greedy_consumer(proxy.bootstrap, topic, "bounded-c", 26, at=(8, set_the_bound))
        refused = proxy.metric("kthrottle_bounded_throttles_total", {"api": "Fetch", "outcome": "refused"})
    (bounded_at,) = reloaded
    # Unbounded: about a batch's 2 s. librdkafka's statistics window trails by up to its
    # interval and the throttle of the last fetch before the reload: from 3 s after it, every
    # throttle seen is within the bound.
    assert run.max_throttle(0, bounded_at) > 1.5 * BOUND, run.throttles
    assert 0 < run.max_throttle(bounded_at + 3) <= BOUND, run.throttles
    assert refused > 0  # fetches made while it owed were answered empty
    # Held to its quota while bounded, from 4 s after the reload.
    rate = run.slope(bounded_at + 4)
    assert rate == pytest.approx(QUOTA, rel=0.2), (rate / QUOTA, run.marks[-1])
