"""Kafka's own Java clients address topics by id (Fetch v13+, Produce v13+): the KIP-1010 topic
quotas hold for them, and the capture names their topics, never their ids."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from protocol.api_keys import ApiKey
from tests.integration.clients import java_rate_consumer
from tests.integration.test_capture import captured
from tests.integration.test_quotas import (
    CYCLE,
    STEADY,
    WINDOW,
    OffsetSampler,
    perf_producer_command,
    steady_rate,
)

pytestmark = pytest.mark.integration

KiB = 1024
MiB = 1024 * KiB
BY_ID_FROM = 13


def _capture(tmp_path: Path) -> dict[str, object]:
    return {"enabled": True, "directory": str(tmp_path / "capture"), "flush_seconds": 0.2}


def _captured_topics(tmp_path: Path, api_key: int) -> tuple[set[str], set[int]]:
    rows = [r for r in captured(tmp_path / "capture") if r["api_key"] == api_key]
    return {p["topic"] for r in rows for p in r["partitions"]}, {r["api_version"] for r in rows}


@pytest.mark.timeout(240)
def test_java_consumer_held_to_a_topic_fetch_quota(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    topic = f"ids-fetch-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    kafka_broker.fill_topic(topic, 30 * 1024)
    quota = MiB  # per partition; the topic has one
    quotas = {"window": WINDOW, "topics": {topic: {"consumer.byte.rate": quota}}}
    cfg = gateway_config(kafka_broker, quotas=quotas, capture=_capture(tmp_path))
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        marks, stdout = java_rate_consumer(
            proxy.bootstrap,
            topic,
            "java-topic-consumer",
            int(STEADY[1]) + 1,
            "max.partition.fetch.bytes=262144",
        )
        rate = steady_rate(marks, *STEADY, cycle=CYCLE)
        assert abs(rate - quota) / quota < 0.15, f"Java consumer at {rate / KiB:.0f} KiB/s, quota 1 MiB/s"
        throttle = re.search(r"^THROTTLE_MAX ([\d.]+)$", stdout, re.M)
        assert throttle and float(throttle[1]) > 0, "the Java consumer never saw a throttle"
        # Named from the Metadata the client asked through the proxy: no lookup was needed.
        assert proxy.metric("kthrottle_topic_ids_total", {"outcome": "unresolved"}) == 0
    topics, versions = _captured_topics(tmp_path, ApiKey.FETCH)
    assert min(versions) >= BY_ID_FROM, f"the Java consumer fetched with v{sorted(versions)}"
    assert topics == {topic}, f"capture shows {topics}"


@pytest.mark.timeout(240)
def test_java_producer_held_to_a_topic_produce_quota(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    topic = f"ids-produce-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    quota = MiB
    quotas = {"window": WINDOW, "topics": {topic: {"producer.byte.rate": quota}}}
    cfg = gateway_config(kafka_broker, quotas=quotas, capture=_capture(tmp_path))
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        record = 1024
        cmd = perf_producer_command(proxy.bootstrap, topic, "java-topic-producer")
        sampler = OffsetSampler(kafka_broker, topic)
        start = time.monotonic()
        perf = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            sampler.sample_until(start, STEADY[1])
        finally:
            sampler.close()
            perf.kill()
            perf.communicate(timeout=30)
        rate = steady_rate([(t, n * record) for t, n in sampler.samples], *STEADY, cycle=CYCLE)
        assert abs(rate - quota) / quota < 0.15, f"Java producer at {rate / KiB:.0f} KiB/s, quota 1 MiB/s"
        assert proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "applied"}) > 0
    topics, versions = _captured_topics(tmp_path, ApiKey.PRODUCE)
    assert topics == {topic}, f"capture shows {topics} for Produce v{sorted(versions)}"
