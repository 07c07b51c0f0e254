"""``quotas.client_id_policy`` through the proxy with real clients and the real SASL broker, in one
run with two hot reloads (each test judges its part):

- **template**: alice and bob both send librdkafka's default client id, ``rdkafka``, listed in
  ``shared_ids``; ``template: anon-{principal}`` gives each its own bucket at the <default>
  client quota, so each gets the whole quota;
- **reload, no template**: the two share the one ``rdkafka`` bucket, and get the quota together;
- **reload, required**: an aiokafka producer sending no client id is refused (POLICY_VIOLATION,
  nothing written), counted and logged; the others go on.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until
from dev.workloads import librdkafka_sasl, rate_between, steady_producer
from tests.integration.conftest import SASL_USERS
from tests.integration.test_volume_quotas import end_offset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

KiB = 1024
QUOTA = 128 * KiB
PHASE = 5.0  # seconds per phase
SETTLED = 2.0  # seconds into a phase before its rate is judged: the new bucket's burst is spent
USERS = ("alice", "bob")


@dataclass
class Run:
    phases: list[float]  # monotonic start of each phase
    acked: dict[str, list[tuple[float, int]]]
    views: dict[str, dict[str, Any]]  # /quotas/entity of each user's rewritten id, first phase
    refusal: str
    refused_count: float
    refused_topic_offset: int
    log: str


def _reload(proxy: ProxyProcess, policy: dict[str, Any]) -> None:
    applied = proxy.metric("kthrottle_config_reloads_total", {"result": "applied"})
    proxy.config["quotas"]["client_id_policy"] = policy
    proxy.config_path.write_text(yaml.safe_dump(proxy.config))
    wait_until(
        lambda: proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) > applied,
        10,
        lambda: proxy.log_tail(),
    )


def _produce_without_client_id(bootstrap: str, topic: str) -> str:
    """aiokafka (which sends the empty client id it is given) logged in as alice: what sending one
    record raised."""
    from aiokafka import AIOKafkaProducer

    async def go() -> str:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id="",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="alice",
            sasl_plain_password=SASL_USERS["alice"],
            request_timeout_ms=10_000,
        )
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"z" * 100)
        except Exception as exc:  # what the application sees
            return f"{type(exc).__name__}: {exc}"
        finally:
            await producer.stop()
        return "sent"

    return asyncio.run(asyncio.wait_for(go(), 60))


@pytest.fixture(scope="module")
def run(kafka_sasl_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    cluster = kafka_sasl_broker
    tmp = tmp_path_factory.mktemp("client-id-policy")
    topic, refused_topic = f"cid-{uuid.uuid4().hex[:6]}", f"cid-refused-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=2)
    cluster.create_topic(refused_topic)
    cfg = gateway_config(cluster)
    cfg["gateway"]["upstream_bootstrap"] = cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "alice", "password": SASL_USERS["alice"]}
    cfg["quotas"] = {
        "window": {"num": 5, "size_seconds": 0.5},  # a 2 s burst: each phase settles quickly
        "clients": {"<default>": {"producer_byte_rate": QUOTA}},
        "client_id_policy": {"template": "anon-{principal}", "shared_ids": ["rdkafka", "producer-*"]},
    }
    acked: dict[str, list[tuple[float, int]]] = {user: [] for user in USERS}
    stop = threading.Event()
    with ProxyProcess(cfg, workdir=tmp / "proxy") as proxy:
        threads = [
            threading.Thread(
                target=steady_producer,
                args=(proxy.bootstrap, topic, "rdkafka", 3 * QUOTA, stop, acked[user]),
                kwargs={"purge": True, "extra": librdkafka_sasl(user, SASL_USERS[user])},
            )
            for user in USERS
        ]
        phases = [time.monotonic()]
        for thread in threads:
            thread.start()
        try:
            time.sleep(PHASE)
            views = {
                user: json.loads(proxy.admin_get(f"/quotas/entity?user={user}&client_id=anon-{user}")[1])
                for user in USERS
            }
            _reload(proxy, {})
            phases.append(time.monotonic())
            time.sleep(PHASE)
            _reload(proxy, {"required": True})
            phases.append(time.monotonic())
            refusal = _produce_without_client_id(proxy.bootstrap, refused_topic)
            time.sleep(max(0.0, phases[-1] + PHASE - time.monotonic()))
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        refused_count = proxy.metric("kthrottle_client_id_refused_total", {"api": "Produce"})
        log = proxy.log_text()
    yield Run(phases, acked, views, refusal, refused_count, end_offset(cluster, refused_topic), log)


def _rate(run: Run, user: str, phase: int) -> float:
    start = run.phases[phase]
    return rate_between(run.acked[user], start + SETTLED, start + PHASE)


def test_a_template_gives_each_principal_behind_a_shared_id_its_own_bucket(run: Run) -> None:
    for user in USERS:
        rate = _rate(run, user, 0)
        assert rate == pytest.approx(QUOTA, rel=0.2), (user, rate / QUOTA)
        view = run.views[user]["producer_byte_rate"]
        assert view["bucket"] == {"user": "", "client_id": f"anon-{user}"}, view
        assert view["rate"] > 0.5 * QUOTA, view  # measured under the id the template made


def test_without_the_template_a_shared_id_is_one_bucket(run: Run) -> None:
    together = sum(_rate(run, user, 1) for user in USERS)
    assert together == pytest.approx(QUOTA, rel=0.2), together / QUOTA


def test_a_required_client_id_refuses_a_client_without_one_and_not_the_others(run: Run) -> None:
    assert "PolicyViolation" in run.refusal, run.refusal  # error 44, not retried
    assert run.refused_topic_offset == 0  # nothing of it was written
    assert run.refused_count >= 1
    assert "without a client id refused (client_id_policy.required)" in run.log
    # The producers that send an id (a shared one: no template rewrites it now) go on.
    together = sum(_rate(run, user, 2) for user in USERS)
    assert together == pytest.approx(QUOTA, rel=0.25), together / QUOTA
