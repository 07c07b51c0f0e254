"""Soak: mixed produce, fetch and admin traffic from three client libraries through kthrottle,
quotas on, against a real Kafka broker, for a long time (30 minutes by default).

Workloads, each in a process of its own (so one library's GIL does not time another's):
  - librdkafka (confluent-kafka) idempotent acks=all producer `soak-heavy` offering 384 KiB/s
    against a 256 KiB/s producer quota (throttled all along), to topic soak-a
  - aiokafka and kafka-python idempotent acks=all producers, 100 msg/s of 1 KiB each, to soak-b
  - consumer groups counting every message: aiokafka on soak-a, librdkafka and kafka-python on soak-b
  - librdkafka reader `soak-replayer` re-reading soak-a from the start, over its 512 KiB/s
    consumer quota (fetches throttled all along)
  - librdkafka admin `soak-admin`: list, create a 4-partition topic, add partitions, delete, twice
    a second, against a controller_mutation_rate of 2 (THROTTLING_QUOTA_EXCEEDED once the burst
    is spent)
  - a latency probe: one-record Produce requests, alternately straight to the broker and
    through the proxy, 20 a second each; p99 of each per minute, the difference is what the proxy adds

Faults (on by default; --no-faults for none): the broker is stopped and started again at a
third of the run, and a second kafka-python member joins group soak-gb-kp at half of it and
leaves at two thirds (two rebalances).

Every message key is unique; after the run the producers flush, the consumers catch up, and
every acknowledged key must have been consumed by every group reading its topic. A key read at
two places (partition, offset) was written twice (a duplicate); the same place read again is a
redelivery, which a group gives after a restart or a rebalance (at-least-once), counted apart.
Each consumer's client log (INFO), the proxy's and the broker's are kept (--logs DIR, else a new
directory, printed first), so a group that went quiet can be read afterwards.
The proxy's RSS and open file descriptors are read every 10 s; "start" is after the first
minute (the warm-up: imports, first connections, buffers reaching their working size).

Prints one JSON line last:
  requests_served                 sum of kthrottle_requests_total, and by api
  errors_by_kind                  every client error, by library and Kafka error name; the
                                  throttling answers the admin quota gives are expected and
                                  listed apart (throttled_by_kind); unexpected_errors sums the rest
  messages_produced / messages_consumed / produced_equals_consumed / duplicates / missing
  missing_by_group                acknowledged messages a group never read, by group
  redelivered                     by group: places read again (after the restart, the rebalances)
  longest_silence_s               by group: the longest it went without a new message
  silence_evidence                every 10 s sample of a group silent for 30 s or more: the
                                  proxy's rows for its connections (requests and bytes each way,
                                  in flight, paused), so a quiet group shows whether it was
                                  asking and whether it was answered
  group_connections_at_end        the same rows for every group as the traffic ends
  longest_pending_request_s       by api: the longest a request waited in the proxy for its
                                  answer, seen at the 10 s samples (throttles included)
  faults                          what was done when; upstream_errors_from_the_restart: the
                                  proxy's upstream errors while the broker was down
  rss_start_mib / rss_end_mib / rss_growth_pct    target: growth under 10%
  fds_start / fds_end
  p99_added_latency_ms_per_minute

Usage: source dev/setup.sh && python bench/soak.py [--minutes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import queue
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.proc import open_fds, rss_bytes

KiB, MiB = 1024, 1024 * 1024
HEAVY_QUOTA = 256 * KiB
REPLAY_QUOTA = 512 * KiB
MUTATION_RATE = 2
VALUE_SIZE = 1024
TOPICS = {"soak-a": 3, "soak-b": 3, "soak-probe": 1}
SILENCE_EVIDENCE_S = 30.0  # a group this long without a new message has its connections recorded

Result = dict[str, Any]


def _payload(key: str) -> bytes:
    return key.encode().ljust(VALUE_SIZE, b".")


def _report(out: Any, name: str, **fields: Any) -> None:
    out.put({"worker": name, **fields})


# --- producers -------------------------------------------------------------------------------


def librdkafka_producer(
    bootstrap: str, stop: Event, out: Any, topic: str, client_id: str, bps: float
) -> None:
    """Offers ``bps`` and never drops: a full local queue is back-pressure (poll and retry),
    so a throttled producer waits instead of timing records out."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 16384,
            "queue.buffering.max.messages": 1000,
            "message.timeout.ms": 300_000,
        }
    )
    acked: list[str] = []
    errors: collections.Counter[str] = collections.Counter()

    def done(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.key().decode())
        else:
            errors[f"librdkafka-producer:{err.name()}"] += 1

    began, queued, n = time.monotonic(), 0, 0
    while not stop.is_set():
        if queued > bps * (time.monotonic() - began):
            producer.poll(0.005)
            continue
        key = f"{client_id}-{n}"
        try:
            producer.produce(topic, _payload(key), key=key.encode(), on_delivery=done)
        except BufferError:
            producer.poll(0.05)
            continue
        queued += VALUE_SIZE
        n += 1
        producer.poll(0)
    left = producer.flush(120)
    if left:
        errors["librdkafka-producer:not-delivered-at-flush"] += left
    _report(out, client_id, topic=topic, acked=acked, errors=dict(errors), sent=n)


def aiokafka_producer(bootstrap: str, stop: Event, out: Any, topic: str, client_id: str, rate: float) -> None:
    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=60_000,
        )
        await producer.start()
        acked: list[str] = []
        errors: collections.Counter[str] = collections.Counter()
        pending: set[asyncio.Future[Any]] = set()

        def done(key: str, fut: asyncio.Future[Any]) -> None:
            pending.discard(fut)
            if fut.exception() is None:
                acked.append(key)
            else:
                errors[f"aiokafka-producer:{type(fut.exception()).__name__}"] += 1

        began, n = time.monotonic(), 0
        try:
            while not stop.is_set():
                if n > rate * (time.monotonic() - began):
                    await asyncio.sleep(0.005)
                    continue
                key = f"{client_id}-{n}"
                try:
                    fut = await producer.send(topic, _payload(key), key=key.encode())
                except Exception as exc:  # counted by kind, the soak goes on
                    errors[f"aiokafka-producer:{type(exc).__name__}"] += 1
                    await asyncio.sleep(0.1)
                    continue
                pending.add(fut)
                fut.add_done_callback(lambda f, key=key: done(key, f))
                n += 1
            await producer.flush()
            if pending:
                await asyncio.wait(pending, timeout=120)
        finally:
            await producer.stop()
        _report(out, client_id, topic=topic, acked=acked, errors=dict(errors), sent=n)

    asyncio.run(run())


def kafka_python_producer(
    bootstrap: str, stop: Event, out: Any, topic: str, client_id: str, rate: float
) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=60_000,
    )
    acked: list[str] = []
    errors: collections.Counter[str] = collections.Counter()
    began, n = time.monotonic(), 0
    while not stop.is_set():
        if n > rate * (time.monotonic() - began):
            time.sleep(0.005)
            continue
        key = f"{client_id}-{n}"
        fut = producer.send(topic, _payload(key), key=key.encode())
        fut.add_callback(lambda _md, key=key: acked.append(key))
        fut.add_errback(lambda exc: errors.update([f"kafka-python-producer:{type(exc).__name__}"]))
        n += 1
    producer.flush(120)
    producer.close(30)
    _report(out, client_id, topic=topic, acked=acked, errors=dict(errors), sent=n)


# --- consumers -------------------------------------------------------------------------------


class _Seen:
    """Keys a group consumed, each with where it was read (partition, offset): a key at two
    places was written twice (a duplicate); the same place read again is a redelivery, which a
    group gives after a restart or a rebalance (at-least-once) and is counted apart. ``progress``
    is a shared count the main process watches to know when the group has caught up."""

    def __init__(self, progress: Synchronized[int]) -> None:
        self.places: dict[str, set[tuple[int, int]]] = {}
        self.redelivered = 0
        self.progress = progress

    def add(self, key: bytes | None, partition: int, offset: int) -> None:
        text = (key or b"").decode()
        places = self.places.setdefault(text, set())
        if (partition, offset) in places:
            self.redelivered += 1
        places.add((partition, offset))
        self.progress.value = len(self.places)

    def report(self) -> dict[str, Any]:
        """Each key with one place it was read at, and this member's duplicates and redeliveries."""
        return {
            "places": {key: min(places) for key, places in self.places.items()},
            "duplicates": sum(len(p) - 1 for p in self.places.values()),
            "redelivered": self.redelivered,
        }


def _log_to(log_dir: str | None, worker: str) -> None:
    """This worker's client library logs at INFO into ``log_dir/worker.log`` (kept when the soak
    fails: a group's joins, assignments and errors are there), and kafka-python's group
    coordinator at DEBUG: a kafka-python member once joined, had its SyncGroup answered and then
    neither fetched nor heartbeated, with nothing at INFO to say which state it was stuck in."""
    if log_dir:
        import logging

        logging.basicConfig(
            filename=str(Path(log_dir) / f"{worker}.log"),
            level=logging.INFO,
            format="%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("kafka.coordinator").setLevel(logging.DEBUG)
        for handler in logging.getLogger().handlers:  # not its ~90 a second "need_rejoin: False"
            handler.addFilter(lambda record: not record.getMessage().startswith("need_rejoin: False"))


def librdkafka_consumer(
    bootstrap: str,
    stop: Event,
    out: Any,
    topic: str,
    group: str,
    progress: Synchronized[int],
    log_dir: str | None = None,
) -> None:
    from confluent_kafka import Consumer

    _log_to(log_dir, group)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
        }
    )
    consumer.subscribe([topic])
    seen, errors = _Seen(progress), collections.Counter[str]()
    while not stop.is_set():
        for msg in consumer.consume(500, 0.5):
            err = msg.error()
            if err is not None:
                errors[f"librdkafka-consumer:{err.name()}"] += 1
            else:
                seen.add(msg.key(), msg.partition() or 0, msg.offset() or 0)
    consumer.close()
    _report(out, group, topic=topic, **seen.report(), errors=dict(errors))


def aiokafka_consumer(
    bootstrap: str,
    stop: Event,
    out: Any,
    topic: str,
    group: str,
    progress: Synchronized[int],
    log_dir: str | None = None,
) -> None:
    _log_to(log_dir, group)

    async def run() -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, client_id=group, auto_offset_reset="earliest"
        )
        await consumer.start()
        seen, errors = _Seen(progress), collections.Counter[str]()
        try:
            while not stop.is_set():
                try:
                    batch = await consumer.getmany(timeout_ms=500, max_records=1000)
                except Exception as exc:  # counted by kind, the soak goes on
                    errors[f"aiokafka-consumer:{type(exc).__name__}"] += 1
                    await asyncio.sleep(0.5)
                    continue
                for records in batch.values():
                    for record in records:
                        seen.add(record.key, record.partition, record.offset)
        finally:
            await consumer.stop()
        _report(out, group, topic=topic, **seen.report(), errors=dict(errors))

    asyncio.run(run())


def kafka_python_consumer(
    bootstrap: str,
    stop: Event,
    out: Any,
    topic: str,
    group: str,
    progress: Synchronized[int],
    log_dir: str | None = None,
    member: str = "",
) -> None:
    """A kafka-python member of ``group``; ``member`` names a second one (the rebalance), which
    reports, and is seen by the proxy, as ``group+member``."""
    from dev.kafka_python_group import group_consumer

    name = f"{group}+{member}" if member else group
    _log_to(log_dir, name)
    consumer = group_consumer(
        topic, bootstrap_servers=bootstrap, group_id=group, client_id=name, auto_offset_reset="earliest"
    )
    seen, errors = _Seen(progress), collections.Counter[str]()
    while not stop.is_set():
        try:
            batch = consumer.poll(timeout_ms=500, max_records=1000)
        except Exception as exc:  # counted by kind, the soak goes on
            errors[f"kafka-python-consumer:{type(exc).__name__}"] += 1
            time.sleep(0.5)
            continue
        for records in batch.values():
            for record in records:
                seen.add(record.key, record.partition, record.offset)
    consumer.close()
    _report(out, name, topic=topic, **seen.report(), errors=dict(errors))


def librdkafka_replayer(bootstrap: str, stop: Event, out: Any, topic: str, client_id: str) -> None:
    """Re-reads ``topic`` from the start whenever it reaches the end: a consumer always over its
    fetch quota, so fetch throttling runs for the whole soak."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": client_id,
            "client.id": client_id,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(TOPICS[topic])]
    consumer.assign(partitions)
    errors: collections.Counter[str] = collections.Counter()
    fetched, rounds, at_end = 0, 0, set()
    while not stop.is_set():
        for msg in consumer.consume(500, 0.5):
            err = msg.error()
            if err is not None:
                if err.name() == "_PARTITION_EOF":
                    at_end.add(msg.partition())
                else:
                    errors[f"librdkafka-replayer:{err.name()}"] += 1
            else:
                fetched += len(msg.value() or b"")
        if len(at_end) == len(partitions):
            consumer.assign(partitions)
            at_end.clear()
            rounds += 1
    consumer.close()
    _report(out, client_id, fetched_bytes=fetched, rounds=rounds, errors=dict(errors))


# --- admin -----------------------------------------------------------------------------------


def librdkafka_admin(bootstrap: str, stop: Event, out: Any, client_id: str) -> None:
    """Lists topics, creates one with 4 partitions, adds 2, deletes it: 10 mutations a cycle,
    two cycles a second, against a quota of 2 a second."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
    outcomes: collections.Counter[str] = collections.Counter()

    def settle(kind: str, futures: dict[str, Any]) -> bool:
        ok = True
        for fut in futures.values():
            try:
                fut.result(60)
                outcomes[f"{kind}:ok"] += 1
            except KafkaException as exc:
                outcomes[f"{kind}:{exc.args[0].name()}"] += 1
                ok = False
        return ok

    n = 0
    while not stop.is_set():
        began = time.monotonic()
        try:
            admin.list_topics(timeout=30)
            outcomes["list:ok"] += 1
        except KafkaException as exc:
            outcomes[f"list:{exc.args[0].name()}"] += 1
        name = f"soak-admin-{n}"
        n += 1
        if settle("create", admin.create_topics([NewTopic(name, 4, 1)], operation_timeout=30)):
            settle("partitions", admin.create_partitions([NewPartitions(name, 6)], operation_timeout=30))
            give_up = time.monotonic() + 120  # a topic left behind would grow the cluster all soak long
            while not settle("delete", admin.delete_topics([name], operation_timeout=30)):
                if time.monotonic() > give_up:
                    outcomes["delete:gave-up"] += 1
                    break
                time.sleep(0.5)
        stop.wait(max(0.0, 0.5 - (time.monotonic() - began)))
    _report(out, client_id, outcomes=dict(outcomes))


# --- latency probe ---------------------------------------------------------------------------


def latency_probe(bootstrap: str, stop: Event, out: Any, direct: str, per_second: float) -> None:
    """Alternates one Produce round trip straight to the broker and one through the proxy, so
    both see the same moment's load; the difference of their p99s is what the proxy adds."""
    from dev.loadgen import produce_request

    async def reconnect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection, tried every half second (the broker may be restarting)."""
        host, port = address.rsplit(":", 1)
        while True:
            try:
                return await asyncio.open_connection(host, int(port))
            except OSError:
                if stop.is_set():
                    raise
                await asyncio.sleep(0.5)

    async def run() -> None:
        conns = {}
        for name, address in (("direct", direct), ("proxy", bootstrap)):
            conns[name] = await reconnect(address)
        samples: dict[str, list[tuple[float, float]]] = {"direct": [], "proxy": []}
        errors: collections.Counter[str] = collections.Counter()
        payload, cid, began = b"p" * 100, 0, time.monotonic()
        while not stop.is_set():
            for name, (reader, writer) in conns.items():
                cid += 1
                frame = produce_request("soak-probe", cid, payload, "soak-probe")
                sent = time.perf_counter()
                writer.write(frame)
                try:
                    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 30), "big")
                    body = await reader.readexactly(size)
                except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                    errors[f"probe-{name}:{type(exc).__name__}"] += 1
                    writer.close()
                    conns[name] = await reconnect(direct if name == "direct" else bootstrap)
                    break
                if int.from_bytes(body[:4], "big") != cid:
                    errors[f"probe-{name}:correlation"] += 1
                samples[name].append((time.monotonic() - began, time.perf_counter() - sent))
            await asyncio.sleep(1 / per_second)
        for _reader, writer in conns.values():
            writer.close()
        _report(out, "probe", samples=samples, errors=dict(errors))

    asyncio.run(run())


# --- the proxy process -----------------------------------------------------------------------


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def added_latency_per_minute(samples: dict[str, list[tuple[float, float]]], minutes: float) -> list[float]:
    """p99 through the proxy minus p99 direct, for each whole minute of the load (the drain
    after it, when producers have stopped, is left out)."""
    per_minute: dict[int, dict[str, list[float]]] = collections.defaultdict(
        lambda: {"direct": [], "proxy": []}
    )
    for name, points in samples.items():
        for at, seconds in points:
            if at < int(minutes) * 60:
                per_minute[int(at // 60)][name].append(seconds)
    return [
        round((p99(m["proxy"]) - p99(m["direct"])) * 1000, 3)
        for _minute, m in sorted(per_minute.items())
        if m["proxy"] and m["direct"]
    ]


def scrape(proxy: Any, name: str, label: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    _status, text = proxy.admin_get("/metrics")
    found: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.value:
                found[sample.labels.get(label, "")] += sample.value
    return dict(found)


def group_connections(proxy: Any, group: str) -> list[dict[str, Any]]:
    """The proxy's rows for the connections whose client id is ``group`` (the soak's consumers
    use their group as client id): requests and bytes each way so far, in flight, paused."""
    try:  # asked when the proxy may be the one stuck: a failed ask is evidence too
        status, body = proxy.admin_get(f"/connections?client_id={group}&sort=age&limit=20")
    except OSError as exc:
        return [{"error": repr(exc)}]
    if status != 200:
        return [{"error": f"HTTP {status}: {body[:200]}"}]
    keep = ("id", "broker", "age_s", "requests", "bytes_in", "bytes_out", "in_flight", "paused")
    return [{k: row.get(k) for k in keep} for row in json.loads(body).get("connections", [])]


def soak_config(cluster: Any) -> dict[str, Any]:
    from dev.proxy_process import gateway_config

    return gateway_config(
        cluster,
        quotas={
            "clients": {
                "soak-heavy": {"producer_byte_rate": HEAVY_QUOTA},
                "soak-replayer": {"consumer_byte_rate": REPLAY_QUOTA},
                "soak-admin": {"controller_mutation_rate": MUTATION_RATE},
            }
        },
    )


def run(minutes: float, warmup: float, faults: bool = False, log_dir: str | None = None) -> Result:
    """The soak. ``faults``: the broker is restarted at a third of the run and a second
    kafka-python member joins group soak-gb-kp at half of it and leaves at two thirds (two
    rebalances). Client and proxy logs go to ``log_dir`` (kept by the caller)."""
    from dev.harness import KafkaCluster
    from dev.proxy_process import ProxyProcess

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    stop_producers, stop_rest, stop_member = ctx.Event(), ctx.Event(), ctx.Event()
    groups = ("soak-ga", "soak-gb-rd", "soak-gb-kp")
    progress = {group: ctx.Value("q", 0) for group in (*groups, "soak-gb-kp+2")}
    events: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="kthrottle-soak-") as tmp,
        KafkaCluster(brokers=1, workdir=Path(tmp) / "kafka") as cluster,
    ):
        for topic, partitions in TOPICS.items():
            cluster.create_topic(topic, partitions)
        proxy = ProxyProcess(soak_config(cluster), workdir=Path(tmp) / "proxy")
        try:
            proxy.start()
            assert proxy.proc is not None
            pid, boot = proxy.proc.pid, proxy.bootstrap
            producers: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
                (librdkafka_producer, ("soak-a", "soak-heavy", 1.5 * HEAVY_QUOTA)),
                (aiokafka_producer, ("soak-b", "soak-aio", 100)),
                (kafka_python_producer, ("soak-b", "soak-kp", 100)),
            ]
            others: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
                (aiokafka_consumer, ("soak-a", "soak-ga", progress["soak-ga"], log_dir)),
                (librdkafka_consumer, ("soak-b", "soak-gb-rd", progress["soak-gb-rd"], log_dir)),
                (kafka_python_consumer, ("soak-b", "soak-gb-kp", progress["soak-gb-kp"], log_dir)),
                (librdkafka_replayer, ("soak-a", "soak-replayer")),
                (librdkafka_admin, ("soak-admin",)),
                (latency_probe, (cluster.bootstrap_servers.split(",")[0], 20)),
            ]
            workers = [
                ctx.Process(target=fn, args=(boot, stop_producers, out, *args), daemon=True)
                for fn, args in producers
            ] + [
                ctx.Process(target=fn, args=(boot, stop_rest, out, *args), daemon=True) for fn, args in others
            ]
            member = ctx.Process(
                target=kafka_python_consumer,
                args=(boot, stop_member, out, "soak-b", "soak-gb-kp", progress["soak-gb-kp+2"], log_dir, "2"),
                daemon=True,
            )
            rss_launch, fds_launch = rss_bytes(pid), open_fds(pid)
            began = time.monotonic()
            for worker in workers:
                worker.start()
            trace: list[tuple[float, int, int]] = []
            start_sample: tuple[int, int] | None = None
            deadline = began + minutes * 60
            # Faults, at fractions of the run: (when, what).
            planned = [(1 / 3, "restart the broker"), (1 / 2, "a member joins"), (2 / 3, "the member leaves")]
            pending = [(began + f * minutes * 60, what) for f, what in planned] if faults else []
            last_moved = {group: (began, 0) for group in groups}
            silences = {group: 0.0 for group in groups}
            # What a group's connections through the proxy do while it is silent (asking or not,
            # answered or not): the first thing to read when a group goes quiet.
            silence_evidence: list[dict[str, Any]] = []
            # The longest any request waited in the proxy for its answer, by api, at the samples:
            # a quiet group with a request long unanswered here points at the proxy or the broker;
            # with none, at the client.
            pending_max: dict[str, float] = collections.defaultdict(float)
            while time.monotonic() < deadline:
                time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
                now = time.monotonic()
                while pending and pending[0][0] <= now:
                    _when, what = pending.pop(0)
                    events.append(f"{(now - began) / 60:.1f} min: {what}")
                    print(f"  {(now - began) / 60:5.1f} min  {what}", flush=True)
                    if what == "restart the broker":
                        node = cluster.nodes[0].node_id
                        cluster.stop_node(node)
                        time.sleep(5)
                        cluster.start_node(node)
                    elif what == "a member joins":
                        member.start()
                    else:
                        stop_member.set()
                at = now - began
                for api, age in scrape(proxy, "kthrottle_oldest_pending_request_seconds", "api").items():
                    pending_max[api] = max(pending_max[api], age)
                sample = (rss_bytes(pid), open_fds(pid))
                trace.append((at, *sample))
                if start_sample is None and at >= warmup:
                    start_sample = sample
                for group in groups:  # the longest a group went without a new message
                    value = _consumed(progress, group)
                    since, before = last_moved[group]
                    if value != before:
                        last_moved[group] = (now, value)
                    else:
                        silences[group] = max(silences[group], now - since)
                        if now - since >= SILENCE_EVIDENCE_S and len(silence_evidence) < 200:
                            silent_s = round(now - since, 1)
                            silence_evidence.append(
                                {"at_min": round(at / 60, 2), "group": group, "silent_s": silent_s}
                                | {"connections": group_connections(proxy, group)}
                            )
                            print(f"  {at / 60:5.1f} min  {group} silent: {silence_evidence[-1]}", flush=True)
                print(
                    f"  {at / 60:5.1f} min  rss {sample[0] / MiB:6.1f} MiB  fds {sample[1]}"
                    f"  consumed {[v.value for v in progress.values()]}",
                    flush=True,
                )
            assert start_sample is not None, "the run is shorter than its warm-up"
            at_end = {group: group_connections(proxy, group) for group in groups}
            end_sample = (rss_bytes(pid), open_fds(pid))
            stop_producers.set()
            results: dict[str, Result] = {}
            _collect(out, results, {args[1] for _fn, args in producers}, workers)
            acked: dict[str, set[str]] = collections.defaultdict(set)
            for got in results.values():
                if "acked" in got:
                    acked[got["topic"]].update(got["acked"])
            want = {
                "soak-ga": len(acked["soak-a"]),
                "soak-gb-rd": len(acked["soak-b"]),
                "soak-gb-kp": len(acked["soak-b"]),
            }
            catch_up = time.monotonic() + 300
            while any(_consumed(progress, g) < n for g, n in want.items()) and time.monotonic() < catch_up:
                time.sleep(1)
            stop_rest.set()
            stop_member.set()
            everyone = {_worker_name(fn, args) for fn, args in [*producers, *others]}
            if member.pid is not None:
                everyone.add("soak-gb-kp+2")
            _collect(out, results, everyone, [*workers, member])
            for worker in [*workers, *([member] if member.pid is not None else [])]:
                worker.join(60)
            rss_final, fds_final = rss_bytes(pid), open_fds(pid)
            requests = scrape(proxy, "kthrottle_requests_total", "api")
            throttled = scrape(proxy, "kthrottle_throttled_requests_total", "api")
            upstream = scrape(proxy, "kthrottle_upstream_errors_total", "kind")
            rejected = scrape(proxy, "kthrottle_rejected_frames_total", "reason")
            # The broker closing a connection idle for connections.max.idle.ms is no error; nor,
            # with faults, are the connections the broker's restart broke.
            broker_idle_closes = int(upstream.pop("idle_close", 0))
            broken_by_restart = {k: int(upstream.pop(k)) for k in list(upstream) if faults and upstream[k]}
            proxy_errors = {f"proxy-upstream:{k}": v for k, v in upstream.items()}
            proxy_errors.update({f"proxy-rejected:{k}": v for k, v in rejected.items()})
        finally:
            proxy.stop()
            if log_dir:
                with contextlib.suppress(OSError):
                    shutil.copy(proxy.log_path, Path(log_dir) / "kthrottle.log")
                    shutil.copy(cluster.nodes[0].log_dir / "server.log", Path(log_dir) / "broker.log")
    return summarize(
        results,
        acked,
        requests,
        throttled,
        proxy_errors,
        trace,
        start_sample,
        end_sample,
        (rss_launch, fds_launch),
        (rss_final, fds_final),
        minutes,
    ) | {
        "broker_idle_closes": broker_idle_closes,
        "upstream_errors_from_the_restart": broken_by_restart,
        "faults": events,
        "longest_silence_s": {g: round(v, 1) for g, v in silences.items()},
        "longest_pending_request_s": {api: round(v, 1) for api, v in sorted(pending_max.items())},
        "silence_evidence": silence_evidence,
        "group_connections_at_end": at_end,
    }


def _worker_name(fn: Callable[..., None], args: tuple[Any, ...]) -> str:
    """The name a worker reports under: its client id or group, or "probe"."""
    return "probe" if fn is latency_probe else str(args[1] if fn is not librdkafka_admin else args[0])


def _collect(out: Any, results: dict[str, Result], names: set[str], workers: list[Any]) -> None:
    """Reports from the workers until those of ``names`` have come (others may come first); a
    worker that died without one (its traceback is on stderr) fails the soak at once rather than
    after a long wait."""
    deadline = time.monotonic() + 300
    while not names <= results.keys():
        try:
            got = out.get(timeout=2)
        except queue.Empty:
            dead = [w.name for w in workers if w.pid is not None and w.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"soak workers died or hung without reporting: {dead}") from None
            continue
        results[got["worker"]] = got


def _consumed(progress: dict[str, Synchronized[int]], group: str) -> int:
    """What a group has consumed, its second member's count included (an overcount, where both
    read a key, only makes the wait for it shorter)."""
    return progress[group].value + sum(v.value for g, v in progress.items() if g.startswith(f"{group}+"))


def summarize(
    results: dict[str, Result],
    acked: dict[str, set[str]],
    requests: dict[str, float],
    throttled: dict[str, float],
    proxy_errors: dict[str, float],
    trace: list[tuple[float, int, int]],
    start: tuple[int, int],
    end: tuple[int, int],
    launch: tuple[int, int],
    final: tuple[int, int],
    minutes: float,
) -> Result:
    errors: collections.Counter[str] = collections.Counter()
    throttled_answers: collections.Counter[str] = collections.Counter()
    for got in results.values():
        errors.update(got.get("errors", {}))
        for outcome, count in got.get("outcomes", {}).items():
            result = outcome.partition(":")[2]
            if result == "THROTTLING_QUOTA_EXCEEDED":
                throttled_answers[f"librdkafka-admin:{outcome}"] += count
            elif result != "ok":
                errors[f"librdkafka-admin:{outcome}"] += count
    errors.update({k: int(v) for k, v in proxy_errors.items()})
    consumed: dict[str, Result] = {}
    for group in ("soak-ga", "soak-gb-rd", "soak-gb-kp"):
        members = [got for name, got in results.items() if name == group or name.startswith(f"{group}+")]
        places: dict[str, list[int]] = {}
        duplicates = sum(got["duplicates"] for got in members)
        redelivered = sum(got["redelivered"] for got in members)
        for got in members:  # a key two members read: at one place a redelivery, at two a duplicate
            for key, place in got["places"].items():
                before = places.setdefault(key, place)
                if before is not place:
                    if list(before) == list(place):
                        redelivered += 1
                    else:
                        duplicates += 1
        keys = set(places)
        topic = members[0]["topic"]
        consumed[group] = {
            "topic": topic,
            "consumed": len(keys),
            "duplicates": duplicates,
            "redelivered": redelivered,
            "missing": len(acked[topic] - keys),
            "unacked_but_consumed": len(keys - acked[topic]),
        }
    produced = sum(len(keys) for keys in acked.values())
    equal = all(c["missing"] == 0 and c["unacked_but_consumed"] == 0 for c in consumed.values())
    added = added_latency_per_minute(results["probe"]["samples"], minutes)
    admin = results["soak-admin"]["outcomes"]
    replay = results["soak-replayer"]
    return {
        "minutes": minutes,
        "requests_served": int(sum(requests.values())),
        "requests_by_api": {k: int(v) for k, v in sorted(requests.items())},
        "throttled_requests_by_api": {k: int(v) for k, v in sorted(throttled.items())},
        "errors_by_kind": dict(sorted(errors.items())),
        "throttled_by_kind": dict(sorted(throttled_answers.items())),
        "unexpected_errors": sum(errors.values()),
        "messages_produced": produced,
        "messages_produced_by_topic": {t: len(k) for t, k in sorted(acked.items())},
        "messages_consumed": {g: c["consumed"] for g, c in consumed.items()},
        "produced_equals_consumed": equal,
        "duplicates": sum(c["duplicates"] for c in consumed.values()),
        "redelivered": {g: c["redelivered"] for g, c in consumed.items()},
        "missing": sum(c["missing"] for c in consumed.values()),
        "missing_by_group": {g: c["missing"] for g, c in consumed.items()},
        "admin_topics_created": admin.get("create:ok", 0),
        "admin_topics_deleted": admin.get("delete:ok", 0),
        "replayed_mib": round(replay["fetched_bytes"] / MiB, 1),
        "rss_launch_mib": round(launch[0] / MiB, 1),
        "rss_start_mib": round(start[0] / MiB, 1),
        "rss_end_mib": round(end[0] / MiB, 1),
        "rss_growth_pct": round((end[0] - start[0]) / start[0] * 100, 2),
        "rss_after_drain_mib": round(final[0] / MiB, 1),
        "fds_launch": launch[1],
        "fds_start": start[1],
        "fds_end": end[1],
        "fds_after_drain": final[1],
        "rss_mib_every_minute": [round(rss / MiB, 1) for at, rss, _fds in trace if int(at) % 60 < 10],
        "p99_added_latency_ms_per_minute": added,
        "p99_added_latency_ms_median": round(statistics.median(added or [0.0]), 3),
        "probe_round_trips": {name: len(points) for name, points in results["probe"]["samples"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--warmup-seconds", type=float, default=60.0, help="the RSS and fds 'start' is read after it"
    )
    parser.add_argument(
        "--faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="restart the broker at a third of the run, rebalance group soak-gb-kp at a half and two thirds",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        help="keep the clients', the proxy's and the broker's logs here (default: a new directory)",
    )
    args = parser.parse_args()
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="kthrottle-soak-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    print(f"logs: {log_dir}", flush=True)
    figures = run(args.minutes, args.warmup_seconds, faults=args.faults, log_dir=str(log_dir))
    figures["logs"] = str(log_dir)
    with contextlib.suppress(Exception):
        print(
            f"requests {figures['requests_served']}, produced {figures['messages_produced']}, "
            f"consumed {figures['messages_consumed']}, errors {figures['errors_by_kind']}, "
            f"rss {figures['rss_start_mib']} -> {figures['rss_end_mib']} MiB ({figures['rss_growth_pct']}%), "
            f"fds {figures['fds_start']} -> {figures['fds_end']}"
        )
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
