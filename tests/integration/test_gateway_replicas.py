"""One quota across a gateway's replicas: three kthrottle replicas behind a real TCP load balancer
(HAProxy, a new connection to the next replica) in front of the real 3-broker cluster, with the
cluster-quota exchange on, as the chart renders it for more than one replica.

One client's connections (bootstrap, one per broker) land on different replicas; each replica
sees a part of the client's traffic, and together they hold it to the one quota. Replica 2 reaches
the exchange through a relay of the test's own, so the test can cut it off the exchange alone
while it goes on serving its clients.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.harness import KafkaCluster, run_tool
from dev.load_balancer import Frontend, GatewayReplicas, HAProxy, Server
from dev.workloads import producer_id_storm, rate_between, steady_producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MiB = 1024 * 1024
QUOTA = 2 * MiB
WINDOW = {"num": 11, "size_seconds": 0.5}  # Kafka's 11 samples, half-second: bursts of 5 s
MUTATION_RATE, PIDS_RATE = 5, 2.0
MUTATOR = f"mutator-{uuid.uuid4().hex[:6]}"
JAVA_ADMIN = str(Path(__file__).parent / "java" / "MutationAdmin.java")
EXCHANGE = "EXCHANGE"  # the 3-node cluster's relayed listener (conftest)


def quotas(extra_clients: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "window": WINDOW,
        "controller_window": {"num": 11, "size_seconds": 1},
        "producer_ids": {"window": {"num": 5, "size_seconds": 2}, "max_bytes_per_user": 8192},
        "clients": {
            "spread-p": {"producer_byte_rate": QUOTA},
            "spread-f": {"consumer_byte_rate": QUOTA},
            "alone-p": {"producer_byte_rate": QUOTA, "scope": "instance"},
            MUTATOR: {"controller_mutation_rate": MUTATION_RATE},
            **(extra_clients or {}),
        },
        "users": {"<default>": {"producer_ids_rate": PIDS_RATE}},
    }


@pytest.fixture(scope="module")
def relay(kafka_cluster3: KafkaCluster) -> Iterator[HAProxy]:
    """The way replica 2 reaches the brokers for the exchange (and nothing else)."""
    frontends = [
        Frontend(f"exchange-{n.node_id}", n.relayed[EXCHANGE][1], [Server(n.host, n.relayed[EXCHANGE][0])])
        for n in kafka_cluster3.nodes
    ]
    with HAProxy(frontends) as lb:
        yield lb


@pytest.fixture(scope="module")
def gateway(kafka_cluster3: KafkaCluster, relay: HAProxy) -> Iterator[GatewayReplicas]:
    through_relay = {
        "exchange": {"bootstrap_servers": [n.relayed_address(EXCHANGE) for n in kafka_cluster3.nodes]}
    }
    cluster_quotas = {"enabled": True, "replicas": 3, "topic": f"__kthrottle_gw_{uuid.uuid4().hex[:8]}"}
    with GatewayReplicas(
        kafka_cluster3, 3, quotas=quotas(), cluster_quotas=cluster_quotas, per_replica=[{}, {}, through_relay]
    ) as gw:
        wait_for(lambda: sharing(gw, 3), gw, 30)
        yield gw


def sharing(gw: GatewayReplicas, n: int) -> bool:
    """Every replica sees the n and shares the quotas through the exchange (no fallback)."""
    return all(
        gw.metric(i, "kthrottle_cluster_quota_instances") == n
        and gw.metric(i, "kthrottle_cluster_quota_fallback") == 0
        for i in range(n)
    )


def wait_for(check: Any, gw: GatewayReplicas, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, gw.logs()
        time.sleep(0.2)


def topic_over_three_brokers(cluster: KafkaCluster, prefix: str) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=6, replication=1)
    return topic


def produce(
    bootstrap: str, topic: str, client_id: str, offered: float, seconds: float
) -> list[tuple[float, int]]:
    """librdkafka producing ``offered`` bytes/s for ``seconds``: (time, bytes) per acknowledged message."""
    stop = threading.Event()
    acked: list[tuple[float, int]] = []
    thread = threading.Thread(
        target=steady_producer, args=(bootstrap, topic, client_id, offered, stop, acked)
    )
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(60)
    return acked


def greedy_spread_producer(
    gw: GatewayReplicas, topic: str
) -> tuple[threading.Event, list[tuple[float, int]], threading.Thread]:
    """``spread-p`` producing three times its quota through the gateway, started: set the event
    to stop it; the list gets (time, bytes) of each acknowledged message."""
    stop = threading.Event()
    acked: list[tuple[float, int]] = []
    thread = threading.Thread(
        target=steady_producer, args=(gw.bootstrap, topic, "spread-p", 3 * QUOTA, stop, acked)
    )
    thread.start()
    return stop, acked, thread


def produced(gw: GatewayReplicas, index: int) -> float:
    return gw.metric(index, "kthrottle_request_bytes_total", {"api": "Produce"})


def fetched(gw: GatewayReplicas, index: int) -> float:
    return gw.metric(index, "kthrottle_response_bytes_total", {"api": "Fetch"})


def producing_on_every_replica(gw: GatewayReplicas, client_id: str) -> bool:
    """Every replica has a broker connection of ``client_id`` that carried a 16 KiB value."""
    for replica in gw.replicas:
        rows = json.loads(replica.admin_get(f"/connections?client_id={client_id}")[1])["connections"]
        if not any(row["broker"] is not None and row["bytes_in"] >= 16384 for row in rows):
            return False
    return True


@dataclass
class SpreadRuns:
    """The spread producer (beside a client whose quota is per replica) and the spread consumer,
    run side by side over the same span; each test judges its own client."""

    start: float
    produced: dict[str, list[tuple[float, int]]]  # client id -> (time, bytes) acknowledged
    carried: list[float]  # Produce bytes each replica carried
    views: list[Any]  # /quotas/entity of the spread producer on each replica, while it produced
    fetch_marks: list[tuple[float, int]]  # (seconds from start, bytes consumed so far)
    fetched: list[float]  # Fetch bytes each replica returned


def _consume_spread(bootstrap: str, topic: str, seconds: float) -> list[tuple[float, int]]:
    """A greedy librdkafka consumer ``spread-f`` reading ``topic`` for ``seconds``."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "client.id": "spread-f",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    got, marks, start = 0, [], time.monotonic()
    while time.monotonic() - start < seconds:
        for msg in consumer.consume(num_messages=1000, timeout=0.2):
            if msg.error() is None:
                got += len(msg.value() or b"")
        marks.append((time.monotonic() - start, got))
    consumer.close()
    return marks


@pytest.fixture(scope="module")
def spread_runs(kafka_cluster3: KafkaCluster, gateway: GatewayReplicas) -> SpreadRuns:
    """A producer greedy for three times its quota, a producer whose quota says ``scope:
    instance`` and a greedy consumer, started in that order, each with a broker connection on
    every replica, side by side."""
    produce_topic = topic_over_three_brokers(kafka_cluster3, "gw-spread")
    fetch_topic = topic_over_three_brokers(kafka_cluster3, "gw-fetch")
    # Three bursts and 30 s of the quota, with room: never runs dry. Half before the consumer
    # starts (more than its first three bursts), the rest beside it, far faster than the quota.
    _fill(kafka_cluster3, fetch_topic, 50)
    rest = threading.Thread(target=_fill, args=(kafka_cluster3, fetch_topic, 50))
    rest.start()
    before = [produced(gateway, i) for i in range(3)]
    result: dict[str, Any] = {}
    start = time.monotonic()

    def run(name: str, work: Any) -> threading.Thread:
        thread = threading.Thread(target=lambda: result.setdefault(name, work()))
        thread.start()
        return thread

    # Each client's broker connections are steered one to each replica, a different one for each
    # client, and spread again once they are open: left to the round robins, one client's
    # connections land wherever the others' left them, and could all reach one replica.
    nodes = sorted(gateway.broker_ports)

    def placed(shift: int, name: str, work: Any, started: Any) -> threading.Thread:
        """Steer, start the client, wait until it reached every replica, spread again."""
        try:
            gateway.steer({node: (k + shift) % 3 for k, node in enumerate(nodes)})
            thread = run(name, work)
            wait_for(started, gateway, 30)
        finally:
            gateway.unpin()
        return thread

    threads = [
        placed(
            0,
            "spread",
            lambda: produce(gateway.bootstrap, produce_topic, "spread-p", 3 * QUOTA, 22),
            lambda: all(produced(gateway, i) > before[i] for i in range(3)),
        ),
        placed(
            1,
            "alone",
            lambda: produce(gateway.bootstrap, produce_topic, "alone-p", 2 * QUOTA, 22),
            lambda: producing_on_every_replica(gateway, "alone-p"),
        ),
    ]
    # Both producers' rates are read from start + 8 s: they must be in place by then.
    assert time.monotonic() < start + 8, f"the producers took {time.monotonic() - start:.1f} s to place"
    fetched_before = [fetched(gateway, i) for i in range(3)]
    threads.append(
        placed(
            2,
            "fetch",
            lambda: _consume_spread(gateway.bootstrap, fetch_topic, 30),
            lambda: all(fetched(gateway, i) > fetched_before[i] for i in range(3)),
        )
    )
    time.sleep(max(0.0, start + 20 - time.monotonic()))
    # Read while the client produces (its rates fade once it stops).
    views = [
        json.loads(r.admin_get("/quotas/entity?client_id=spread-p")[1])["producer_byte_rate"]
        for r in gateway.replicas
    ]
    for thread in [*threads, rest]:
        thread.join(90)
    return SpreadRuns(
        start,
        {"spread-p": result["spread"], "alone-p": result["alone"]},
        [produced(gateway, i) - before[i] for i in range(3)],
        views,
        result["fetch"],
        [fetched(gateway, i) - fetched_before[i] for i in range(3)],
    )


def test_one_client_spread_over_three_replicas_is_held_to_one_quota(spread_runs: SpreadRuns) -> None:
    """A producer greedy for three times its quota, its connections on all three replicas: the
    three let through the one quota together. Beside it, a client whose quota says
    ``scope: instance`` gets it from each replica (Kafka's per-broker semantics)."""
    runs, start = spread_runs, spread_runs.start
    assert all(part > 0 for part in runs.carried), runs.carried  # every replica carried some of it
    rate = rate_between(runs.produced["spread-p"], start + 8, start + 22)
    assert rate == pytest.approx(QUOTA, rel=0.05), (rate / QUOTA, runs.views)
    # Each replica shows its own share and the cluster's total (the exchange's view).
    for view in runs.views:
        assert view["cluster"]["shared"] is True
        assert view["cluster"]["this_replica_rate"] < view["cluster"]["cluster_rate"], runs.views
    alone_rate = rate_between(runs.produced["alone-p"], start + 8, start + 22)
    assert alone_rate > 1.5 * QUOTA, alone_rate / QUOTA  # one quota per replica, as asked


def _fill(cluster: KafkaCluster, topic: str, mebibytes: int, partitions: int = 6) -> None:
    """``mebibytes`` of 16 KiB values, spread evenly over the partitions (librdkafka's sticky
    partitioner put a fresh topic's first 50 MiB on two partitions of six)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 20, "batch.size": MiB})
    value = b"v" * 16384
    for i in range(mebibytes * 64):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def test_one_consumer_spread_over_three_replicas_is_held_to_one_quota(spread_runs: SpreadRuns) -> None:
    """A greedy librdkafka consumer fetching from the three brokers through three replicas."""
    marks = spread_runs.fetch_marks
    # The last 10 s of 30: the first fetches reach the three replicas at once, and before their
    # reports cross they can give out up to about three bursts (docs/quotas.md, "One quota across gateway
    # replicas"), paid back by throttling until 10-13 s in on a loaded machine (CI: 29 MiB at once).
    # The slope of a least-squares line through what had arrived (answers come in lumps of up to
    # three at once: two points would read where the lumps fall).
    steady = [(t, n) for t, n in marks if t >= 20]
    rate = statistics.linear_regression([t for t, _ in steady], [n for _, n in steady]).slope
    per_second = [round((b[1] - a[1]) / MiB, 2) for a, b in zip(marks[::5], marks[5::5], strict=False)]
    # Answers of about 1 MiB (a partition's max) on three connections, in lumps after a long
    # pay-back: over 10 s the rate read varies from 0.94 to 1.05 of the quota from run to run.
    # (Filled by librdkafka's sticky partitioner, a fresh topic's first 50 MiB went to two
    # partitions of six: a broker's partitions ran dry, the consumer was greedy on two
    # connections only, and one such run read 1.33 here.)
    # Held to one quota for the three replicas, not three (the 5% figure is bench/cluster_quota.py's,
    # over 30 s): never more than 10% over, and served.
    assert 0.8 * QUOTA <= rate <= 1.1 * QUOTA, (rate / QUOTA, marks[-1][1] / MiB, per_second)
    assert all(f > 0 for f in spread_runs.fetched), spread_runs.fetched  # through every replica


def _steps(bootstrap: str, client_id: str, *args: str) -> list[tuple[str, int, int]]:
    """Each request's (outcome, throttle ms, ms from the first request to its sending)."""
    proc = run_tool(JAVA_ADMIN, bootstrap, client_id, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = []
    for line in proc.stdout.splitlines():
        if line.startswith("STEP "):
            _step, _topic, _attempt, outcome, throttle, at = line.split(" ")
            steps.append((outcome, int(throttle), int(at)))
    return steps


@pytest.mark.timeout(180)
def test_mutations_through_three_replicas_get_the_controllers_answers(
    kafka_cluster3: KafkaCluster, gateway: GatewayReplicas
) -> None:
    """The same sequence of CreateTopics, one topic per request, each request from a new admin
    client (so the load balancer sends them to different replicas): straight to the brokers under
    their own controller_mutation_rate, and through the gateway under the same quota. Kafka's
    controller enforces the quota once for the cluster; the replicas decide each request in the
    exchange topic's order, and the client sees the same answers and throttles."""
    direct_id = f"direct-{uuid.uuid4().hex[:6]}"
    alter = run_tool(
        "kafka.admin.ConfigCommand",
        "--bootstrap-server",
        kafka_cluster3.bootstrap_servers,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        direct_id,
        "--add-config",
        f"controller_mutation_rate={MUTATION_RATE}",
    )
    assert alter.returncode == 0, alter.stderr[-2000:]
    before = [gateway.metric(i, "kthrottle_requests_total", {"api": "CreateTopics"}) for i in range(3)]

    def topics(tag: str) -> list[str]:
        return [f"{tag}-{uuid.uuid4().hex[:8]}:25" for _ in range(5)]  # burst 55: three, then turns

    direct: list[tuple[str, int, int]] = []
    thread = threading.Thread(
        target=lambda: direct.extend(
            _steps(
                kafka_cluster3.bootstrap_servers, direct_id, "sequence-spread", "await-quota", *topics("gw-d")
            )
        )
    )
    thread.start()
    proxied = _steps(gateway.bootstrap, MUTATOR, "sequence-spread", *topics("gw-p"))
    thread.join(120)
    throttled = "ThrottlingQuotaExceededException"
    assert [o for o, _t, _a in direct] == ["OK", "OK", "OK", throttled, "OK", throttled, "OK"], direct
    assert [o for o, _t, _a in proxied] == [o for o, _t, _a in direct], (direct, proxied)
    # Each throttle says when the bucket is back at zero; a new admin client a request paces the
    # requests unevenly, so that moment (from the sequence's first request) is compared.
    for (_, broker_ms, broker_at), (_, proxy_ms, proxy_at) in zip(direct, proxied, strict=True):
        if broker_ms or proxy_ms:
            assert abs((broker_at + broker_ms) - (proxy_at + proxy_ms)) <= 400, (direct, proxied)
    reached = [
        gateway.metric(i, "kthrottle_requests_total", {"api": "CreateTopics"}) - before[i] for i in range(3)
    ]
    assert sum(1 for n in reached if n > 0) >= 2, reached  # decided across replicas, not by one


def test_a_producer_id_storm_over_three_replicas_is_held_to_one_rate(
    kafka_cluster3: KafkaCluster, gateway: GatewayReplicas
) -> None:
    """Short-lived idempotent producers, each on new connections (so on every replica in turn):
    the replicas count each new producer id once and hold the user to one producer_ids_rate."""
    storm, steady = f"gw-storm-{uuid.uuid4().hex[:6]}", f"gw-steady-{uuid.uuid4().hex[:6]}"
    kafka_cluster3.create_topic(storm, partitions=3, replication=1)
    kafka_cluster3.create_topic(steady, partitions=3, replication=1)
    before = [gateway.metric(i, "kthrottle_requests_total", {"api": "InitProducerId"}) for i in range(3)]
    result = producer_id_storm(gateway.bootstrap, {}, {}, storm, steady, 24, threads=6)
    rate = result.rate(12, 24)
    assert rate <= PIDS_RATE * 1.15, rate  # three replicas alone would let three times through
    assert rate >= PIDS_RATE * 0.6, rate  # and the user is not starved
    reached = [
        gateway.metric(i, "kthrottle_requests_total", {"api": "InitProducerId"}) - before[i] for i in range(3)
    ]
    assert all(n > 0 for n in reached), reached


def _entity(replica: Any, client_id: str) -> Any:
    """A replica's view of a client's produce quota, shortly (for failure messages)."""
    e = json.loads(replica.admin_get(f"/quotas/entity?client_id={client_id}")[1])["producer_byte_rate"]
    c = e.get("cluster", {})
    return (
        round(e.get("tokens", 0) / MiB, 2),
        e.get("throttle_ms"),
        round(c.get("this_replica_rate", 0) / MiB, 2),
        c.get("blocked"),
        c.get("capped"),
        c.get("fair_part") and round(c["fair_part"] / MiB, 2),
        {k: (v["age_ms"], v["flags"]) for k, v in c.get("wanting", {}).items()},
    )


def _rewrite(replica: Any, change: Any) -> None:
    """Change one replica's config file (it reloads it by itself)."""
    cfg = yaml.safe_load(replica.config_path.read_text())
    change(cfg)
    replica.config_path.write_text(yaml.safe_dump(cfg))


def test_a_quota_set_on_busy_clients_bites_at_once_on_every_replica(
    kafka_cluster3: KafkaCluster, gateway: GatewayReplicas
) -> None:
    """Two clients with generated ids (``late-<random>``), together producing at twice what their
    new quota will be, spread over the three replicas; a ``client_id_prefixes`` quota for
    ``late-`` is set (each replica's config reloaded). Their one prefix bucket holds once across
    the replicas through the exchange, and, as on a broker, whose windowed rate holds the
    clients' recent traffic, from the next requests: no burst of a fresh bucket."""
    topic = topic_over_three_brokers(kafka_cluster3, "gw-late")
    stop = threading.Event()
    names = [f"late-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    acked: dict[str, list[tuple[float, int]]] = {name: [] for name in names}
    threads = [
        threading.Thread(
            target=steady_producer, args=(gateway.bootstrap, topic, name, QUOTA, stop, acked[name])
        )
        for name in names
    ]
    for thread in threads:
        thread.start()

    def together(t_from: float, t_to: float) -> float:
        return sum(rate_between(a, t_from, t_to) for a in acked.values())

    try:
        time.sleep(8)
        before = together(time.monotonic() - 4, time.monotonic())
        assert before > 1.6 * QUOTA, before / QUOTA  # no quota yet
        reloads = [
            r.metric("kthrottle_config_reloads_total", {"result": "applied"}) for r in gateway.replicas
        ]
        for replica in gateway.replicas:
            _rewrite(
                replica,
                lambda cfg: cfg["quotas"].update(
                    {"client_id_prefixes": {"late-": {"producer_byte_rate": QUOTA}}}
                ),
            )
        wait_for(
            lambda: all(
                r.metric("kthrottle_config_reloads_total", {"result": "applied"}) > reloads[i]
                for i, r in enumerate(gateway.replicas)
            ),
            gateway,
            15,
        )
        set_at = time.monotonic()
        time.sleep(7)
        views = [
            json.loads(r.admin_get(f"/quotas/entity?client_id={names[0]}")[1])["producer_byte_rate"]
            for r in gateway.replicas
        ]
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        for replica in gateway.replicas:
            _rewrite(replica, lambda cfg: cfg["quotas"].pop("client_id_prefixes", None))
    after = together(set_at + 1, set_at + 7)
    assert after <= 1.1 * QUOTA, after / QUOTA  # a fresh bucket's burst would let 2x through for 5 s
    for view in views:  # one bucket for the prefix, shared by the three replicas
        assert view["via"] == "prefix:late-" and view["bucket"]["client_id"] == "<prefix:late->", view
        assert view["cluster"]["shared"] is True, view


def test_a_replica_cut_off_from_the_exchange_keeps_its_part_and_the_sum_holds(
    kafka_cluster3: KafkaCluster, gateway: GatewayReplicas, relay: HAProxy
) -> None:
    """Replica 2 loses the exchange (its relay stops) but goes on serving its clients: its own
    reports stop coming back, so it holds quota / 3 alone; the others hear nothing from it, ask it
    whether it is alive (it is), set its part aside and share the rest. In steady state the three
    together stay within the quota; /readyz and the metrics say why. When the exchange returns,
    they share the quota again."""
    topic = topic_over_three_brokers(kafka_cluster3, "gw-cut")
    stop, acked, thread = greedy_spread_producer(gateway, topic)
    try:
        time.sleep(6)
        for fe in relay.frontends:
            relay.command(f"set server {fe.name}/s0 state maint")
            relay.command(f"shutdown sessions server {fe.name}/s0")
        wait_for(
            lambda: (
                gateway.metric(2, "kthrottle_cluster_quota_fallback") == 1
                and all(
                    gateway.metric(i, "kthrottle_cluster_quota_multiplier") == pytest.approx(2 / 3)
                    for i in (0, 1)
                )
            ),
            gateway,
            20,
        )
        steady_from = time.monotonic() + 2
        time.sleep(12)
        ready = json.loads(gateway.replicas[2].admin_get("/readyz")[1])
        others = json.loads(gateway.replicas[0].admin_get("/quotas/cluster")[1])
    finally:
        for fe in relay.frontends:
            relay.command(f"set server {fe.name}/s0 state ready")
    try:
        wait_for(
            lambda: all(gateway.metric(i, "kthrottle_cluster_quota_fallback") == 0 for i in range(3)),
            gateway,
            20,
        )
    finally:
        stop.set()
        thread.join(60)
    rate = rate_between(acked, steady_from, steady_from + 10)
    assert rate <= 1.05 * QUOTA, rate / QUOTA
    # The parts are even, whatever share of the client's traffic each replica carries: a
    # client with more of its connections on the replica cut off gets less than its quota
    # meanwhile (docs/quotas.md: "When the exchange is not there"), but is served.
    assert rate >= 0.25 * QUOTA, (rate / QUOTA, gateway.logs())
    assert ready["ready"] is True and ready["cluster_quotas"]["fallback"] is True, ready
    assert "have not come back" in ready["cluster_quotas"]["reason"], ready
    assert others["multiplier"] == pytest.approx(2 / 3, abs=1e-3), others
    assert [p["probe"] for p in others["others"] if p["instance"] == "replica-2"] == ["alive"], others


def test_a_killed_replicas_clients_reconnect_and_the_quota_holds(
    kafka_cluster3: KafkaCluster, gateway: GatewayReplicas
) -> None:
    """SIGKILL one replica under load: its connections drop, the client reconnects through the
    load balancer to the two left, which give it the whole quota (nothing waits for the dead
    replica's part to be handed over); every acknowledged message is in the topic."""
    from confluent_kafka import Consumer, TopicPartition

    topic = topic_over_three_brokers(kafka_cluster3, "gw-kill")
    stop, acked, thread = greedy_spread_producer(gateway, topic)
    try:
        time.sleep(8)
        killed_at = time.monotonic()
        gateway.kill(0)
        views = []
        for _ in range(14):
            time.sleep(1)
            views.append([_entity(gateway.replicas[i], "spread-p") for i in (1, 2)])
    finally:
        stop.set()
        thread.join(60)
        gateway.restart(0)  # the last test of the three replicas: nothing waits for them to share
    after = rate_between(acked, killed_at + 4, killed_at + 14)
    series = [round(rate_between(acked, killed_at + s, killed_at + s + 1) / QUOTA, 2) for s in range(-8, 14)]
    assert after == pytest.approx(QUOTA, rel=0.1), (after / QUOTA, series, views)
    consumer = Consumer({"bootstrap.servers": kafka_cluster3.bootstrap_servers, "group.id": f"g-{topic}"})
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(6)]
    consumer.close()
    assert sum(ends) >= len(acked), (sum(ends), len(acked))  # nothing acknowledged lost


def test_a_reload_that_turns_quotas_cluster_wide_starts_the_exchange(kafka_cluster3: KafkaCluster) -> None:
    """Two replicas started without the exchange: each holds quotas alone. A reload that enables
    cluster_quotas starts the exchange on both, and they find each other."""
    topic = f"__kthrottle_gw_reload_{uuid.uuid4().hex[:8]}"
    with GatewayReplicas(kafka_cluster3, 2, quotas=quotas()) as gw:
        assert gw.replicas[0].admin_get("/quotas/cluster")[1] == '{"enabled": false}'
        for replica in gw.replicas:
            _rewrite(
                replica,
                lambda cfg: cfg.update(
                    cluster_quotas={
                        "enabled": True,
                        "replicas": 2,
                        "topic": topic,
                        "peer_host": cfg["bind_host"],
                    }
                ),
            )
        wait_for(lambda: sharing(gw, 2), gw, 30)
        view = json.loads(gw.replicas[1].admin_get("/quotas/cluster")[1])
        assert view["enabled"] is True and view["instances"] == 2, view
