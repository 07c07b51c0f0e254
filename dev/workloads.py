"""Workloads made of real clients, shared by the acceptance tests and the benchmarks."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


def librdkafka_sasl(user: str, password: str, mechanism: str = "PLAIN") -> dict[str, Any]:
    """librdkafka settings for a SASL_PLAINTEXT login."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


class ThrottleWatch:
    """Collects the throttle librdkafka reports (its per-broker ``throttle.max`` statistic):
    pass ``watch.config(ms)`` into a client's settings, read ``watch.max`` afterwards."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_stats(self, raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            self.seen.append(int(broker.get("throttle", {}).get("max", 0)))

    def config(self, interval_ms: int = 500) -> dict[str, Any]:
        return {"statistics.interval.ms": interval_ms, "stats_cb": self.on_stats}

    @property
    def max(self) -> int:
        return max(self.seen, default=0)

    def never_throttled(self) -> bool:
        """No statistics report showed a throttle; False when none arrived (nothing to judge by:
        the client never polled, or ran shorter than the interval)."""
        return bool(self.seen) and self.max == 0


@dataclass
class StormResult:
    created: list[float] = field(default_factory=list)  # seconds from start, one per acked producer
    started: float = 0.0  # the start (time.monotonic())
    steady_throttles: ThrottleWatch = field(default_factory=ThrottleWatch)
    steady_errors: list[str] = field(default_factory=list)
    steady_delivered: int = 0

    def rate(self, t_from: float, t_to: float) -> float:
        """Short-lived producers acknowledged per second in [t_from, t_to)."""
        return sum(t_from <= t < t_to for t in self.created) / (t_to - t_from)


def producer_id_storm(
    bootstrap: str,
    storm_conf: dict[str, Any],
    steady_conf: dict[str, Any],
    storm_topic: str,
    steady_topic: str,
    seconds: float,
    threads: int = 8,
    until: threading.Event | None = None,
) -> StormResult:
    """``threads`` loops each start an idempotent librdkafka producer (a new producer id), send one
    record, wait for it and drop the producer, as fast as they can; beside them one long-lived
    idempotent producer sends steadily. Runs for ``seconds``, or until ``until`` is set when given."""
    from confluent_kafka import Producer

    result = StormResult()
    stop = threading.Event()
    start = result.started = time.monotonic()

    def short_lived() -> None:
        while not stop.is_set():
            producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **storm_conf})
            producer.produce(storm_topic, b"x")
            if producer.flush(30) == 0:
                result.created.append(time.monotonic() - start)

    def long_lived() -> None:
        def on_delivery(err: object, _msg: object) -> None:
            if err is None:
                result.steady_delivered += 1
            else:
                result.steady_errors.append(str(err))

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 20,
                **result.steady_throttles.config(),
                **steady_conf,
            }
        )
        while not stop.is_set():
            producer.produce(steady_topic, b"b" * 100, on_delivery=on_delivery)
            producer.poll(0.01)
        if producer.flush(30) != 0:
            result.steady_errors.append("undelivered at the end")

    with ThreadPoolExecutor(max_workers=threads + 1) as pool:
        futures = [pool.submit(short_lived) for _ in range(threads)] + [pool.submit(long_lived)]
        if until is None:
            time.sleep(seconds)
        else:
            until.wait()
        stop.set()
        for future in futures:
            future.result(timeout=90)
    return result


def steady_producer(
    bootstrap: str,
    topic: str,
    client_id: str,
    offered_bps: float,
    stop: threading.Event,
    acked: list[tuple[float, int]],
    value_size: int = 16 * 1024,
    extra: dict[str, Any] | None = None,
    purge: bool = False,
) -> None:
    """librdkafka producing ``offered_bps`` of ``value_size`` values until ``stop`` (``extra``:
    more client settings, e.g. TLS); appends (monotonic time, bytes) per acknowledged message to
    ``acked``; ``purge``: drop the backlog at ``stop`` rather than flush it. Batches of 16 KiB, Java's
    producer's default: what a client has in flight when its connection is muted is read after the
    mute, so Kafka's (and the proxy's) quota lets it through on top of the quota; librdkafka's
    default of 1 MB batches makes that a large share of quota x window."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 16384,
            "queue.buffering.max.kbytes": 4096,
            **(extra or {}),
        }
    )

    def done(err: object, _msg: object) -> None:
        if err is None:
            acked.append((time.monotonic(), value_size))

    payload = b"x" * value_size
    began, queued = time.monotonic(), 0
    while not stop.is_set():
        if queued > offered_bps * (time.monotonic() - began):
            producer.poll(0.005)
            continue
        try:
            producer.produce(topic, payload, on_delivery=done)
        except BufferError:
            producer.poll(0.05)
            continue
        queued += value_size
        producer.poll(0)
    if purge:  # over its quota, the backlog would take as long to flush as the quota makes it
        producer.purge(in_queue=True, in_flight=True)
    producer.flush(30)


def rate_between(acked: list[tuple[float, int]], t_from: float, t_to: float) -> float:
    """Acknowledged bytes per second in [t_from, t_to) (monotonic times)."""
    return sum(n for at, n in acked if t_from <= at < t_to) / (t_to - t_from)


@dataclass
class ConsumerRun:
    """What a greedy consumer saw: (seconds from its start, value bytes so far) after every
    consume, and (seconds, largest throttle in librdkafka's last statistics window) whenever it
    reported one."""

    marks: list[tuple[float, int]] = field(default_factory=list)
    throttles: list[tuple[float, int]] = field(default_factory=list)

    def max_throttle(self, t_from: float = 0.0, t_to: float = float("inf")) -> int:
        return max((ms for t, ms in self.throttles if t_from <= t < t_to), default=0)

    def slope(self, t_from: float, t_to: float = float("inf")) -> float:
        """Bytes per second: a least-squares line through what had arrived (answers come in
        lumps; two points would read where the lumps fall)."""
        import statistics

        span = [(t, n) for t, n in self.marks if t_from <= t < t_to]
        return statistics.linear_regression([t for t, _ in span], [n for _, n in span]).slope


def greedy_consumer(
    bootstrap: str,
    topic: str,
    client_id: str,
    seconds: float,
    at: tuple[float, Any] | None = None,
) -> ConsumerRun:
    """librdkafka consuming ``topic`` from the start as fast as it is let, for ``seconds``;
    ``at`` = (seconds, callback): the callback runs once, from the consuming thread, that far in
    (a reload, a fault)."""
    from confluent_kafka import Consumer

    run = ConsumerRun()
    start = time.monotonic()

    def on_stats(raw: str) -> None:
        for broker in json.loads(raw).get("brokers", {}).values():
            seen = int(broker.get("throttle", {}).get("max", 0))
            if seen:
                run.throttles.append((time.monotonic() - start, seen))

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}-{client_id}",
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 500,
            "stats_cb": on_stats,
        }
    )
    consumer.subscribe([topic])
    got = 0
    try:
        while time.monotonic() - start < seconds:
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is None:
                    got += len(msg.value() or b"")
            now = time.monotonic() - start
            run.marks.append((now, got))
            if at is not None and now >= at[0]:
                at[1]()
                at = None
    finally:
        consumer.close()
    return run
