"""KIP-599 controller mutation quotas through the proxy, with Kafka's own admin tools and the
Python clients, against a real broker (which has no quotas of its own).

Every client id gets its own token bucket from a ``<default>`` client quota of 2 partition
mutations per second with a burst of 20 (10 samples of 1 s), as in Kafka's own tests. A fresh
bucket starts full, so the first topic of a client always goes through.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.harness import KafkaCluster, run_tool
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import ThrottleWatch
from protocol.errors import ErrorCode
from protocol.mutations import THROTTLING_QUOTA_EXCEEDED_MESSAGE

pytestmark = pytest.mark.integration

JAVA_ADMIN = str(Path(__file__).parent / "java" / "MutationAdmin.java")
RATE, WINDOWS = 2, 10  # burst 20


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    quotas = {
        "controller_window": {"num": WINDOWS, "size_seconds": 1},
        "clients": {"<default>": {"controller_mutation_rate": RATE}},
    }
    with ProxyProcess(
        gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path_factory.mktemp("mutations")
    ) as running:
        yield running


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _java_admin(bootstrap: str, client_id: str, op: str, *args: str) -> dict[str, tuple[str, int, str]]:
    """Run Kafka's Java admin client; per topic: (outcome, throttle ms, message)."""
    proc = run_tool(JAVA_ADMIN, bootstrap, client_id, op, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            parts = line.split(" ", 4)
            if parts[2] == "OK":
                results[parts[1]] = ("OK", 0, "")
            else:
                results[parts[1]] = (parts[2], int(parts[3]), parts[4] if len(parts) > 4 else "")
    return results


def _described_partitions(cluster: KafkaCluster, topic: str) -> int | None:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
    try:
        described = admin.describe_topics([topic])
    finally:
        admin.close()
    for entry in described:
        if entry.get("name") == topic and entry.get("error_code", 0) == 0:
            return len(entry.get("partitions") or [])
    return None


def _partitions(cluster: KafkaCluster, topic: str, expect: int | None) -> int | None:
    """Partition count on the broker itself (not through the proxy); None if the topic is absent.

    The broker's metadata cache follows the controller's commit a moment later, so the count is
    read again for up to 10 s until it is ``expect``; the last reading is returned either way.
    """
    deadline = time.monotonic() + 10.0
    while True:
        found = _described_partitions(cluster, topic)
        if found == expect or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.mark.timeout(120)
def test_java_admin_strict_create(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    a, b, c = _name("m-a"), _name("m-b"), _name("m-c")
    results = _java_admin(proxy.bootstrap, "java-admin", "create", f"{a}:30", f"{b}:30", f"{c}:30")
    assert results[a][0] == "OK"
    for rejected in (b, c):
        kind, throttle_ms, message = results[rejected]
        assert kind == "ThrottlingQuotaExceededException"
        assert message == THROTTLING_QUOTA_EXCEEDED_MESSAGE
        assert 4000 <= throttle_ms <= 5000  # 20 - 30 = -10 tokens at 2/s
    assert _partitions(kafka_broker, a, 30) == 30
    assert _partitions(kafka_broker, b, None) is None and _partitions(kafka_broker, c, None) is None
    assert (
        proxy.metric("kthrottle_mutation_rejected_topics_total", {"api": "CreateTopics", "mode": "applied"})
        >= 2
    )
    log_text = proxy.log_text()
    assert "CreateTopics v7" in log_text and "2 of 3 topics rejected" in log_text


@pytest.mark.timeout(120)
def test_topic_command_sees_the_quota(
    kafka_broker: KafkaCluster, proxy: ProxyProcess, tmp_path: Path
) -> None:
    props = tmp_path / "admin.properties"
    props.write_text("client.id=topic-cmd\n")
    big, small = _name("m-big"), _name("m-small")

    def create(topic: str, partitions: int) -> tuple[int, str]:
        proc = run_tool(
            "org.apache.kafka.tools.TopicCommand",
            "--bootstrap-server",
            proxy.bootstrap,
            "--command-config",
            str(props),
            "--create",
            "--topic",
            topic,
            "--partitions",
            str(partitions),
            "--replication-factor",
            "1",
        )
        return proc.returncode, proc.stdout + proc.stderr

    code, out = create(big, 50)  # a fresh bucket admits it and goes to -30 (15 s to refill)
    assert code == 0, out
    code, out = create(small, 1)
    assert code != 0
    assert THROTTLING_QUOTA_EXCEEDED_MESSAGE in out
    assert _partitions(kafka_broker, big, 50) == 50 and _partitions(kafka_broker, small, None) is None


@pytest.mark.timeout(120)
def test_validate_only_is_charged_like_the_broker(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    """Kafka's KRaft controller charges validateOnly CreateTopics (KIP-599 said it would not); the
    proxy does the same by default (``mutations.charge_validate_only``)."""
    checked, real = _name("m-validate"), _name("m-real")
    assert _java_admin(proxy.bootstrap, "validator", "validate", f"{checked}:40")[checked][0] == "OK"
    assert _partitions(kafka_broker, checked, None) is None  # only validated
    assert _java_admin(proxy.bootstrap, "validator", "create", f"{real}:1")[real][0] == (
        "ThrottlingQuotaExceededException"
    )


@pytest.mark.timeout(120)
def test_create_partitions_strict(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    grow, other = _name("m-grow"), _name("m-other")
    kafka_broker.create_topic(grow)
    kafka_broker.create_topic(other)
    assert _partitions(kafka_broker, grow, 1) == 1 and _partitions(kafka_broker, other, 1) == 1  # visible
    results = _java_admin(proxy.bootstrap, "grower", "partitions", f"{grow}:31", f"{other}:31")
    # The first in the request (MutationAdmin keeps the order given) takes 30 tokens of a full
    # bucket of 20 and is admitted; the bucket is then negative and the other is rejected.
    assert results[grow][0] == "OK", results
    assert results[other][0] == "ThrottlingQuotaExceededException"
    assert _partitions(kafka_broker, grow, 31) == 31 and _partitions(kafka_broker, other, 1) == 1


@pytest.mark.timeout(120)
def test_delete_over_quota_leaves_topics(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    first, second = _name("m-del1"), _name("m-del2")
    kafka_broker.create_topic(first, partitions=30)
    kafka_broker.create_topic(second, partitions=30)
    assert _partitions(kafka_broker, first, 30) == 30 and _partitions(kafka_broker, second, 30) == 30
    results = _java_admin(proxy.bootstrap, "deleter", "delete", first, second)
    assert results[first][0] == "OK"
    assert results[second][0] == "ThrottlingQuotaExceededException"
    assert results[second][2] == THROTTLING_QUOTA_EXCEEDED_MESSAGE
    assert _partitions(kafka_broker, second, 30) == 30


@pytest.mark.timeout(120)
def test_refused_topic_is_refunded(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    """A topic the broker refuses (it exists already) costs nothing, as in Kafka's controller."""
    existing, fresh = _name("m-exists"), _name("m-fresh")
    kafka_broker.create_topic(existing, partitions=1)
    assert _partitions(kafka_broker, existing, 1) == 1
    results = _java_admin(proxy.bootstrap, "refunded", "create", f"{existing}:20", f"{fresh}:20")
    assert results[existing][0] == "TopicExistsException"
    assert results[fresh][0] == "OK"
    state = json.loads(proxy.admin_get("/quotas/entity?client_id=refunded")[1])
    assert state["controller_mutation_rate"]["tokens"] > -1  # 20 - 20 (+refill), not -20


@pytest.mark.timeout(120)
def test_aiokafka_admin_old_version_is_muted_not_rejected(
    kafka_broker: KafkaCluster, proxy: ProxyProcess
) -> None:
    """aiokafka speaks CreateTopics below v6: permissive, as for Kafka's old clients. Every topic
    is created and the client is told to back off (and muted)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    names = [_name("m-aio"), _name("m-aio")]

    async def create() -> tuple[int, int, list[int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="aio-admin")
        await admin.start()
        try:
            resp = await admin.create_topics([NewTopic(n, 30, 1) for n in names])
        finally:
            await admin.close()
        errors = [t[1] for t in resp.topic_errors]
        return resp.API_VERSION, resp.throttle_time_ms, errors

    version, throttle_ms, errors = asyncio.run(create())
    assert version < 6
    assert errors == [ErrorCode.NONE, ErrorCode.NONE]
    assert throttle_ms == 20000  # 20 - 60 = -40 tokens at 2/s
    assert all(_partitions(kafka_broker, n, 30) == 30 for n in names)
    assert proxy.metric("kthrottle_throttled_requests_total", {"api": "CreateTopics", "mode": "applied"}) >= 1


@pytest.mark.timeout(120)
def test_confluent_admin_is_throttled(kafka_broker: KafkaCluster, proxy: ProxyProcess) -> None:
    # confluent-kafka's typing: admin imports NewTopic from cimpl without re-exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    throttles = ThrottleWatch()
    admin = AdminClient(
        {"bootstrap.servers": proxy.bootstrap, "client.id": "rdkafka-admin", **throttles.config(200)}
    )
    names = [_name("m-rdk"), _name("m-rdk")]
    futures = admin.create_topics([NewTopic(n, 30, 1) for n in names], operation_timeout=30)
    outcomes = {}
    for name, future in futures.items():
        try:
            future.result(30)
            outcomes[name] = "OK"
        except Exception as exc:
            outcomes[name] = str(exc)
    for _ in range(10):
        admin.poll(0.2)
    created = [n for n in names if outcomes[n] == "OK"]
    refused = [n for n in names if outcomes[n] != "OK"]
    # librdkafka's version decides strict or permissive; either way the quota shows.
    if refused:
        assert any(re.search("THROTTLING_QUOTA_EXCEEDED|throttling quota", o) for o in outcomes.values())
    else:
        assert throttles.max > 0, "librdkafka never saw a throttle"
    assert created and all(_partitions(kafka_broker, n, 30) == 30 for n in created)


def _steps(bootstrap: str, client_id: str, *args: str) -> list[tuple[str, int]]:
    """Run MutationAdmin's ``sequence``; each request's (outcome, throttle ms the client was given)."""
    proc = run_tool(JAVA_ADMIN, bootstrap, client_id, "sequence", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = []
    for line in proc.stdout.splitlines():
        if line.startswith("STEP "):
            _step, _topic, _attempt, outcome, throttle, _at = line.split(" ")
            steps.append((outcome, int(throttle)))
    return steps


@pytest.mark.timeout(150)
def test_side_by_side_with_the_brokers_own_quota(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """The same sequence of CreateTopics, one topic per request, retried after each throttle, by
    Kafka's Java admin client: straight to the broker under the broker's own
    controller_mutation_rate, and through the proxy under the same quota (the broker's window of
    11 x 1 s, so the same burst). The client sees the same answers and the same throttles."""
    rate, partitions, topics = 5, 25, 5  # burst 55: three admitted, then each one waits its turn
    direct_id, proxied_id = _name("side-direct"), _name("side-proxy")
    quotas = {
        "controller_window": {"num": 11, "size_seconds": 1},
        "clients": {proxied_id: {"controller_mutation_rate": rate}},
    }
    alter = run_tool(
        "kafka.admin.ConfigCommand",
        "--bootstrap-server",
        kafka_broker.bootstrap_servers,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        direct_id,
        "--add-config",
        f"controller_mutation_rate={rate}",
    )
    assert alter.returncode == 0, alter.stderr[-2000:]
    direct_topics = [f"{_name('side-d')}:{partitions}" for _ in range(topics)]
    proxied_topics = [f"{_name('side-p')}:{partitions}" for _ in range(topics)]
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:

        async def both() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
            return await asyncio.gather(
                asyncio.to_thread(
                    _steps, kafka_broker.bootstrap_servers, direct_id, "await-quota", *direct_topics
                ),
                asyncio.to_thread(_steps, proxy.bootstrap, proxied_id, *proxied_topics),
            )

        direct, proxied = asyncio.run(both())
    throttled = "ThrottlingQuotaExceededException"
    assert [o for o, _ in direct] == ["OK", "OK", "OK", throttled, "OK", throttled, "OK"], direct
    assert [o for o, _ in proxied] == [o for o, _ in direct], (direct, proxied)
    for (_, broker_ms), (_, proxy_ms) in zip(direct, proxied, strict=True):
        assert abs(broker_ms - proxy_ms) <= max(300, 0.1 * broker_ms), (direct, proxied)
