"""Cluster-wide volume quotas (Strimzi proposal) against a real 3-broker cluster and 3 proxies.

Each proxy publishes the usage of one broker's "log dir": a small tmpfs the test fills, measured
with statvfs (the real measurement path). All three read the compacted topic and decide alike:
one broker's volume past its soft limit throttles producers on every proxy, past its hard limit
pauses them, including producers that only write to another broker; freeing space resumes them
with nothing lost or duplicated; a publisher gone makes the others apply the fail-safe.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import ThrottleWatch
from tests.tools import unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MiB = 1024 * 1024
VOLUME_MIB = 16
STALENESS_S = 4.0


@pytest.fixture
def volumes(tmp_path: Path) -> Iterator[list[Path]]:
    """Three small tmpfs mounts, one per broker; skipped where mounting is not allowed."""
    mounts = []
    try:
        for i in (1, 2, 3):
            path = tmp_path / f"broker-{i}-data"
            path.mkdir()
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={VOLUME_MIB}m", "tmpfs", str(path)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                unavailable(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
            mounts.append(path)
        yield mounts
    finally:
        for path in mounts:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(volume: Path, used_share: float) -> None:
    """Make ``used_share`` of the volume used (one file, rewritten)."""
    target = volume / "fill.bin"
    target.unlink(missing_ok=True)
    with open(target, "wb") as f:
        f.write(b"\0" * int(VOLUME_MIB * MiB * used_share))


def volume_config(volume: Path, broker_id: int) -> dict[str, Any]:
    return {
        "enabled": True,
        "topic": f"__kthrottle_volume_test_{uuid.uuid4().hex[:8]}",
        "publish_interval_seconds": 0.5,
        "staleness_seconds": STALENESS_S,
        "fail_safe": "pause",
        "max_throttle_delay_ms": 3000,
        "soft_limit": {"type": "MinFreePercentage", "value": 50},
        "hard_limit": {"type": "MinFreePercentage", "value": 20},
        "source": {"type": "statvfs", "log_dirs": [str(volume)], "broker_id": broker_id},
    }


def state_of(proxy: ProxyProcess) -> dict[str, Any]:
    status, body = proxy.admin_get("/volume")
    assert status == 200, body
    result: dict[str, Any] = json.loads(body)
    return result


def wait_for(
    what: str, check: Callable[[], bool], timeout: float = 20.0, proxies: Sequence[ProxyProcess] = ()
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    states = "\n".join(json.dumps(state_of(p)) + "\n" + p.log_tail(15) for p in proxies)
    raise AssertionError(f"timed out waiting for {what}\n{states}")


def end_offset(cluster: KafkaCluster, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "volume-watermarks"})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


def read_all(bootstrap: str, topic: str, expect: int, timeout: float = 30.0) -> list[bytes]:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"volume-read-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(bytes(cast(bytes, msg.value())))
    finally:
        consumer.close()
    return got


class Writer:
    """An idempotent acks=all librdkafka producer through one proxy, recording every delivery."""

    def __init__(self, bootstrap: str, name: str) -> None:
        from confluent_kafka import Producer

        self.name = name
        self.watch = ThrottleWatch()
        self.delivered: list[bytes] = []
        self.errors: list[str] = []
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": name,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                **self.watch.config(250),
            }
        )

    def _done(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered.append(bytes(msg.value()))

    def send(self, topic: str, tag: str, n: int) -> list[bytes]:
        values = [f"{self.name}-{tag}-{i}".encode() for i in range(n)]
        for value in values:
            self.producer.produce(topic, value, on_delivery=self._done)
            self.producer.poll(0)
        return values

    def pump(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.producer.poll(0.1)

    def flush(self, timeout: float) -> int:
        return int(self.producer.flush(timeout))


def test_volume_state_throttles_then_pauses_every_proxy_and_resumes_without_loss(
    kafka_cluster3: KafkaCluster, volumes: list[Path]
) -> None:
    # confluent-kafka's typing: admin imports NewTopic from cimpl without re-exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"volume-b2-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[2]])])[topic].result(30)

    proxies: list[ProxyProcess] = []
    try:
        for i, volume in zip((1, 2, 3), volumes, strict=True):
            cfg = volume_config(volume, i)
            if proxies:
                cfg["topic"] = proxies[0].config["volume"]["topic"]
            proxies.append(ProxyProcess(gateway_config(kafka_cluster3, volume=cfg)).start())
        wait_for(
            "every proxy OPEN", lambda: all(state_of(p)["state"] == "open" for p in proxies), proxies=proxies
        )

        writers = [Writer(p.bootstrap, f"writer-{i}") for i, p in enumerate(proxies, 1)]
        sent: list[bytes] = []
        for w in writers:
            sent += w.send(topic, "open", 20)
        assert all(w.flush(30) == 0 for w in writers)

        # Broker 3's volume past its soft limit (60% used; soft 50%, hard 80%): every proxy
        # throttles produce requests, although these only go to broker 2.
        fill(volumes[2], 0.60)
        wait_for(
            "THROTTLE everywhere",
            lambda: all(state_of(p)["state"] == "throttle" for p in proxies),
            proxies=proxies,
        )
        for w in writers:
            sent += w.send(topic, "throttle", 20)
            assert w.flush(60) == 0
            w.pump(0.6)  # one more statistics interval
            assert w.watch.max >= 500, (w.name, w.watch.max)  # ~1/3 of 3000 ms at 60%

        # Past the hard limit: PAUSE. Nothing more reaches broker 2, and no client errs.
        fill(volumes[2], 0.90)
        wait_for(
            "PAUSE everywhere", lambda: all(state_of(p)["state"] == "pause" for p in proxies), proxies=proxies
        )
        before = end_offset(kafka_cluster3, topic)
        for w in writers:
            sent += w.send(topic, "paused", 30)
        for w in writers:
            w.pump(1.0)
        assert end_offset(kafka_cluster3, topic) == before
        assert all(p.metric("kthrottle_volume_parked_bytes") > 0 for p in proxies)
        assert not any(w.errors for w in writers), [w.errors for w in writers]
        # Fetches are never held by the volume state.
        assert len(read_all(proxies[0].bootstrap, topic, before, timeout=20)) >= before

        # Space comes back: everything parked goes through, exactly once.
        fill(volumes[2], 0.10)
        wait_for("OPEN again", lambda: all(state_of(p)["state"] == "open" for p in proxies), proxies=proxies)
        assert all(w.flush(60) == 0 for w in writers)
        assert not any(w.errors for w in writers), [w.errors for w in writers]
        got = read_all(kafka_cluster3.bootstrap_servers, topic, len(sent))
        assert sorted(got) == sorted(sent)  # all there, none twice
        assert len(set(got)) == len(got)

        # The publisher of broker 3 goes away: once its snapshot is stale the others cannot know
        # broker 3's state and apply the fail-safe (PAUSE), and say so.
        proxies[2].stop()
        wait_for(
            "fail-safe PAUSE on the others",
            lambda: all(
                state_of(p)["state"] == "pause" and p.metric("kthrottle_volume_fail_safe") == 1
                for p in proxies[:2]
            ),
            timeout=STALENESS_S + 15,
        )
        assert "unknown brokers: 3 stale" in proxies[0].log_text()
    finally:
        for p in proxies:
            with contextlib.suppress(Exception):
                p.stop()


def test_paused_produce_past_the_memory_bound_is_answered_retriable_and_lands_once(
    kafka_cluster3: KafkaCluster, volumes: list[Path]
) -> None:
    """With no memory left for parked requests, a paused produce is answered at once with a
    retriable error and a throttle; the idempotent producer retries until space returns, and
    every message lands exactly once. (fail_safe open: only broker 1 publishes here.)"""
    # confluent-kafka's typing: admin imports NewTopic from cimpl without re-exporting it
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"volume-bound-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers})
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[3]])])[topic].result(30)
    cfg = {**volume_config(volumes[0], 1), "fail_safe": "open", "max_parked_bytes": 0}
    proxy = ProxyProcess(gateway_config(kafka_cluster3, volume=cfg)).start()
    try:
        wait_for("OPEN", lambda: state_of(proxy)["state"] == "open", proxies=[proxy])
        fill(volumes[0], 0.95)
        wait_for("PAUSE", lambda: state_of(proxy)["state"] == "pause", proxies=[proxy])
        writer = Writer(proxy.bootstrap, "bounded")
        sent = writer.send(topic, "paused", 25)
        writer.pump(3.0)
        assert end_offset(kafka_cluster3, topic) == 0
        assert writer.errors == []  # retriable: librdkafka retries, the application sees nothing
        assert proxy.metric("kthrottle_volume_parked_requests_total", {"outcome": "retriable"}) > 0
        assert writer.watch.max >= 1000  # the throttle time the paused answers carry
        fill(volumes[0], 0.10)
        assert writer.flush(60) == 0
        assert writer.errors == []
        got = read_all(kafka_cluster3.bootstrap_servers, topic, len(sent))
        assert sorted(got) == sorted(sent)
    finally:
        proxy.stop()


def test_describe_log_dirs_source_publishes_the_brokers_own_log_dirs(kafka_broker: KafkaCluster) -> None:
    """Gateway mode: the proxy asks the broker itself (DescribeLogDirs v4, KIP-827) and publishes
    that broker's real log dir with its capacity and usage."""
    cfg: dict[str, Any] = {
        "enabled": True,
        "topic": f"__kthrottle_volume_test_{uuid.uuid4().hex[:8]}",
        "publish_interval_seconds": 0.5,
        "staleness_seconds": STALENESS_S,
        "soft_limit": {"type": "MinFreeBytes", "value": 1024},
        "hard_limit": {"type": "MinFreeBytes", "value": 512},
    }
    proxy = ProxyProcess(gateway_config(kafka_broker, volume=cfg)).start()
    try:
        # OPEN from the broker's own snapshot (the default fail_safe, last_known, is open while a
        # broker has not published yet: wait for its snapshot, not only the state).
        def published() -> bool:
            state = state_of(proxy)
            return state["state"] == "open" and [b["status"] for b in state["brokers"]] == ["fresh"]

        wait_for("OPEN from a fresh snapshot", published, proxies=[proxy])
        (broker,) = state_of(proxy)["brokers"]
        assert broker["broker_id"] == 1 and broker["status"] == "fresh"
        worst = broker["worst"]
        log_dir = kafka_broker.node(1).kafka_data_dir
        assert worst["volume"] == str(log_dir)
        assert worst["capacity"] > worst["consumed"] > 0
        assert proxy.metric("kthrottle_volume_publications_total", {"broker": "1"}) >= 1
        assert proxy.metric("kthrottle_exchange_connected", {"topic": cfg["topic"]}) == 1
    finally:
        proxy.stop()
