"""One client of the quota fidelity matrix (bench/quota_fidelity.py), in a process of its own.

Produces 1 KiB records as fast as it is let, or consumes a topic from the start, for SECONDS with
librdkafka, kafka-python or aiokafka, at the library's defaults or at aggressive settings (5
requests in flight, 1 MiB batches, 50 MB fetches). Prints "AT elapsed_ms bytes" (value bytes
acknowledged, or received) every 250 ms, then "ERRORS n first-error".

Usage: python dev/fidelity_client.py LIBRARY produce|fetch BOOTSTRAP TOPIC CLIENT_ID SECONDS \
       defaults|aggressive
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script by quota_fidelity

from dev.kafka_python_group import group_consumer

MiB = 1024 * 1024
VALUE = b"f" * 1024


@dataclass(frozen=True)
class Job:
    direction: str  # produce or fetch
    bootstrap: str
    topic: str
    client_id: str
    aggressive: bool


class Tally:
    def __init__(self) -> None:
        self.bytes = 0
        self.errors = 0
        self.first_error = ""
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.bytes += n

    def error(self, what: object) -> None:
        with self.lock:
            if not self.errors:
                self.first_error = str(what)[:300]
            self.errors += 1


def report(tally: Tally, seconds: float, start: float, stop: threading.Event) -> None:
    """Print the running total every 250 ms, on the main thread."""
    while True:
        time.sleep(0.25)
        elapsed = time.monotonic() - start
        print(f"AT {int(elapsed * 1000)} {tally.bytes}", flush=True)
        if elapsed >= seconds:
            break
    stop.set()
    print(f"ERRORS {tally.errors} {tally.first_error}", flush=True)


# --- librdkafka ---------------------------------------------------------------------------------


def confluent(job: Job, tally: Tally, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaError, Producer

    if job.direction == "produce":
        conf: dict[str, Any] = {"bootstrap.servers": job.bootstrap, "client.id": job.client_id}
        if job.aggressive:
            conf.update(
                {
                    "max.in.flight.requests.per.connection": 5,
                    "batch.size": MiB,
                    "linger.ms": 5,
                    "enable.idempotence": False,
                }
            )
        producer = Producer(conf)

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                tally.add(len(msg.value()))
            elif err.code() not in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
                tally.error(err)

        while not stop.is_set():
            try:
                producer.produce(job.topic, VALUE, on_delivery=delivered)
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
        producer.purge(in_queue=True, in_flight=True)
        producer.flush(5)
        return
    conf = {
        "bootstrap.servers": job.bootstrap,
        "client.id": job.client_id,
        "group.id": f"g-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest",
    }
    if job.aggressive:
        conf.update({"fetch.max.bytes": 50 * MiB, "max.partition.fetch.bytes": 10 * MiB})
    consumer = Consumer(conf)
    consumer.subscribe([job.topic])
    while not stop.is_set():
        for msg in consumer.consume(num_messages=1000, timeout=0.25):
            error = msg.error()
            if error is None:
                tally.add(len(msg.value() or b""))
            elif error.code() != KafkaError._PARTITION_EOF:
                tally.error(error)
    consumer.close()


# --- kafka-python -------------------------------------------------------------------------------


def kafka_python(job: Job, tally: Tally, stop: threading.Event) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    if job.direction == "produce":
        conf: dict[str, Any] = {"bootstrap_servers": job.bootstrap, "client_id": job.client_id}
        if job.aggressive:
            conf.update(
                {
                    "max_in_flight_requests_per_connection": 5,
                    "batch_size": MiB,
                    "linger_ms": 5,
                    "enable_idempotence": False,
                    "max_block_ms": 1000,
                }
            )
        else:
            conf["max_block_ms"] = 1000
        producer = KafkaProducer(**conf)
        while not stop.is_set():
            try:
                fut = producer.send(job.topic, VALUE)
            except KafkaTimeoutError:
                continue  # the buffer is full: the quota is holding the producer back
            fut.add_callback(lambda _md: tally.add(len(VALUE)))
            fut.add_errback(tally.error)
        return  # the process exits with its backlog; nothing after the run counts
    conf = {
        "bootstrap_servers": job.bootstrap,
        "client_id": job.client_id,
        "group_id": f"g-{uuid.uuid4().hex}",
        "auto_offset_reset": "earliest",
    }
    if job.aggressive:
        conf.update({"fetch_max_bytes": 50 * MiB, "max_partition_fetch_bytes": 10 * MiB})
    consumer = group_consumer(job.topic, **conf)
    while not stop.is_set():
        for records in consumer.poll(timeout_ms=250).values():
            tally.add(sum(len(r.value or b"") for r in records))
    consumer.close()


# --- aiokafka ---------------------------------------------------------------------------------------


async def _aiokafka(job: Job, tally: Tally, stop: threading.Event) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    if job.direction == "produce":
        conf: dict[str, Any] = {"bootstrap_servers": job.bootstrap, "client_id": job.client_id}
        if job.aggressive:
            conf.update({"max_batch_size": MiB, "linger_ms": 5})
        producer = AIOKafkaProducer(**conf)
        await producer.start()
        pending: set[asyncio.Future[Any]] = set()

        def done(fut: asyncio.Future[Any]) -> None:
            pending.discard(fut)
            if fut.cancelled():
                return
            if fut.exception() is None:
                tally.add(len(VALUE))
            else:
                tally.error(fut.exception())

        while not stop.is_set():
            if len(pending) > 32 * 1024:  # aiokafka has no buffer limit of its own
                await asyncio.sleep(0.01)
                continue
            fut = await producer.send(job.topic, VALUE)
            pending.add(fut)
            fut.add_done_callback(done)
        return
    conf = {
        "bootstrap_servers": job.bootstrap,
        "client_id": job.client_id,
        "group_id": f"g-{uuid.uuid4().hex}",
        "auto_offset_reset": "earliest",
    }
    if job.aggressive:
        conf.update({"fetch_max_bytes": 50 * MiB, "max_partition_fetch_bytes": 10 * MiB})
    consumer = AIOKafkaConsumer(job.topic, **conf)
    await consumer.start()
    while not stop.is_set():
        batch = await consumer.getmany(timeout_ms=250)
        tally.add(sum(len(r.value or b"") for records in batch.values() for r in records))
    await consumer.stop()


def aiokafka(job: Job, tally: Tally, stop: threading.Event) -> None:
    asyncio.run(_aiokafka(job, tally, stop))


LIBRARIES = {"librdkafka": confluent, "kafka-python": kafka_python, "aiokafka": aiokafka}


def main() -> None:
    library, direction, bootstrap, topic, client_id, seconds, settings = sys.argv[1:8]
    job = Job(direction, bootstrap, topic, client_id, settings == "aggressive")
    tally = Tally()
    stop = threading.Event()
    worker = threading.Thread(
        target=LIBRARIES[library],
        args=(job, tally, stop),
        daemon=True,
    )
    start = time.monotonic()
    worker.start()
    report(tally, float(seconds), start, stop)
    worker.join(10)
    sys.stdout.flush()
    import os

    os._exit(0)  # a producer's backlog or a consumer's close must not hold the next cell back


if __name__ == "__main__":
    main()
