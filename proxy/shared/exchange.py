"""State shared between proxy instances through a compacted Kafka topic.

Each instance publishes its own facts under its own keys and reads everybody's from the start of
the topic, then follows it: a new instance knows the cluster's state as soon as it has read the
topic, and a key's last value is all compaction keeps. The client is the proxy's own (aiokafka),
connected to the brokers directly with its own credentials, never through a proxy, so its
traffic is never throttled by the quotas it serves.

``CompactedTopic`` creates the topic when missing (``cleanup.policy=compact``), reconnects with
backoff when the cluster is unreachable, and reports its connection and publish errors as metrics.
Every record read is counted by what became of it: ``handled`` by the topic's reader, whose own
metrics say what it made of it, or ``failed``: the reader raised, and the record is skipped and
logged (rate-limited, with the traceback) without stopping the exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.config import ProxyConfig, default_security_protocol, exchange_addresses
from proxy.net.tls import client_context
from proxy.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
publish_log = RateLimitedLog(log)
record_log = RateLimitedLog(log)

OnRecord = Callable[[bytes | None, bytes | None], None]
OnTimedRecord = Callable[[bytes | None, bytes | None, int], None]  # and its timestamp (ms)

# What became of each record read (kthrottle_exchange_records_total{topic,outcome}).
RECORD_OUTCOMES = ("handled", "failed")


def shown_value(value: bytes | None) -> str:
    """A record value for a log line about a skipped record: its first 100 bytes."""
    if value is None:
        return "null"
    return f"{value[:100]!r}{'...' if len(value) > 100 else ''}"


@dataclass(frozen=True)
class ExchangeSettings:
    """What the aiokafka clients need: addresses and security, from the proxy config."""

    bootstrap_servers: list[str]
    client_kwargs: dict[str, Any]
    request_timeout_ms: int

    @classmethod
    def of(cls, cfg: ProxyConfig) -> ExchangeSettings:
        ex = cfg.exchange
        kwargs: dict[str, Any] = {}
        protocol = ex.security_protocol or default_security_protocol(cfg)
        kwargs["security_protocol"] = protocol
        if protocol in ("SSL", "SASL_SSL"):
            own_files = ex.ssl_cafile is not None or ex.ssl_certfile is not None
            if cfg.upstream_tls.enabled and not own_files:
                kwargs["ssl_context"] = client_context(cfg.upstream_tls)
            else:
                # The CA file alone when given, as Kafka's truststore.
                context = (
                    ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT) if ex.ssl_cafile else ssl.create_default_context()
                )
                if ex.ssl_cafile:
                    context.load_verify_locations(cafile=str(ex.ssl_cafile))
                if ex.ssl_certfile is not None and ex.ssl_keyfile is not None:
                    context.load_cert_chain(str(ex.ssl_certfile), str(ex.ssl_keyfile))
                kwargs["ssl_context"] = context
        if protocol.startswith("SASL"):
            if cfg.upstream_sasl is None:
                raise ValueError(f"exchange security_protocol {protocol} needs upstream_sasl credentials")
            kwargs["sasl_mechanism"] = cfg.upstream_sasl.mechanism
            kwargs["sasl_plain_username"] = cfg.upstream_sasl.username
            kwargs["sasl_plain_password"] = cfg.upstream_sasl.secret()
        timeout_ms = int(ex.request_timeout_seconds * 1000)
        return cls(exchange_addresses(cfg), kwargs, timeout_ms)


class ExchangeMetrics:
    """Per-topic health of the exchange (labels: the topic, a handful at most)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connected = Gauge(
            "kthrottle_exchange_connected",
            "1 while the state-exchange client is connected and following its topic",
            ["topic"],
            registry=registry,
        )
        self.publish_errors = Counter(
            "kthrottle_exchange_publish_errors",
            "Publications to the state-exchange topic that failed",
            ["topic"],
            registry=registry,
        )
        self.records = Counter(
            "kthrottle_exchange_records",
            "Records read from the state-exchange topic, by outcome: handled (by the topic's "
            "reader, whose own metrics say what it made of it) or failed (the reader raised: "
            "skipped and logged)",
            ["topic", "outcome"],
            registry=registry,
        )


_shared_metrics: dict[int, ExchangeMetrics] = {}


def exchange_metrics(registry: CollectorRegistry) -> ExchangeMetrics:
    """One ExchangeMetrics per registry: several services follow topics in one process, and a
    metric family can be registered only once."""
    found = _shared_metrics.get(id(registry))
    if found is None or found.registry is not registry:
        found = _shared_metrics[id(registry)] = ExchangeMetrics(registry)
    return found


class CompactedTopic:
    """Follow a compacted topic from its start, calling ``on_record(key, value)`` in order; publish."""

    def __init__(
        self,
        settings: ExchangeSettings,
        topic: str,
        on_record: OnRecord,
        metrics: ExchangeMetrics,
        *,
        partitions: int = 1,
        replication: int | None = None,
        retry_seconds: float = 2.0,
        topic_configs: dict[str, str] | None = None,
        history_seconds: float | None = None,
        on_timed_record: OnTimedRecord | None = None,
        on_state: Callable[[bool], None] | None = None,
        max_record_bytes: int = 1024 * 1024,
        compression: str | None = "gzip",
    ) -> None:
        """``history_seconds``: read only the records of that many seconds back (by their
        timestamps) rather than the whole topic. ``on_timed_record`` is called instead of
        ``on_record``, with the record's timestamp. ``on_state(True)`` when the history present
        at connection has been read, ``on_state(False)`` when the connection is lost."""
        self.settings = settings
        self.topic = topic
        self.on_record = on_record
        self.on_timed_record = on_timed_record
        self.on_state = on_state
        self.history_seconds = history_seconds
        self.max_record_bytes = max_record_bytes
        self.compression = compression
        self.partitions = partitions
        self.replication = replication
        self.retry_seconds = retry_seconds
        self.topic_configs = {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": "0",
            **(topic_configs or {}),
        }
        self._connected = metrics.connected.labels(topic)
        self._publish_errors = metrics.publish_errors.labels(topic)
        # Every outcome resolved now, so a scrape shows each at 0 before its first record.
        self._records = {outcome: metrics.records.labels(topic, outcome) for outcome in RECORD_OUTCOMES}
        self._producer: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.caught_up = asyncio.Event()  # set once the records present at connect were read

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"exchange-{self.topic}")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._connected.set(0)

    @property
    def connected(self) -> bool:
        return self._producer is not None

    async def publish(self, key: bytes, value: bytes | None) -> bool:
        """Send one record and wait for the broker's acknowledgement; False (counted) on failure."""
        producer = self._producer
        if producer is None:
            self._publish_errors.inc()
            log.warning("exchange %s: not connected, publication of key %r dropped", self.topic, key)
            return False
        try:
            await producer.send_and_wait(self.topic, value, key=key)
        except Exception as exc:  # any client error: counted, logged, retried at the next interval
            self._publish_errors.inc()
            self._connected.set(0)  # the client reconnects by itself; say so meanwhile
            publish_log.log(
                logging.WARNING, self.topic, "exchange %s: publication failed: %s", self.topic, exc
            )
            return False
        self._connected.set(1)
        return True

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._connected.set(0)
                log.warning(
                    "exchange %s: %s; retrying in %.0f s",
                    self.topic,
                    exc or type(exc).__name__,
                    self.retry_seconds,
                )
            await asyncio.sleep(self.retry_seconds)

    async def _session(self) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

        s = self.settings
        await self._ensure_topic()
        producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap_servers,
            client_id="kthrottle-exchange",
            acks="all",
            compression_type=self.compression,  # reports repeat names: a large one shrinks several times
            request_timeout_ms=s.request_timeout_ms,
            max_request_size=self.max_record_bytes + 64 * 1024,
            **s.client_kwargs,
        )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
            client_id="kthrottle-exchange",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=s.request_timeout_ms,
            fetch_max_wait_ms=500,  # a record is read as soon as it is written; idle, two polls a second
            max_partition_fetch_bytes=max(1024 * 1024, self.max_record_bytes + 64 * 1024),
            **s.client_kwargs,
        )
        await producer.start()
        try:
            await consumer.start()
            try:
                parts = await producer.partitions_for(self.topic)  # waits for the topic's metadata
                if not parts:
                    raise ConnectionError(f"topic {self.topic} has no partitions visible yet")
                assigned = [TopicPartition(self.topic, p) for p in sorted(parts)]
                consumer.assign(assigned)
                await self._seek_start(consumer, assigned)
                ends = await consumer.end_offsets(assigned)
                self._producer = producer
                self._connected.set(1)
                log.info(
                    "exchange %s: connected, reading %d partition(s) from the start", self.topic, len(parts)
                )
                await self._follow(consumer, ends)
            finally:
                self._producer = None
                self._connected.set(0)
                if self.on_state is not None:
                    self.on_state(False)
                await consumer.stop()
        finally:
            await producer.stop()

    async def _seek_start(self, consumer: Any, assigned: list[Any]) -> None:
        """From the beginning, or from ``history_seconds`` back where the topic can say."""
        if self.history_seconds is None:
            await consumer.seek_to_beginning(*assigned)
            return
        since = int((time.time() - self.history_seconds) * 1000)
        found = await consumer.offsets_for_times({tp: since for tp in assigned})
        ends = await consumer.end_offsets(assigned)
        for tp in assigned:
            hit = found.get(tp)
            consumer.seek(tp, hit.offset if hit is not None else ends[tp])

    async def _follow(self, consumer: Any, ends: dict[Any, int]) -> None:
        pending = {tp for tp, end in ends.items() if end > await consumer.position(tp)}
        announced = not pending
        if not pending:
            self.caught_up.set()
            if self.on_state is not None:
                self.on_state(True)
        while not self._stopping:
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for tp, records in batches.items():
                for record in records:
                    self._deliver(record)
                if tp in pending and records and records[-1].offset + 1 >= ends[tp]:
                    pending.discard(tp)
            if pending:
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
            if not pending and not announced:
                announced = True
                self.caught_up.set()
                if self.on_state is not None:
                    self.on_state(True)

    def _deliver(self, record: Any) -> None:
        """Hand one record to the reader; counted by its outcome (``RECORD_OUTCOMES``)."""
        try:
            if self.on_timed_record is not None:
                self.on_timed_record(record.key, record.value, record.timestamp)
            else:
                self.on_record(record.key, record.value)
        except Exception:  # a bad record must not stop the exchange
            self._records["failed"].inc()
            record_log.log(
                logging.ERROR,
                self.topic,
                "exchange %s: record at partition %d offset %d skipped: its reader failed",
                self.topic,
                record.partition,
                record.offset,
                exc_info=True,
            )
            return
        self._records["handled"].inc()

    async def _ensure_topic(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import TopicAlreadyExistsError

        s = self.settings
        admin = AIOKafkaAdminClient(
            bootstrap_servers=s.bootstrap_servers,
            client_id="kthrottle-exchange",
            request_timeout_ms=s.request_timeout_ms,
            **s.client_kwargs,
        )
        await admin.start()
        try:
            existing = await admin.list_topics()
            if self.topic in existing:
                return
            brokers = (await admin.describe_cluster()).get("brokers") or []
            replication = self.replication or max(1, min(3, len(brokers)))
            topic = NewTopic(
                self.topic,
                self.partitions,
                replication,
                topic_configs=self.topic_configs,
            )
            try:
                response = await admin.create_topics([topic])
            except TopicAlreadyExistsError:
                return
            for item in getattr(response, "topic_errors", []) or []:
                code = item[1]
                if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (another instance won)
                    raise ConnectionError(f"creating topic {self.topic} failed with error {code}")
            log.info("exchange: created compacted topic %s (replication %d)", self.topic, replication)
        finally:
            await admin.close()
