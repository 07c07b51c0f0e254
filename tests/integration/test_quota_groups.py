"""Client-id prefixes through the proxy, with real librdkafka producers and the real broker.

Five producers with generated client ids (``app-<random>``), each offering one and a half times
the prefix's quota: together they are held to the quota once, as users of generated ids expect,
not to five quotas. /quotas/entity and the metrics name the shared bucket. A hot reload doubles
the prefix's quota and the same five get twice as much.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until
from dev.workloads import rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KiB = 1024
QUOTA = 256 * KiB


def test_producers_with_generated_ids_share_the_prefix_quota_and_a_reload_changes_it(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = f"groups-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=3)
    quotas: dict[str, Any] = {
        "window": {"num": 5, "size_seconds": 0.5},
        "client_id_prefixes": {"app-": {"producer_byte_rate": QUOTA}},
    }
    ids = [f"app-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    acked: list[tuple[float, int]] = []
    stop = threading.Event()
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        threads = [
            threading.Thread(
                target=steady_producer, args=(proxy.bootstrap, topic, cid, 1.5 * QUOTA, stop, acked)
            )
            for cid in ids
        ]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            time.sleep(8)
            view = json.loads(proxy.admin_get(f"/quotas/entity?client_id={ids[0]}")[1])["producer_byte_rate"]
            labels = {"direction": "produce", "client_id": "<prefix:app->"}
            quota_metric = proxy.metric("kthrottle_client_quota", labels)
            applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
            proxy.config["quotas"]["client_id_prefixes"]["app-"]["producer_byte_rate"] = 2 * QUOTA
            proxy.config_path.write_text(yaml.safe_dump(proxy.config))
            wait_until(
                lambda: proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > applied,
                10,
                lambda: proxy.log_tail(),
            )
            reloaded = time.monotonic()
            time.sleep(7)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
    acked.sort()
    before = rate_between(acked, start + 4, start + 8)
    after = rate_between(acked, reloaded + 3, reloaded + 7)
    assert before == pytest.approx(QUOTA, rel=0.15), before / QUOTA  # one quota for the five
    assert after == pytest.approx(2 * QUOTA, rel=0.15), after / QUOTA  # the reloaded quota
    assert view["via"] == "prefix:app-" and view["bucket"] == {"user": "", "client_id": "<prefix:app->"}, view
    assert quota_metric == QUOTA
