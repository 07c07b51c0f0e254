"""Reproduce kafka-python's stalled group leader against a real broker, with no proxy in between.

A kafka-python group leader rebalances because its metadata changed (here: partitions added to
its topic). Its SyncGroup answer takes longer than ``poll(timeout_ms=500)``. A relay holds
SyncGroup answers for ``--delay`` seconds, standing in for a slow network or a loaded
coordinator. kafka-python 3.0.12 then never applies the answer and never heartbeats again:
the records written afterwards are not read, and the broker expires the member after
``session.timeout.ms``.

The last output line is JSON. ``read_after_change`` is the number of the 4 records (one per
partition) written after the change that the consumer read within ``--wait`` seconds. With
``--delay 0`` it reads all 4. ``--java-fix`` applies, in this process only, the rule Kafka's
Java consumer follows since KAFKA-9815: a rebalance that a metadata change starts also sets the
rejoin flag, which stays set until the join completes. With it the consumer reads all 4 at any
delay. See docs/operations.md, "kafka-python: a leader that stops after a
metadata change".

    python dev/kafka_python_stall.py --delay 1.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dev.harness import KafkaCluster
from dev.waiting import WaitTimeout, wait_until

METADATA, SYNC_GROUP = 3, 14
POLL_MS = 500


class DelayRelay:
    """Forwards one listener's connections, holding each answer of the API keys in ``delays`` that
    many seconds (answers on a connection stay in order: those after a held one wait too)."""

    def __init__(self, listen_port: int, target_port: int, delays: dict[int, float]) -> None:
        self.listen_port, self.target_port, self.delays = listen_port, target_port, delays
        self.held = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")

    def stop(self) -> None:
        """Stop listening (the port is free again) and end the relay's thread."""
        self._loop.call_soon_threadsafe(self._server.close)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        with contextlib.suppress(asyncio.CancelledError):  # serve_forever ends so when closed
            self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.listen_port)
        self._ready.set()
        async with self._server:
            await self._server.serve_forever()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        broker_r, broker_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        api_keys: dict[int, int] = {}

        async def frame(reader: asyncio.StreamReader) -> bytes:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            return struct.pack(">i", size) + await reader.readexactly(size)

        async def requests() -> None:
            while True:
                data = await frame(client_r)
                api_key, _version, correlation_id = struct.unpack(">hhi", data[4:12])
                api_keys[correlation_id] = api_key
                broker_w.write(data)

        async def responses() -> None:
            while True:
                data = await frame(broker_r)
                delay = self.delays.get(api_keys.pop(struct.unpack(">i", data[4:8])[0], -1), 0.0)
                if delay:
                    self.held += 1
                    await asyncio.sleep(delay)
                client_w.write(data)

        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await asyncio.gather(requests(), responses())
        client_w.close()
        broker_w.close()


def apply_java_fix() -> None:
    """need_rejoin() that finds the assignment and metadata snapshots apart also requests the
    rejoin, so the join stays pending after the leader's assignment makes them equal again."""
    from kafka.coordinator.consumer import ConsumerCoordinator

    original = ConsumerCoordinator.need_rejoin

    def need_rejoin(self: Any) -> bool:
        snapshot = self._assignment_snapshot
        if snapshot is not None and snapshot != self._metadata_snapshot:
            self.request_rejoin()
        return bool(original(self))

    ConsumerCoordinator.need_rejoin = need_rejoin


def run(delay: float, wait: float, java_fix: bool) -> dict[str, Any]:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewPartitions

    if java_fix:
        apply_java_fix()

    with KafkaCluster(brokers=1, relayed_listeners=("RELAY",)) as cluster:
        bound, advertised = cluster.nodes[0].relayed["RELAY"]
        relay = DelayRelay(advertised, bound, {SYNC_GROUP: delay})
        relay.start()
        topic, group = f"stall-{uuid.uuid4().hex[:6]}", f"stall-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 2)
        read: list[int] = []
        assigned: list[int] = []
        stop = threading.Event()

        def consume() -> None:
            consumer = KafkaConsumer(
                topic,
                bootstrap_servers=f"127.0.0.1:{advertised}",
                group_id=group,
                auto_offset_reset="earliest",
                metadata_max_age_ms=1000,  # notices the new partitions within a second
            )
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=POLL_MS).values():
                    read.extend(r.partition for r in records)
                assigned[:] = sorted(tp.partition for tp in consumer.assignment())
            consumer.close()

        def write(partitions: range) -> None:
            producer = KafkaProducer(bootstrap_servers=cluster.bootstrap_servers)
            for partition in partitions:
                producer.send(topic, b"x", partition=partition)
            producer.flush(30)
            producer.close()

        worker = threading.Thread(target=consume, name="consumer")
        worker.start()
        try:
            write(range(2))
            wait_until(lambda: len(read) == 2, 60, lambda: f"the consumer read {len(read)} of the first 2")
            admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap_servers)
            admin.create_partitions({topic: NewPartitions(total_count=4)})
            admin.close()
            time.sleep(3)  # the metadata refresh, the rejoin and its (held) SyncGroup
            before = len(read)
            write(range(4))
            with contextlib.suppress(WaitTimeout):  # a stalled consumer reads fewer: the figure says so
                wait_until(lambda: len(read) - before >= 4, wait, "the last 4 records")
            return {
                "syncgroup_delay_s": delay,
                "java_fix": java_fix,
                "poll_timeout_ms": POLL_MS,
                "syncgroup_answers_held": relay.held,
                "assignment_after_change": list(assigned),
                "read_after_change": len(read) - before,
                "written_after_change": 4,
            }
        finally:
            stop.set()
            worker.join(60)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delay", type=float, default=1.5, help="seconds each SyncGroup answer is held")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds to wait for the last 4 records")
    parser.add_argument("--java-fix", action="store_true", help="apply KAFKA-9815's rule in-process")
    args = parser.parse_args()
    print(json.dumps(run(args.delay, args.wait, args.java_fix)))


if __name__ == "__main__":
    main()
