"""quotas.exempt through the proxy, with real librdkafka producers and the real broker.

Two producers greedy for four times a default quota, side by side: ``app`` is held to it,
``ops-tool`` (exempt by client id) is never throttled, yet its rate is measured, its decisions
counted as ``exempt`` and captured (decided, not applied). A hot reload then takes the exemption
away and the same producer is throttled from then on.
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
from dev.workloads import ThrottleWatch, rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KiB = 1024
QUOTA = 256 * KiB


def test_an_exempt_client_is_never_throttled_yet_measured_and_a_reload_ends_it(
    kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    topic = f"exempt-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    quotas: dict[str, Any] = {
        "clients": {"<default>": {"producer_byte_rate": QUOTA}},
        "exempt": {"client_ids": ["ops-tool"]},
    }
    capture = {"enabled": True, "directory": str(tmp_path / "capture"), "flush_seconds": 0.2}
    cfg = gateway_config(kafka_broker, quotas=quotas, capture=capture)
    watches = {name: ThrottleWatch() for name in ("app", "ops-tool")}
    acked: dict[str, list[tuple[float, int]]] = {name: [] for name in watches}
    stop = threading.Event()
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        threads = [
            threading.Thread(
                target=steady_producer,
                args=(proxy.bootstrap, topic, name, 4 * QUOTA, stop, acked[name]),
                kwargs={"extra": watch.config(250)},
            )
            for name, watch in watches.items()
        ]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            time.sleep(9)
            exempt_view = json.loads(proxy.admin_get("/quotas/entity?client_id=ops-tool")[1])
            seen_while_exempt = list(watches["ops-tool"].seen)
            applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
            proxy.config["quotas"]["exempt"] = {}
            proxy.config_path.write_text(yaml.safe_dump(proxy.config))
            wait_until(
                lambda: proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > applied,
                10,
                lambda: proxy.log_tail(),
            )
            reloaded = time.monotonic()
            wait_until(lambda: watches["ops-tool"].max > 0, 15, "ops-tool never throttled after the reload")
            time.sleep(max(0.0, reloaded + 8 - time.monotonic()))
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        exempt_decisions = proxy.metric(
            "kthrottle_throttled_requests_total", {"api": "Produce", "mode": "exempt"}
        )
    # Held: app at its quota; exempt: ops-tool never throttled, far over it, and measured.
    app = rate_between(acked["app"], start + 4, start + 9)
    tool = rate_between(acked["ops-tool"], start + 4, start + 9)
    assert app == pytest.approx(QUOTA, rel=0.25), app / QUOTA
    assert tool > 2.5 * QUOTA, tool / QUOTA
    assert seen_while_exempt and max(seen_while_exempt) == 0, seen_while_exempt
    assert exempt_decisions > 0  # decided, counted as exempt, not applied
    assert exempt_view["producer_byte_rate"]["rate"] > 2 * QUOTA, exempt_view
    # After the reload it is held like everyone else.
    after = rate_between(acked["ops-tool"], reloaded + 4, reloaded + 8)
    assert after < 1.5 * QUOTA, after / QUOTA
    # Captured as everyone else: decided throttles, none applied while exempt.
    rows = [
        r
        for f in sorted((tmp_path / "capture").glob("*.parquet"))
        for r in pq.read_table(
            f, columns=["ts_ms", "client_id", "api_key", "throttle_ms", "decided_throttle_ms", "dry_run"]
        ).to_pylist()
        if r["api_key"] == 0 and r["client_id"] == "ops-tool"
    ]
    while_exempt = [r for r in rows if r["dry_run"]]
    assert while_exempt and all(r["throttle_ms"] == 0 for r in while_exempt)
    assert any(r["decided_throttle_ms"] > 0 for r in while_exempt)
