"""Kafka's own Java clients address topics by id (Fetch v13+, Produce v13+): the KIP-1010 topic
quotas hold for them, and the capture names their topics, never their ids."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
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


@dataclass
class TopicRun:
    """One Java client's figures through its proxy: its progress as (seconds, bytes), the proxy's
    counters, and what the capture said of its requests (topics named, API versions)."""

    topic: str
    marks: list[tuple[float, float]]
    stdout: str
    unresolved_ids: float
    throttled_produces: float
    captured_topics: set[str]
    captured_versions: set[int]


def _java_fetch(proxy: ProxyProcess, topic: str) -> tuple[list[tuple[float, float]], str, float, float]:
    marks, stdout = java_rate_consumer(
        proxy.bootstrap,
        topic,
        "java-topic-consumer",
        int(STEADY[1]) + 1,
        "max.partition.fetch.bytes=262144",
    )
    return marks, stdout, proxy.metric("kthrottle_topic_ids_total", {"outcome": "unresolved"}), 0.0


def _java_produce(
    cluster: KafkaCluster, proxy: ProxyProcess, topic: str
) -> tuple[list[tuple[float, float]], str, float, float]:
    record = 1024
    cmd = perf_producer_command(proxy.bootstrap, topic, "java-topic-producer")
    sampler = OffsetSampler(cluster, topic)
    start = time.monotonic()
    perf = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sampler.sample_until(start, STEADY[1])
    finally:
        sampler.close()
        perf.kill()
        perf.communicate(timeout=30)
    marks = [(t, float(n * record)) for t, n in sampler.samples]
    throttled = proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "applied"})
    return marks, "", proxy.metric("kthrottle_topic_ids_total", {"outcome": "unresolved"}), throttled


@pytest.fixture(scope="module")
def topic_runs(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TopicRun]:
    """Kafka's Java consumer on a 1 MiB/s topic fetch quota and its perf producer on a 1 MiB/s
    topic produce quota, each with a topic, a capturing proxy and a quota of its own, measured
    over the same span side by side rather than one after the other; each test judges its own
    client's figures."""
    fetch_topic = f"ids-fetch-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(fetch_topic)
    kafka_broker.fill_topic(fetch_topic, 30 * 1024)
    produce_topic = f"ids-produce-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(produce_topic)
    kinds = {"fetch": (fetch_topic, "consumer.byte.rate"), "produce": (produce_topic, "producer.byte.rate")}
    workdirs = {kind: tmp_path_factory.mktemp(f"ids-{kind}") for kind in kinds}
    with contextlib.ExitStack() as proxies:
        proxy = {}
        for kind, (topic, key) in kinds.items():
            quotas = {"window": WINDOW, "topics": {topic: {key: MiB}}}  # per partition; one each
            cfg = gateway_config(kafka_broker, quotas=quotas, capture=_capture(workdirs[kind]))
            proxy[kind] = proxies.enter_context(ProxyProcess(cfg, workdir=workdirs[kind]))
        with ThreadPoolExecutor(2) as pool:
            fetching = pool.submit(_java_fetch, proxy["fetch"], fetch_topic)
            producing = pool.submit(_java_produce, kafka_broker, proxy["produce"], produce_topic)
            figures = {"fetch": fetching.result(), "produce": producing.result()}
    runs = {}  # the proxies closed their last capture files on shutdown
    for kind, api_key in (("fetch", ApiKey.FETCH), ("produce", ApiKey.PRODUCE)):
        topics, versions = _captured_topics(workdirs[kind], api_key)
        runs[kind] = TopicRun(kinds[kind][0], *figures[kind], topics, versions)
    return runs


@pytest.mark.timeout(240)
def test_java_consumer_held_to_a_topic_fetch_quota(topic_runs: dict[str, TopicRun]) -> None:
    run, quota = topic_runs["fetch"], MiB  # per partition; the topic has one
    rate = steady_rate(run.marks, *STEADY, cycle=CYCLE)
    assert abs(rate - quota) / quota < 0.15, f"Java consumer at {rate / KiB:.0f} KiB/s, quota 1 MiB/s"
    throttle = re.search(r"^THROTTLE_MAX ([\d.]+)$", run.stdout, re.M)
    assert throttle and float(throttle[1]) > 0, "the Java consumer never saw a throttle"
    # Named from the Metadata the client asked through the proxy: no lookup was needed.
    assert run.unresolved_ids == 0
    assert min(run.captured_versions) >= BY_ID_FROM, (
        f"the Java consumer fetched with v{sorted(run.captured_versions)}"
    )
    assert run.captured_topics == {run.topic}, f"capture shows {run.captured_topics}"


@pytest.mark.timeout(240)
def test_java_producer_held_to_a_topic_produce_quota(topic_runs: dict[str, TopicRun]) -> None:
    run, quota = topic_runs["produce"], MiB
    rate = steady_rate(run.marks, *STEADY, cycle=CYCLE)
    assert abs(rate - quota) / quota < 0.15, f"Java producer at {rate / KiB:.0f} KiB/s, quota 1 MiB/s"
    assert run.throttled_produces > 0
    assert run.captured_topics == {run.topic}, (
        f"capture shows {run.captured_topics} for Produce v{sorted(run.captured_versions)}"
    )
