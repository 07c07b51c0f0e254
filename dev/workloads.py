"""Workloads made of real clients, shared by the acceptance tests and the benchmarks."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StormResult:
    created: list[float] = field(default_factory=list)  # seconds from start, one per acked producer
    steady_throttles: list[int] = field(default_factory=list)  # librdkafka's throttle max, per stats
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
        def on_stats(raw: str) -> None:
            for broker in json.loads(raw).get("brokers", {}).values():
                result.steady_throttles.append(int(broker.get("throttle", {}).get("max", 0)))

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
                "statistics.interval.ms": 500,
                "stats_cb": on_stats,
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
