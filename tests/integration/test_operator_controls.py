"""The operator controls no broker has, through the proxy, with real librdkafka clients and the
real broker, in one run (each test judges its part):

- **Exemptions**: producers ``app`` and ``ops-tool`` greedy for four times a default quota side
  by side; ``app`` is held, ``ops-tool`` (exempt by client id) is never throttled, yet its rate
  is measured and its requests captured (``dry_run``, nothing applied).
- **Client-id prefixes**: five producers with generated ids (``gen-<random>``), each offering 1.5
  times the prefix's quota, are held to it together, once.
- **Bounded throttles**: a consumer of 512 KiB record batches on a 256 KiB/s quota (every fetch two
  seconds of quota: Kafka returns a batch whole, KIP-74) sees throttles of about 2 s.
- **Top talkers**: `kthrottle top` reads the proxy's connections meanwhile.

Then one hot reload takes the exemption away, doubles the prefix's quota and sets
``max_throttle_ms: 1000``: ``ops-tool`` is held from then on, the generated ids get twice as much,
and the consumer sees no throttle over a second yet is still held to its quota (a fetch made while
it owes is answered empty).
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
from dev.workloads import ConsumerRun, ThrottleWatch, greedy_consumer, rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KiB = 1024
QUOTA = 256 * KiB
BATCH = 512 * KiB
BOUND = 1000
RELOAD_AT = 8.0
AFTER = 16.0  # seconds run after the reload


@dataclass
class Run:
    start: float
    reloaded: float
    acked: dict[str, list[tuple[float, int]]]
    seen_while_exempt: list[int]
    exempt_view: dict[str, Any]
    prefix_view: dict[str, Any]
    prefix_quota_metric: float
    exempt_decisions: float
    capture: list[dict[str, Any]]
    consumer: ConsumerRun
    refused_fetches: float
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


def _reload(proxy: ProxyProcess, change: Any) -> None:
    applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
    change(proxy.config["quotas"])
    proxy.config_path.write_text(yaml.safe_dump(proxy.config))
    wait_until(
        lambda: proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > applied,
        10,
        lambda: proxy.log_tail(),
    )


def _the_reload(quotas: dict[str, Any]) -> None:
    quotas["exempt"] = {}
    quotas["client_id_prefixes"]["gen-"]["producer_byte_rate"] = 2 * QUOTA
    quotas["max_throttle_ms"] = BOUND


@pytest.fixture(scope="module")
def run(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import pyarrow.parquet as pq

    tmp = tmp_path_factory.mktemp("controls")
    produce_topic, fetch_topic = f"controls-{uuid.uuid4().hex[:6]}", f"bound-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(produce_topic, partitions=3)
    kafka_broker.create_topic(fetch_topic, partitions=1)
    kafka_broker.fill_topic(fetch_topic, 16 * 1024, record_size=1024, batch_bytes=BATCH)  # never runs dry
    quotas: dict[str, Any] = {
        "clients": {"<default>": {"producer_byte_rate": QUOTA}, "bounded-c": {"consumer_byte_rate": QUOTA}},
        "client_id_prefixes": {"gen-": {"producer_byte_rate": QUOTA}},
        "exempt": {"client_ids": ["ops-tool"]},
    }
    capture = {"enabled": True, "directory": str(tmp / "capture"), "flush_seconds": 0.2}
    cfg = gateway_config(kafka_broker, quotas=quotas, capture=capture)
    watch = ThrottleWatch()
    producers = {"app": 4.0, "ops-tool": 4.0, **{f"gen-{uuid.uuid4().hex[:8]}": 1.5 for _ in range(5)}}
    acked: dict[str, list[tuple[float, int]]] = {name: [] for name in producers}
    stop = threading.Event()
    consumed: list[ConsumerRun] = []
    with ProxyProcess(cfg, workdir=tmp / "proxy") as proxy:
        threads = [
            threading.Thread(
                target=steady_producer,
                args=(proxy.bootstrap, produce_topic, name, times * QUOTA, stop, acked[name]),
                kwargs={"purge": True, **({"extra": watch.config(250)} if name == "ops-tool" else {})},
            )
            for name, times in producers.items()
        ]
        threads.append(
            threading.Thread(
                target=lambda: consumed.append(
                    greedy_consumer(proxy.bootstrap, fetch_topic, "bounded-c", RELOAD_AT + AFTER + 1)
                )
            )
        )
        start = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            time.sleep(6)
            top_json = json.loads(_top(proxy, "--json", "--interval", "1").stdout)
            top_table = _top(proxy, "--iterations", "2", "--interval", "0.5", "--sort", "bytes_in")
            top_without_token = _top(proxy, "--json", token=False)
            time.sleep(max(0.0, start + RELOAD_AT - time.monotonic()))
            exempt_view = json.loads(proxy.admin_get("/quotas/entity?client_id=ops-tool")[1])
            gen = next(name for name in producers if name.startswith("gen-"))
            prefix_view = json.loads(proxy.admin_get(f"/quotas/entity?client_id={gen}")[1])
            labels = {"direction": "produce", "client_id": "<prefix:gen->"}
            prefix_quota_metric = proxy.metric("kthrottle_client_quota", labels)
            seen_while_exempt = list(watch.seen)
            _reload(proxy, _the_reload)
            reloaded = time.monotonic()
            time.sleep(max(0.0, reloaded + AFTER - time.monotonic()))
        finally:
            stop.set()
            for thread in threads:
                thread.join(90)
        exempt_decisions = proxy.metric(
            "kthrottle_throttled_requests_total", {"api": "Produce", "mode": "exempt"}
        )
        refused = proxy.metric("kthrottle_bounded_throttles_total", {"api": "Fetch", "outcome": "refused"})
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
        prefix_view["producer_byte_rate"],
        prefix_quota_metric,
        exempt_decisions,
        rows,
        consumed[0],
        refused,
        top_json,
        top_table.stdout + top_table.stderr,
        top_without_token,
    )


def _generated(run: Run, t_from: float, t_to: float) -> float:
    """The five generated ids' acknowledged bytes per second, together."""
    return sum(
        rate_between(acked, t_from, t_to) for name, acked in run.acked.items() if name.startswith("gen-")
    )


# --- exemptions --------------------------------------------------------------------------------


def test_an_exempt_client_is_never_throttled_yet_measured(run: Run) -> None:
    app = rate_between(run.acked["app"], run.start + 4, run.start + RELOAD_AT)
    tool = rate_between(run.acked["ops-tool"], run.start + 4, run.start + RELOAD_AT)
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
    # It starts again with its quota's burst (it owed nothing), then is held.
    after = rate_between(run.acked["ops-tool"], run.reloaded + 6, run.reloaded + AFTER)
    assert after < 1.5 * QUOTA, after / QUOTA


# --- client-id prefixes ------------------------------------------------------------------------


def test_producers_with_generated_ids_share_the_prefix_quota(run: Run) -> None:
    together = _generated(run, run.start + 4, run.start + RELOAD_AT)
    assert together == pytest.approx(QUOTA, rel=0.15), together / QUOTA  # one quota for the five
    view = run.prefix_view
    assert view["via"] == "prefix:gen-" and view["bucket"] == {"user": "", "client_id": "<prefix:gen->"}, view
    assert run.prefix_quota_metric == QUOTA


def test_a_reload_changes_the_prefix_quota(run: Run) -> None:
    together = _generated(run, run.reloaded + 3, run.reloaded + AFTER)
    assert together == pytest.approx(2 * QUOTA, rel=0.15), together / QUOTA


# --- bounded throttles -------------------------------------------------------------------------


def test_a_reloaded_bound_caps_the_throttle_a_consumer_sees_and_the_quota_still_holds(run: Run) -> None:
    consumer, bounded_at = run.consumer, run.reloaded - run.start
    # Unbounded: about a batch's 2 s. librdkafka's statistics window trails by up to its
    # interval and the throttle of the last fetch before the reload: from 3 s after it, every
    # throttle seen is within the bound.
    assert consumer.max_throttle(0, bounded_at) > 1.5 * BOUND, consumer.throttles
    assert 0 < consumer.max_throttle(bounded_at + 3) <= BOUND, consumer.throttles
    assert run.refused_fetches > 0  # fetches made while it owed were answered empty
    rate = consumer.slope(bounded_at + 4)
    assert rate == pytest.approx(QUOTA, rel=0.2), (rate / QUOTA, consumer.marks[-1])


# --- top talkers -------------------------------------------------------------------------------


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
    # Refreshed in place: two tables, the busiest first (the exempt producer, or the consumer).
    tables = [line for line in run.top_table.splitlines() if line.startswith("kthrottle top:")]
    assert len(tables) == 2, run.top_table
    first_rows = run.top_table.split("kthrottle top:")[1].splitlines()[2:]
    assert "ops-tool" in first_rows[0], run.top_table
    # The connections name users and addresses: without the token the proxy refuses them.
    assert run.top_without_token.returncode == 1, run.top_without_token
