"""Consumer-group guard rails through the proxy, with real librdkafka consumers and the real broker's
group coordinator: a consumer crash-looping (a process that starts, joins, and dies without leaving,
again and again) beside two healthy members of its group.

Two groups side by side, each through its own proxy, alike but for the guard: through one, the
looper's client id has a ``join_group_rate`` (set by a hot reload once the group runs); through
the other nothing. Without the guard every
start of the looper reaches the coordinator as a new member, and every join rebalances the group
(its healthy members are revoked and wait for the dead member to time out); with it, the
looper's joins wait in the proxy and die with it, and the healthy members are left alone.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LOOP_SECONDS = 16.0
LIFE_SECONDS = 1.5  # how long each start of the looper lives before it dies
JOIN_RATE = 0.05  # new members per second for the looper's client id: one per 20 s

# One start of the looper: join the group as a new member, poll, die without leaving (no
# LeaveGroup: the coordinator only learns of it when its session times out).
LOOPER = """
import os, sys, time
from confluent_kafka import Consumer
bootstrap, group, topic, client_id, life = sys.argv[1:6]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": client_id,
              "session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "log_level": 0})
c.subscribe([topic])
end = time.monotonic() + float(life)
while time.monotonic() < end:
    c.poll(0.1)
os._exit(1)
"""


@dataclass
class Group:
    name: str
    assignments: dict[str, int] = field(default_factory=dict)  # healthy member -> assignments seen
    looper_starts: int = 0
    joins_forwarded: float = 0.0  # JoinGroup requests the proxy forwarded while the looper ran
    held: float = 0.0
    throttled: float = 0.0


def _healthy_member(bootstrap: str, group: Group, topic: str, name: str, stop: threading.Event) -> None:
    from confluent_kafka import Consumer

    group.assignments[name] = 0

    def on_assign(_consumer: object, _partitions: object) -> None:
        group.assignments[name] += 1

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group.name,
            "client.id": name,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topic], on_assign=on_assign)
    try:
        while not stop.is_set():
            consumer.poll(0.1)
    finally:
        consumer.close()


def _loop(bootstrap: str, group: Group, topic: str, client_id: str, until: float) -> None:
    while time.monotonic() < until:
        subprocess.run(
            [sys.executable, "-c", LOOPER, bootstrap, group.name, topic, client_id, str(LIFE_SECONDS)],
            timeout=30,
            check=False,
        )
        group.looper_starts += 1


@pytest.fixture(scope="module")
def groups(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Group]]:
    tmp = tmp_path_factory.mktemp("guard-rails")
    topic = f"guard-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, partitions=4)
    guard = {"clients": {"looper": {"join_group_rate": JOIN_RATE}}}
    run = {"guarded": Group(f"guarded-{uuid.uuid4().hex[:6]}"), "open": Group(f"open-{uuid.uuid4().hex[:6]}")}
    stop = threading.Event()
    with (
        ProxyProcess(gateway_config(kafka_broker), workdir=tmp / "guarded") as guarded_proxy,
        ProxyProcess(gateway_config(kafka_broker), workdir=tmp / "open") as open_proxy,
    ):
        proxies = {"guarded": guarded_proxy, "open": open_proxy}
        members = [
            threading.Thread(
                target=_healthy_member, args=(proxies[kind].bootstrap, g, topic, f"{kind}-{i}", stop)
            )
            for kind, g in run.items()
            for i in range(2)
        ]
        for member in members:
            member.start()
        try:
            # Both healthy members of both groups have their partitions, and the groups are stable.
            wait_until(
                lambda: all(len(g.assignments) == 2 and all(g.assignments.values()) for g in run.values()),
                30,
                lambda: f"healthy members never assigned: {[g.assignments for g in run.values()]}",
            )
            # The guard comes by a hot reload, while the group runs.
            reloads = {"result": "applied"}
            applied = guarded_proxy.metric("kthrottle_config_reloads_total", reloads)
            guarded_proxy.config["quotas"] = guard
            guarded_proxy.config_path.write_text(yaml.safe_dump(guarded_proxy.config))
            wait_until(
                lambda: guarded_proxy.metric("kthrottle_config_reloads_total", reloads) > applied,
                10,
                guarded_proxy.log_tail,
            )
            time.sleep(1)
            before = {kind: dict(g.assignments) for kind, g in run.items()}
            joins = {
                k: p.metric("kthrottle_requests_total", {"api": "JoinGroup"}) for k, p in proxies.items()
            }
            until = time.monotonic() + LOOP_SECONDS
            loopers = [
                threading.Thread(target=_loop, args=(proxies[kind].bootstrap, g, topic, "looper", until))
                for kind, g in run.items()
            ]
            for looper in loopers:
                looper.start()
            for looper in loopers:
                looper.join(LOOP_SECONDS + 60)
            for kind, g in run.items():
                proxy = proxies[kind]
                g.joins_forwarded = (
                    proxy.metric("kthrottle_requests_total", {"api": "JoinGroup"}) - joins[kind]
                )
                g.held = proxy.metric("kthrottle_group_requests_held_total", {"api": "JoinGroup"})
                g.throttled = proxy.metric("kthrottle_quota_throttles_total", {"quota": "join_group_rate"})
                g.assignments = {name: n - before[kind][name] for name, n in g.assignments.items()}
        finally:
            stop.set()
            for member in members:
                member.join(30)
    yield run


def test_without_the_guard_the_looper_storms_the_coordinator_and_disturbs_the_group(
    groups: dict[str, Group],
) -> None:
    # The control: every start of the looper reached the coordinator as a new member (two
    # JoinGroups each: the first gets a member id, the second joins with it), and rebalanced
    # the healthy members again and again.
    g = groups["open"]
    assert g.looper_starts >= 5, g
    assert g.joins_forwarded >= g.looper_starts, g
    assert min(g.assignments.values()) >= 2, g


def test_a_join_rate_holds_the_coordinators_joins_and_leaves_the_healthy_members_alone(
    groups: dict[str, Group],
) -> None:
    g = groups["guarded"]
    assert g.looper_starts >= 5, g
    # New members let through: at most what the bucket held (its burst, window.num x size x
    # rate = 0.55 of a join), what the rate refilled over the loop, and the one that may take it
    # below zero; each may follow with its second JoinGroup (with its id). Every other start
    # waited in the proxy and died there.
    burst = 11 * 1.0 * JOIN_RATE
    new_members = int(burst + JOIN_RATE * LOOP_SECONDS) + 1
    assert g.joins_forwarded <= 2 * new_members, g
    assert g.held >= g.looper_starts - 1, g
    assert g.throttled >= 1, g
    assert max(g.assignments.values()) <= 1, g  # at most the one join let through
