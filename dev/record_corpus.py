"""Record real Kafka frames through the proxy and write the fuzz seed corpus (fuzz/corpus/).

A KRaft broker from the harness (with a SASL listener), a recording relay in front of each of its
listeners, and kthrottle in sidecar mode in front of each relay; then real clients work through
the proxies: confluent-kafka (idempotent, transactional, consumer group, admin, SASL PLAIN and
SCRAM), kafka-python (acks 0 and 1, consumer, admin), aiokafka and Kafka's Java perf tools. The
relay sees every request the proxy forwards and every response the broker sends, per
connection and in order, which is what the three fuzz targets take:

- ``requests/``: one request frame payload;
- ``responses/``: api key and version (int16 each), then the response payload;
- ``pipeline/``: a setup byte, then the connection's frames as records (op 0: client frame,
  op 1: broker answer without its correlation id), see fuzz/pipeline_target.py.

Small records and a few of each (api key, version) keep the corpus small (a few hundred KB).

    source dev/setup.sh && python -m dev.record_corpus            # rewrites fuzz/corpus/*
    python -m dev.record_corpus --out /tmp/corpus --skip-java
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import shutil
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.harness import KafkaCluster, free_port
from dev.kafka_python_group import group_consumer
from dev.proxy_process import ProxyProcess, sidecar_config
from protocol.frames import FrameDecoder

log = logging.getLogger("record_corpus")
REPO = Path(__file__).resolve().parent.parent
USER, PASSWORD = "alice", "alice-secret"
MAX_SEED_BYTES = 12 * 1024  # larger frames are left out of the request/response seeds
MAX_CONVERSATION_BYTES = 24 * 1024
PER_KIND = 3  # seeds per (api key, version) and direction


@dataclass
class Conversation:
    """One proxied connection as the relay saw it: ('req' | 'resp', frame payload) in order."""

    events: list[tuple[str, bytes]] = field(default_factory=list)


class Relay:
    """A TCP relay in its own thread that splits both directions into frames and keeps them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.conversations: list[Conversation] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _serve(self) -> None:
        await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        conv = Conversation()
        self.conversations.append(conv)
        try:
            ureader, uwriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str) -> None:
            decoder = FrameDecoder(2**31 - 1)
            try:
                while data := await reader.read(65536):
                    for frame in decoder.feed(data):
                        conv.events.append((kind, bytes(frame)))
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(creader, uwriter, "req"), pump(ureader, cwriter, "resp"))


# --- clients ------------------------------------------------------------------------------------


def _confluent(bootstrap: str, sasl: dict[str, str] | None = None) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic  # type: ignore[attr-defined]

    base: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, **(sasl or {})}
    suffix = "sasl" if sasl else "plain"
    admin = AdminClient(base)
    topic = f"ck-{suffix}-{int(time.time())}"
    for fut in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        fut.result(30)
    producer = Producer({**base, "enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4"})
    for i in range(40):
        producer.produce(topic, key=str(i).encode(), value=b"v" * (i * 7 % 90), headers={"h": b"x"})
    producer.flush(30)
    if not sasl:
        txn = Producer({**base, "transactional.id": f"txn-{suffix}", "linger.ms": 5})
        txn.init_transactions(30)
        txn.begin_transaction()
        for i in range(10):
            txn.produce(topic, value=f"t{i}".encode())
        txn.commit_transaction(30)
        for fut in admin.create_partitions([NewPartitions(topic, 3)]).values():
            fut.result(30)
    consumer = Consumer({**base, "group.id": f"g-{suffix}", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    got, deadline = 0, time.monotonic() + 20
    while got < 40 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got += 1
    with contextlib.suppress(KafkaException):
        consumer.commit(asynchronous=False)
    consumer.close()
    for fut in admin.delete_topics([topic]).values():
        fut.result(30)


def _kafka_python(bootstrap: str) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"kp-{int(time.time())}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    for acks in (0, 1, "all"):
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks=acks, linger_ms=5)
        for i in range(15):
            producer.send(topic, value=f"kp{acks}-{i}".encode())
        producer.flush(30)
        producer.close()
    consumer = group_consumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=4000,
        group_id="kp-group",
    )
    for _ in consumer:
        pass
    consumer.close()
    admin.delete_topics([topic])
    admin.close()


def _aiokafka(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"aio-{int(time.time())}"

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        for i in range(20):
            await producer.send_and_wait(topic, f"aio-{i}".encode())
        await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        try:
            await asyncio.wait_for(consumer.getmany(timeout_ms=3000), 10)
        finally:
            await consumer.stop()

    asyncio.run(run())


def _java(bootstrap: str, cluster: KafkaCluster) -> None:
    from dev import perf_tools

    topic = "perf-seeds"
    cluster.create_topic(topic, partitions=1)
    perf_tools.produce(bootstrap, topic, records=30, throughput=-1, acks="all", batch_size=2048)
    perf_tools.consume(bootstrap, topic, records=30)


# --- writing the corpus ---------------------------------------------------------------------------


def _name(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def write_corpus(conversations: list[Conversation], out: Path) -> dict[str, int]:
    for target in ("requests", "responses", "pipeline"):
        shutil.rmtree(out / target, ignore_errors=True)
        (out / target).mkdir(parents=True)
    kinds: dict[tuple[str, int, int], int] = defaultdict(int)
    shapes: set[tuple[int, ...]] = set()
    counts = {"requests": 0, "responses": 0, "pipeline": 0}
    for n, conv in enumerate(conversations):
        sent: dict[int, tuple[int, int]] = {}
        records = bytearray([n % 4])
        keys: list[int] = []
        for kind, frame in conv.events:
            if len(frame) < 8 and kind == "req":
                continue
            if kind == "req":
                key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
                sent[correlation_id] = (key, version)
                keys.append(key)
                rec = bytes([0]) + struct.pack(">H", len(frame) + 4) + struct.pack(">i", len(frame)) + frame
                seed = frame
                target, kv = "requests", (key, version)
            else:
                (correlation_id,) = struct.unpack_from(">i", frame, 0)
                if correlation_id not in sent:
                    continue
                kv = sent.pop(correlation_id)
                rec = bytes([1]) + struct.pack(">H", len(frame) - 4) + frame[4:]
                seed = struct.pack(">hh", *kv) + frame
                target = "responses"
            if len(seed) <= MAX_SEED_BYTES and kinds[(target, *kv)] < PER_KIND:
                kinds[(target, *kv)] += 1
                (out / target / _name(seed)).write_bytes(seed)
                counts[target] += 1
            if len(rec) <= 0xFFFF + 3 and len(records) + len(rec) <= MAX_CONVERSATION_BYTES:
                records += rec
        shape = tuple(sorted(set(keys)))
        if keys and shape not in shapes:
            shapes.add(shape)
            (out / "pipeline" / _name(bytes(records))).write_bytes(bytes(records))
            counts["pipeline"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=REPO / "fuzz" / "corpus")
    parser.add_argument("--skip-java", action="store_true", help="leave out Kafka's perf tools")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with KafkaCluster(brokers=1, sasl_users={USER: PASSWORD}) as cluster:
        node = cluster.nodes[0]
        plain_relay = Relay(("127.0.0.1", node.port)).start()
        sasl_relay = Relay(("127.0.0.1", node.sasl_port)).start()
        plain_cfg = sidecar_config(
            cluster, sidecar={"listen_port": free_port(), "upstream": f"127.0.0.1:{plain_relay.port}"}
        )
        sasl_cfg = sidecar_config(
            cluster,
            sidecar={"listen_port": free_port(), "upstream": f"127.0.0.1:{sasl_relay.port}"},
            upstream_sasl={"username": USER, "password": PASSWORD},
        )
        with ProxyProcess(plain_cfg) as plain, ProxyProcess(sasl_cfg) as sasl:
            steps: list[tuple[str, Callable[[], Any]]] = [
                ("confluent-kafka", lambda: _confluent(plain.bootstrap)),
                ("kafka-python", lambda: _kafka_python(plain.bootstrap)),
                ("aiokafka", lambda: _aiokafka(plain.bootstrap)),
            ]
            for mech in ("PLAIN", "SCRAM-SHA-256"):
                conf = {
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": mech,
                    "sasl.username": USER,
                    "sasl.password": PASSWORD,
                }
                steps.append((f"confluent-kafka SASL {mech}", lambda c=conf: _confluent(sasl.bootstrap, c)))  # type: ignore[misc]
            if not args.skip_java:
                steps.append(("Java perf tools", lambda: _java(plain.bootstrap, cluster)))
            for name, step in steps:
                log.info("recording %s", name)
                try:
                    step()
                except Exception as exc:  # a client that fails still leaves useful frames
                    log.warning("%s failed: %r", name, exc)
            time.sleep(1)
        plain_relay.stop()
        sasl_relay.stop()
    conversations = plain_relay.conversations + sasl_relay.conversations
    counts = write_corpus(conversations, args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    log.info(
        "wrote %s seeds (%d bytes) from %d connections to %s", counts, size, len(conversations), args.out
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
