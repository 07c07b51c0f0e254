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


@dataclass
class StormResult:
    created: list[float] = field(default_factory=list)  # seconds from start, one per acked producer
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
) -> StormResult:
    """``threads`` loops each start an idempotent librdkafka producer (a new producer id), send one
    record, wait for it and drop the producer, as fast as they can; beside them one long-lived
    idempotent producer sends steadily. Runs for ``seconds``."""
    from confluent_kafka import Producer

    result = StormResult()
    stop = threading.Event()
    start = time.monotonic()

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
        time.sleep(seconds)
        stop.set()
        for future in futures:
            future.result(timeout=90)
    return result
