"""Byte-rate quotas through the proxy against a real broker (which has no quotas of its own)."""

from __future__ import annotations

import bisect
import contextlib
import logging
import re
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.perf_tools import greedy_producer_command
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until
from dev.workloads import ThrottleWatch
from tests.integration.clients import close_kafka_python_producer, delivery_errors_into, stop_greedy_producer

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


class OffsetSampler:
    """Samples, from the broker directly (not through the proxy), how many records a topic holds."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap_servers)
        parts = self.consumer.partitions_for_topic(topic) or set()
        self.partitions = [TopicPartition(topic, p) for p in sorted(parts)]
        self.samples: list[tuple[float, int]] = []
        self.by_partition: dict[int, list[tuple[float, int]]] = {tp.partition: [] for tp in self.partitions}

    def sample_until(self, start: float, until: float, every: float = 0.25) -> None:
        while time.monotonic() - start < until:
            ends = self.consumer.end_offsets(self.partitions)
            now = time.monotonic() - start
            self.samples.append((now, sum(ends.values())))
            for tp, n in ends.items():
                self.by_partition[tp.partition].append((now, n))
            time.sleep(every)

    def close(self) -> None:
        self.consumer.close()


def steady_rate(
    samples: Sequence[tuple[float, float]], t_from: float, t_to: float, cycle: float = 11.0
) -> float:
    """Median rate over every ``cycle``-long window (quota.window.num x size) in [t_from, t_to].

    Kafka's windowed quota lets a greedy client through in bursts, one per cycle, as old samples
    expire; each window of exactly one cycle holds one burst wherever it falls, so the median of
    those windows is the rate the quota holds the client to, whatever the phase of the bursts.
    """
    times = [t for t, _ in samples]

    def amount_at(x: float) -> float:
        i = bisect.bisect_right(times, x) - 1
        assert i >= 0, f"no sample before {x}"
        return samples[i][1]

    starts = [t_from + 0.25 * i for i in range(int((t_to - cycle - t_from) / 0.25) + 1)]
    assert len(starts) >= 8, f"[{t_from}, {t_to}] is too short for {cycle} s windows"
    return statistics.median((amount_at(x + cycle) - amount_at(x)) / cycle for x in starts)


# Half-second windows (Kafka's count of 11, half its size): the burst cycle is 5.5 s, so a test sees
# several cycles in seconds. The window's length changes how often a greedy client bursts, not the
# rate it is held to; the rate formula is the same code at any window (tests/unit/test_quota_rate.py).
WINDOW = {"num": 11, "size_seconds": 0.5}
CYCLE = 11 * 0.5
STEADY = (8.0, 20.0)  # after the JVM's start and the initial burst the padded window allows


def perf_producer_command(bootstrap: str, topic: str, client_id: str, *options: str) -> list[str]:
    """Kafka's perf producer sending 25 MiB as fast as it is let: at a 1 MiB/s quota it has sent
    about 23.6 MiB (a 5.5 MiB first burst, then the quota) when the steady span ends, and finishes
    a second or two later (a window holding its end would still leave the median alone)."""
    return greedy_producer_command(bootstrap, topic, client_id, 25 * MiB // 1024, *options)


def _quotas(**entities: object) -> dict[str, object]:
    return {"window": WINDOW, **entities}


@dataclass
class ProduceRun:
    """One producer's figures: (seconds, records in its topic) read from the broker, its proxy's
    count of Produce requests (all of them, and the throttled ones), and for Kafka's perf producer
    its exit code and output."""

    samples: list[tuple[float, int]]
    produce_requests: float
    throttled_produces: float
    returncode: int | None = None
    out: str = ""
    err: str = ""
    produce_versions: frozenset[int] = frozenset()  # the Produce versions the client sent, where known


def _java_produce(cluster: KafkaCluster, proxy: ProxyProcess, topic: str) -> ProduceRun:
    """Kafka's perf producer ``throttled-producer`` through ``proxy``, as fast as it is let."""
    cmd = perf_producer_command(proxy.bootstrap, topic, "throttled-producer", "--print-metrics")
    sampler = OffsetSampler(cluster, topic)
    start = time.monotonic()
    perf = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sampler.sample_until(start, STEADY[1])
        out, err = perf.communicate(timeout=120)
    finally:
        sampler.close()
        if perf.poll() is None:
            perf.kill()
    return ProduceRun(
        sampler.samples,
        proxy.metric("kthrottle_requests_total", {"api": "Produce"}),
        proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "applied"}),
        perf.returncode,
        out,
        err,
    )


class _SentVersions(logging.Filter):
    """The version of every request kafka-python sends, read off its protocol parser's debug log
    call (the request object, never formatted; the record then goes no further)."""

    LOGGER = "kafka.protocol.parser"

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:
            request = args[2]
            version = getattr(request, "API_VERSION", None)
            if isinstance(version, int):
                self.seen.setdefault(type(request).__name__, set()).add(version)
        return False

    def install(self) -> _SentVersions:
        logger = logging.getLogger(self.LOGGER)
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addFilter(self)
        return self

    def remove(self) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeFilter(self)
        logger.setLevel(self._level)


def _pre_kip219_produce(cluster: KafkaCluster, proxy: ProxyProcess, topic: str) -> ProduceRun:
    """kafka-python ``old-client`` speaking Produce v5 through ``proxy``, offering four times its
    quota."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    # api_version (1, 0): Produce v5, before KIP-219's v6, so the client ignores throttle_time_ms
    # and keeps sending; only the proxy's mute can hold it.
    sent = _SentVersions().install()
    producer = KafkaProducer(
        bootstrap_servers=proxy.bootstrap,
        client_id="old-client",
        acks=1,
        api_version=(1, 0),
        linger_ms=5,
        max_block_ms=1000,  # a send into the full buffer gives up soon once the test is over
    )
    sampler = OffsetSampler(cluster, topic)
    stop = threading.Event()

    def produce() -> None:
        # Four times its quota: only the proxy's mute can hold it to the quota. Not as fast as
        # Python goes: kafka-python 3 bounds no backlog, and aborting one of hundreds of
        # thousands of batches at close (a deque.remove each) kept its sender thread busy for 30 s
        # into the next tests, slowing them by up to 20 s.
        payload = b"o" * 1024
        offered, began, queued = 4 * PRE_KIP219_QUOTA, time.monotonic(), 0
        while not stop.is_set():
            if queued > offered * (time.monotonic() - began):
                time.sleep(0.005)
                continue
            with contextlib.suppress(KafkaTimeoutError):  # the buffer stayed full max_block_ms
                producer.send(topic, payload)
                queued += len(payload)

    worker = threading.Thread(target=produce, daemon=True)
    start = time.monotonic()
    worker.start()
    try:
        sampler.sample_until(start, STEADY[1])
    finally:
        stop.set()
        worker.join(30)
        # Its 32 MiB buffer cannot drain at the quota: forced closed after 1 s rather than 5 + 5.
        close_kafka_python_producer(producer, timeout=1)
        sent.remove()
        sampler.close()
    return ProduceRun(
        sampler.samples,
        proxy.metric("kthrottle_requests_total", {"api": "Produce"}),
        proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "applied"}),
        produce_versions=frozenset(sent.seen.get("ProduceRequest", ())),
    )


PRE_KIP219_QUOTA = 256 * 1024


@pytest.fixture(scope="module")
def produce_runs(
    kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ProduceRun]:
    """Kafka's perf producer (1 MiB/s quota) and the pre-KIP-219 kafka-python producer (256 KiB/s),
    each with a topic and a proxy of its own, measured over the same span side by side rather
    than one after the other; each test judges its own client's figures."""
    runs = {
        "java": ("q-produce", "throttled-producer", MiB),
        "old": ("q-old", "old-client", PRE_KIP219_QUOTA),
    }
    with contextlib.ExitStack() as proxies:
        started: dict[str, tuple[ProxyProcess, str]] = {}
        for name, (prefix, client_id, quota) in runs.items():
            topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
            kafka_broker.create_topic(topic)
            cfg = gateway_config(
                kafka_broker, quotas=_quotas(clients={client_id: {"producer_byte_rate": quota}})
            )
            proxy = proxies.enter_context(
                ProxyProcess(cfg, workdir=tmp_path_factory.mktemp(f"produce-{name}"))
            )
            started[name] = (proxy, topic)
        with ThreadPoolExecutor(2) as pool:
            java = pool.submit(_java_produce, kafka_broker, *started["java"])
            old = pool.submit(_pre_kip219_produce, kafka_broker, *started["old"])
            return {"java": java.result(), "old": old.result()}


@pytest.mark.timeout(240)
def test_java_producer_held_to_its_quota(produce_runs: dict[str, ProduceRun]) -> None:
    run = produce_runs["java"]
    assert run.returncode == 0, run.err[-2000:]
    record = 1024
    rate = steady_rate([(t, n * record) for t, n in run.samples], *STEADY, cycle=CYCLE)
    assert abs(rate - MiB) / MiB < 0.15, f"steady produce rate {rate / MiB:.3f} MiB/s"
    # The Java client saw the throttle in its responses.
    match = re.search(r"produce-throttle-time-max:\{client-id=throttled-producer\}\s*:\s*([\d.]+)", run.out)
    assert match and float(match.group(1)) > 0, run.out[-3000:]
    assert run.throttled_produces > 0


def _filled_topic(cluster: KafkaCluster, prefix: str, mib: int = 40) -> str:
    """A topic holding ``mib`` MiB of 1 KiB records, written straight to the broker."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic)
    cluster.fill_topic(topic, mib * 1024)
    return topic


def _confluent_fetch(bootstrap: str, topic: str) -> tuple[list[tuple[float, float]], list[int]]:
    """librdkafka's consumer ``slow-consumer`` reading ``topic`` for the steady span: (seconds,
    value bytes so far) after every consume, and the throttles its statistics reported."""
    import json

    from confluent_kafka import Consumer

    throttles: list[int] = []

    def on_stats(raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            throttles.append(int(broker.get("throttle", {}).get("max", 0)))

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "client.id": "slow-consumer",
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 262144,  # a fetch well under the quota's 5.5 s of bytes
            "statistics.interval.ms": 1000,
            "stats_cb": on_stats,
        }
    )
    consumer.subscribe([topic])
    got = 0
    marks: list[tuple[float, float]] = []
    start = time.monotonic()
    while time.monotonic() - start < STEADY[1]:
        for msg in consumer.consume(num_messages=1000, timeout=0.5):
            if msg.error() is None:
                got += len(msg.value() or b"")
        marks.append((time.monotonic() - start, float(got)))
    consumer.close()
    return marks, throttles


def _aiokafka_fetch(bootstrap: str, topic: str) -> list[tuple[float, float]]:
    """aiokafka's consumer ``slow-aiokafka`` reading ``topic`` for the steady span: (seconds, value
    bytes so far) after every getmany."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def consume() -> list[tuple[float, float]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            client_id="slow-aiokafka",
            group_id=f"g-{topic}",
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=262144,
        )
        await consumer.start()
        got = 0
        marks: list[tuple[float, float]] = []
        start = time.monotonic()
        try:
            while time.monotonic() - start < STEADY[1]:
                batch = await consumer.getmany(timeout_ms=250)
                got += sum(len(r.value or b"") for records in batch.values() for r in records)
                marks.append((time.monotonic() - start, float(got)))
        finally:
            await consumer.stop()
        return marks

    return asyncio.run(consume())


@dataclass
class FetchRun:
    """One consumer's figures: its progress, librdkafka's throttle statistics (empty for
    aiokafka), and its proxy's count of throttled Fetch requests."""

    marks: list[tuple[float, float]]
    throttles: list[int]
    throttled_fetches: float


@pytest.fixture(scope="module")
def fetch_runs(kafka_broker: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, FetchRun]:
    """The librdkafka and the aiokafka consumer of the fetch-quota tests, each with a topic, a
    proxy and a 1 MiB/s consumer quota of its own, measured over the same span side by side
    rather than one after the other; each test judges its own client's figures."""
    with ThreadPoolExecutor(2) as fill:  # written side by side too
        confluent_topic = fill.submit(_filled_topic, kafka_broker, "q-fetch")
        aiokafka_topic = fill.submit(_filled_topic, kafka_broker, "q-fetch-aio")
        topics = {"confluent": confluent_topic.result(), "aiokafka": aiokafka_topic.result()}
    client_ids = {"confluent": "slow-consumer", "aiokafka": "slow-aiokafka"}
    with contextlib.ExitStack() as proxies:
        proxy = {
            name: proxies.enter_context(
                ProxyProcess(
                    gateway_config(kafka_broker, quotas=_quotas(clients={cid: {"consumer_byte_rate": MiB}})),
                    workdir=tmp_path_factory.mktemp(f"fetch-{name}"),
                )
            )
            for name, cid in client_ids.items()
        }
        with ThreadPoolExecutor(2) as pool:
            confluent = pool.submit(_confluent_fetch, proxy["confluent"].bootstrap, topics["confluent"])
            aiokafka = pool.submit(_aiokafka_fetch, proxy["aiokafka"].bootstrap, topics["aiokafka"])
            (confluent_marks, throttles), aiokafka_marks = confluent.result(), aiokafka.result()
        applied = {"api": "Fetch", "mode": "applied"}
        return {
            "confluent": FetchRun(
                confluent_marks,
                throttles,
                proxy["confluent"].metric("kthrottle_throttled_requests_total", applied),
            ),
            "aiokafka": FetchRun(
                aiokafka_marks, [], proxy["aiokafka"].metric("kthrottle_throttled_requests_total", applied)
            ),
        }


@pytest.mark.timeout(240)
def test_confluent_consumer_held_to_its_quota(fetch_runs: dict[str, FetchRun]) -> None:
    run = fetch_runs["confluent"]
    rate = steady_rate(run.marks, *STEADY, cycle=CYCLE)
    assert abs(rate - MiB) / MiB < 0.15, f"steady fetch rate {rate / MiB:.3f} MiB/s"
    assert max(run.throttles, default=0) > 0, "librdkafka never saw a throttle"
    assert run.throttled_fetches > 0


@pytest.mark.timeout(240)
def test_aiokafka_consumer_held_to_its_quota(fetch_runs: dict[str, FetchRun]) -> None:
    # Steady fetch shaping sizes each fetch to the quota, so half-second windows cost aiokafka
    # nothing (refused whole, as a broker does, those empty answers cost it ~18% of its quota).
    quota = MiB
    run = fetch_runs["aiokafka"]
    rate = steady_rate(run.marks, *STEADY, cycle=CYCLE)
    assert abs(rate - quota) / quota < 0.15, f"steady aiokafka fetch rate {rate / 1024:.0f} KiB/s"
    assert run.throttled_fetches > 0


@pytest.mark.timeout(120)
def test_dry_run_reports_but_does_not_throttle(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    from kafka import KafkaProducer

    quotas = {"dry_run": True, "clients": {"<default>": {"producer_byte_rate": 10_000}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="dry", acks=1)
        payload = b"x" * 100_000
        started = time.monotonic()
        for _ in range(30):  # 3 MB against 10 kB/s: hundreds of seconds of throttle if applied
            producer.send(f"dry-{uuid.uuid4().hex[:4]}", payload).get(timeout=30)
        producer.close()
        assert time.monotonic() - started < 30
        assert proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "dry-run"}) > 0
        assert proxy.metric("kthrottle_throttled_requests_total", {"api": "Produce", "mode": "applied"}) == 0


@pytest.mark.timeout(240)
def test_topic_partition_quota_and_hot_reload(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    import yaml
    from confluent_kafka import Producer

    topic = f"q-topic-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic, 6)
    slow, fast = 64 * 1024, 512 * 1024
    quotas = _quotas(topics={topic: {"producer.byte.rate": slow}})
    cfg = gateway_config(kafka_broker, quotas=quotas)
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        stop = threading.Event()
        errors: list[str] = []

        def produce(partition: int) -> None:
            # One producer (one connection) per partition: each is held by its partition's bucket.
            producer = Producer(
                {
                    "bootstrap.servers": proxy.bootstrap,
                    "linger.ms": 5,
                    "acks": 1,
                    "batch.size": 16384,
                    "client.id": f"p{partition}",
                }
            )
            payload = b"p" * 1024
            while not stop.is_set():
                try:
                    producer.produce(
                        topic,
                        payload,
                        partition=partition,
                        on_delivery=delivery_errors_into(errors),
                    )
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
            stop_greedy_producer(producer)

        sampler = OffsetSampler(kafka_broker, topic)
        start = time.monotonic()
        workers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in (0, 1)]
        for worker in workers:
            worker.start()
        try:
            sampler.sample_until(start, 15.0)
            connections_before = proxy.metric("kthrottle_connections_total")
            cfg["quotas"]["topics"][topic]["producer.byte.rate"] = fast
            proxy.config_path.write_text(yaml.safe_dump(cfg))
            reloaded = time.monotonic() - start
            settle = reloaded + 1.0 + 2 * 0.5 + 0.5  # the one-second reload poll, two windows, slack
            sampler.sample_until(start, settle + 0.5)  # what came in by the first sample after settle
        finally:
            stop.set()
            for worker in workers:
                worker.join(60)
            sampler.close()
        assert not errors, errors[:3]
        for p in (0, 1):  # each partition has its own bucket at the topic's per-partition rate
            series = [(t, n * 1024) for t, n in sampler.by_partition[p]]
            rate = steady_rate(series, 6.5, 14.5, cycle=CYCLE)
            assert abs(rate - slow) / slow < 0.15, (
                f"partition {p}: {rate / 1024:.1f} KiB/s under {slow // 1024}"
            )
        # Once the raised quota is in force the window admits a burst the old quota never would.
        series = [
            (t, n * 1024 + m * 1024)
            for (t, n), (_, m) in zip(sampler.by_partition[0], sampler.by_partition[1], strict=True)
        ]
        before = max(v for t, v in series if t <= reloaded)
        after = min(v for t, v in series if t >= settle)
        assert after - before > 4 * 2 * slow * (settle - reloaded), (
            f"{(after - before) / 1024:.0f} KiB admitted"
        )
        assert all(n == 0 for _t, n in sampler.by_partition[2])
        assert proxy.metric("kthrottle_config_reloads_total", {"result": "applied"}) == 1
        assert proxy.metric("kthrottle_connections_total") == connections_before  # nobody reconnected


@pytest.mark.timeout(60)
def test_bad_reload_keeps_last_good_config(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    import json

    quotas = {"clients": {"c1": {"producer_byte_rate": 1000}}}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        good = proxy.admin_get("/quotas")[1]
        text = proxy.config_path.read_text()
        proxy.config_path.write_text(text.replace("producer_byte_rate: 1000", "producer_byte_rate: -5"))
        deadline = time.monotonic() + 10
        while proxy.metric("kthrottle_config_reloads_total", {"result": "rejected"}) < 1:
            assert time.monotonic() < deadline, proxy.log_tail()
            time.sleep(0.2)
        assert proxy.admin_get("/quotas")[1] == good
        assert json.loads(good)["clients"]["c1"]["producer_byte_rate"] == 1000
        assert (
            "config reload refused" in proxy.log_text()
            and "quotas.clients.c1.producer_byte_rate" in proxy.log_text()
        )
        state = json.loads(proxy.admin_get("/quotas/entity?client_id=c1")[1])
        assert state["producer_byte_rate"]["quota"] == 1000 and state["producer_byte_rate"]["level"] == 7


def _free_run(bootstrap: str, topic: str, seconds: float, offered: float) -> tuple[float, ThrottleWatch]:
    """Bytes per second a free librdkafka producer offering ``offered`` bytes/s of 1 KiB records
    gets delivered over ``seconds``, and the throttle librdkafka saw in the brokers' answers
    meanwhile. Paced: a producer as fast as it can go wrote gigabytes into the page cache here,
    and the writeback slowed the tests after it by up to 10 s each."""
    from confluent_kafka import Producer

    watch = ThrottleWatch()
    settings = {"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": 1, "client.id": "free"}
    producer = Producer({**settings, **watch.config(250)})
    payload = b"f" * 1024
    delivered = [0]

    def on_delivery(err: object, _msg: object) -> None:
        if err is None:
            delivered[0] += 1

    producer.produce(topic, payload, on_delivery=on_delivery)
    assert producer.flush(30) == 0  # connected and warm before the clock starts
    delivered[0] = 0
    started, queued = time.monotonic(), 0
    while (elapsed := time.monotonic() - started) < seconds:
        if queued > offered * elapsed:
            producer.poll(0.005)
            continue
        try:
            producer.produce(topic, payload, on_delivery=on_delivery)
            queued += len(payload)
        except BufferError:
            producer.poll(0.005)
        producer.poll(0)
    rate = delivered[0] * 1024 / (time.monotonic() - started)
    assert producer.flush(60) == 0
    producer.poll(0.3)  # one more statistics report, covering the last answers
    return rate, watch


@pytest.mark.timeout(300)
def test_client_without_quota_is_unaffected(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """A client with no quota, beside one its quota holds, is never throttled, held or refused.

    Judged by what the free client saw (no throttle time in any answer) and by what it moved (16
    times the other's quota offered, more than 8 times delivered), not by comparing its speed
    alone and beside: as fast as it can go it writes what the broker's disk takes, so that
    comparison measured the page cache's writeback (17 MiB/s on one machine, 400 on another,
    drifting by a third within a run), not the proxy.
    """
    topic = f"q-free-{uuid.uuid4().hex[:6]}"
    slow_topic = f"q-slow-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)
    kafka_broker.create_topic(slow_topic)
    quota = 256 * 1024
    quotas = _quotas(clients={"throttled": {"producer_byte_rate": quota}})
    applied = {"api": "Produce", "mode": "applied"}
    with ProxyProcess(gateway_config(kafka_broker, quotas=quotas), workdir=tmp_path) as proxy:
        cmd = greedy_producer_command(proxy.bootstrap, slow_topic, "throttled", 10_000_000)
        throttled = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Past its JVM warm-up and first burst: once throttled, its quota holds it from here on.
            wait_until(
                lambda: proxy.metric("kthrottle_throttled_requests_total", applied) > 0,
                60,
                lambda: f"the quota never throttled the Java producer\n{proxy.log_tail()}",
            )
            throttled_before = proxy.metric("kthrottle_throttled_requests_total", applied)
            rate, watch = _free_run(proxy.bootstrap, topic, 3.0, offered=16 * quota)
            throttled_during = proxy.metric("kthrottle_throttled_requests_total", applied) - throttled_before
            assert throttled.poll() is None
        finally:
            throttled.kill()
            throttled.wait(30)
    # The quota was at work on its client all along the free client's run ...
    assert throttled_during >= 3, f"only {throttled_during} throttled requests beside the free client"
    # ... and never reached the free client: no answer carried a throttle time (a proxy that
    # delayed or muted it would have said so, as Kafka does), in reports covering the whole run.
    assert len(watch.seen) >= 10 and watch.max == 0, f"free client saw throttles {watch.seen}"
    # Nor was it held to the other's quota, or near it.
    assert rate >= 8 * quota, f"free client at {rate / MiB:.2f} MiB/s beside a {quota // 1024} KiB/s quota"


@pytest.mark.timeout(240)
def test_pre_kip219_client_is_held_by_muting(produce_runs: dict[str, ProduceRun]) -> None:
    run, quota = produce_runs["old"], PRE_KIP219_QUOTA
    rate = steady_rate([(t, n * 1024) for t, n in run.samples], *STEADY, cycle=CYCLE)
    assert abs(rate - quota) / quota < 0.15, f"old client at {rate / 1024:.0f} KiB/s, quota {quota // 1024}"
    # The client really spoke a Produce version that carries no client-side throttle (KIP-219 is v6).
    assert run.produce_versions == {5}, f"kafka-python sent Produce versions {sorted(run.produce_versions)}"
    produce_v5 = run.produce_requests
    assert produce_v5 > 0
