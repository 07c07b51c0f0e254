"""quotas.exempt and `kthrottle top` through the proxy, with real librdkafka producers and the
real broker.

Two producers greedy for four times a default quota, side by side: ``app`` is held to it,
``ops-tool`` (exempt by client id) is never throttled, yet its rate is measured, its decisions
counted as ``exempt`` and captured (decided, not applied). Meanwhile `kthrottle top` reads the
proxy's connections. A hot reload then takes the exemption away and the same producer is
throttled from then on. One run; each test judges its part.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import REPO, ProxyProcess, gateway_config
from dev.waiting import wait_until
from dev.workloads import ThrottleWatch, rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KiB = 1024
QUOTA = 256 * KiB


@dataclass
class Run:
    start: float
    reloaded: float
    acked: dict[str, list[tuple[float, int]]]
    seen_while_exempt: list[int]
    exempt_view: dict[str, Any]
    exempt_decisions: float
    capture: list[dict[str, Any]]
    top_json: dict[str, Any]
    top_table: str
    top_without_token: subprocess.CompletedProcess[str]


def _top(proxy: ProxyProcess, *args: str, token: bool = True) -> subprocess.CompletedProcess[str]:
    token_args = ["--token-file", proxy.config["admin"]["token_file"]] if token else []
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "top", "--admin-url", proxy.admin_url, *token_args, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def run(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("exempt")
    topic = f"exempt-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    quotas: dict[str, Any] = {
        "clients": {"<default>": {"producer_byte_rate": QUOTA}},
        "exempt": {"client_ids": ["ops-tool"]},
    }
    capture = {"enabled": True, "directory": str(tmp / "capture"), "flush_seconds": 0.2}
    cfg = gateway_config(kafka_broker, quotas=quotas, capture=capture)
    watches = {name: ThrottleWatch() for name in ("app", "ops-tool")}
    acked: dict[str, list[tuple[float, int]]] = {name: [] for name in watches}
    stop = threading.Event()
    with ProxyProcess(cfg, workdir=tmp / "proxy") as proxy:
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
            time.sleep(6)
            top_json = json.loads(_top(proxy, "--json", "--interval", "1").stdout)
            top_table = _top(proxy, "--iterations", "2", "--interval", "0.5", "--sort", "bytes_in")
            top_without_token = _top(proxy, "--json", token=False)
            time.sleep(max(0.0, start + 9 - time.monotonic()))
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
    columns = ["client_id", "api_key", "throttle_ms", "request_bytes", "dry_run"]
    rows = [
        r
        for f in sorted((tmp / "capture").glob("*.parquet"))
        for r in pq.read_table(f, columns=columns).to_pylist()
        if r["api_key"] == 0 and r["client_id"] == "ops-tool"
    ]
    yield Run(
        start,
        reloaded,
        acked,
        seen_while_exempt,
        exempt_view,
        exempt_decisions,
        rows,
        top_json,
        top_table.stdout + top_table.stderr,
        top_without_token,
    )


def test_an_exempt_client_is_never_throttled_yet_measured(run: Run) -> None:
    app = rate_between(run.acked["app"], run.start + 4, run.start + 9)
    tool = rate_between(run.acked["ops-tool"], run.start + 4, run.start + 9)
    assert app == pytest.approx(QUOTA, rel=0.25), app / QUOTA
    assert tool > 2.5 * QUOTA, tool / QUOTA
    assert run.seen_while_exempt and max(run.seen_while_exempt) == 0, run.seen_while_exempt
    assert run.exempt_decisions == 0  # its bucket owes nothing for what it sends
    assert run.exempt_view["producer_byte_rate"]["rate"] > 2 * QUOTA, run.exempt_view  # measured
    # Captured as everyone else, marked as not held back (dry_run), nothing applied: every
    # acknowledged byte of it is in the capture (its requests carry a little more: headers).
    while_exempt = [r for r in run.capture if r["dry_run"]]
    assert while_exempt and all(r["throttle_ms"] == 0 for r in while_exempt)
    acked = sum(n for at, n in run.acked["ops-tool"] if at < run.reloaded - 1)
    assert sum(r["request_bytes"] for r in while_exempt) >= acked


def test_a_reload_that_ends_the_exemption_holds_the_client(run: Run) -> None:
    after = rate_between(run.acked["ops-tool"], run.reloaded + 4, run.reloaded + 8)
    assert after < 1.5 * QUOTA, after / QUOTA


def test_kthrottle_top_shows_each_connection_with_its_rates(run: Run) -> None:
    rows = {r["client_id"]: r for r in run.top_json["connections"] if r["client_id"] in ("app", "ops-tool")}
    assert set(rows) == {"app", "ops-tool"}, run.top_json
    app, tool = rows["app"], rows["ops-tool"]
    # The rates of the second between the two readings: the exempt producer far over the
    # quota, the held one about at it (produce requests, and their answers back).
    assert tool["bytes_in_per_s"] > 2 * QUOTA, tool
    assert 0.3 * QUOTA < app["bytes_in_per_s"] < 1.8 * QUOTA, app
    assert tool["exempt"] is True and app["exempt"] is False
    assert app["principal"] == "ANONYMOUS" and app["source"].startswith("127.0.0.1:") and app["broker"] == 1
    assert app["bytes_out_per_s"] > 0 and app["requests_per_s"] > 0
    # Refreshed in place: two tables, the busiest first.
    tables = [line for line in run.top_table.splitlines() if line.startswith("kthrottle top:")]
    assert len(tables) == 2, run.top_table
    first_rows = run.top_table.split("kthrottle top:")[1].splitlines()[2:]
    assert "ops-tool" in first_rows[0], run.top_table
    # The connections name users and addresses: without the token the proxy refuses them.
    assert run.top_without_token.returncode == 1, run.top_without_token
