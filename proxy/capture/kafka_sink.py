"""The Kafka capture sink: each capture record as one message on a topic, from the writer thread.

Message: value = the record as compact JSON with the capture schema's field names
(quota/capture_json.py), header ``kthrottle.capture.version`` = the schema version, key = the
proxy instance (so one proxy's records stay in order on one partition).

Everything here runs on the capture writer thread, never on the event loop. The producer
(kafka-python) connects to the brokers directly, never through the proxy, and never blocks a
send: ``max_block_ms=0``, and since kafka-python 3.0 has no ``buffer.memory`` the sink bounds the
bytes handed to it and not yet acknowledged (``capture.kafka.buffer_bytes``) itself. Accounting,
per record, so that records taken = records + dropped + write_errors (+ those still in flight):

- ``kthrottle_capture_records_total``: acknowledged by the brokers;
- ``kthrottle_capture_dropped_total``: never handed to the producer because it could not take
  them without waiting: its buffer full, the topic's metadata not known yet, or no connection to
  the brokers (reconnects back off from 1 s to 60 s); as with a full queue, traffic goes on;
- ``kthrottle_capture_write_errors_total``: handed to the producer and then failed (a broker error
  after retries, ``delivery_timeout_ms`` passed, still unsent when the shutdown flush timed out),
  or not encodable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy.capture.writer import Row
from proxy.config import CaptureKafkaConfig, ProxyConfig, capture_bootstrap, default_security_protocol
from proxy.metrics import ProxyMetrics
from proxy.net.tls import client_context
from proxy.ratelog import RateLimitedLog
from quota import capture_json
from quota.capture_schema import CAPTURE_SCHEMA_VERSION, CAPTURE_VERSION_KEY

log = logging.getLogger(__name__)

VERSION_HEADER = (CAPTURE_VERSION_KEY, str(CAPTURE_SCHEMA_VERSION).encode())
TOPIC_ALREADY_EXISTS = 36
_HEADER_OVERHEAD = 70  # record framing, timestamp and the version header, roughly


def compression(kcfg: CaptureKafkaConfig) -> str | None:
    """The producer's ``compression_type``: as configured, else zstd when available, else gzip."""
    if kcfg.compression == "none":
        return None
    if kcfg.compression is not None:
        return kcfg.compression
    from kafka.codec import has_zstd

    return "zstd" if has_zstd() else "gzip"


def security(cfg: ProxyConfig) -> dict[str, Any]:
    """kafka-python security settings from the proxy's own upstream TLS and login (none: plaintext)."""
    out: dict[str, Any] = {"security_protocol": default_security_protocol(cfg)}
    if cfg.upstream_tls.enabled:
        out["ssl_context"] = client_context(cfg.upstream_tls)
    sasl = cfg.upstream_sasl
    if sasl is not None:
        out.update(
            sasl_mechanism=sasl.mechanism,
            sasl_plain_username=sasl.username,
            sasl_plain_password=sasl.secret(),
        )
    return out


def producer_config(
    kcfg: CaptureKafkaConfig, bootstrap: list[str], client_id: str, connect_timeout_s: float
) -> dict[str, Any]:
    """KafkaProducer settings: sends never block, batches are large, delivery is bounded in time."""
    request_timeout = min(30_000, max(500, kcfg.delivery_timeout_ms - kcfg.linger_ms - 100))
    return {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "max_block_ms": 0,
        "linger_ms": kcfg.linger_ms,
        "batch_size": 256 * 1024,
        "compression_type": compression(kcfg),
        "delivery_timeout_ms": kcfg.delivery_timeout_ms,
        "request_timeout_ms": request_timeout,
        "bootstrap_timeout_ms": int(connect_timeout_s * 1000),
        # A topic missing at start is found within seconds once it exists (sends drop until then).
        "metadata_max_age_ms": 10_000,
        "allow_auto_create_topics": False,  # the topic is ours to create (create_topic) or the operator's
    }


def _kafka_producer() -> Callable[..., Any]:
    from kafka import KafkaProducer

    return KafkaProducer  # type: ignore[no-any-return]


def _kafka_admin() -> Callable[..., Any]:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient  # type: ignore[no-any-return]


def _no_auto_create(producer: Any) -> None:
    """kafka-python 3.0.12 does not pass ``allow_auto_create_topics`` on to the cluster metadata it
    requests with, so a broker with ``auto.create.topics.enable`` would create a missing capture
    topic with its defaults; set it where the requests read it, if that is still where it lives."""
    cluster_config = getattr(getattr(producer, "_metadata", None), "config", None)
    if isinstance(cluster_config, dict) and "allow_auto_create_topics" in cluster_config:
        cluster_config["allow_auto_create_topics"] = False


class KafkaSink:
    """A ``proxy.capture.writer.Sink`` producing to ``capture.kafka.topic``."""

    def __init__(
        self,
        kcfg: CaptureKafkaConfig,
        bootstrap: list[str],
        metrics: ProxyMetrics,
        instance: str,
        security: dict[str, Any] | None = None,  # kafka-python TLS/SASL settings (security())
        connect_timeout_s: float = 10.0,
        producer_factory: Callable[..., Any] | None = None,
        admin_factory: Callable[..., Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kcfg = kcfg
        self.bootstrap = bootstrap
        self.metrics = metrics
        self.instance = instance
        self.security = dict(security or {})
        self.connect_timeout_s = connect_timeout_s
        self.close_seconds = kcfg.close_timeout_seconds + 1.0
        self.clock = clock
        self._producer_factory = producer_factory
        self._admin_factory = admin_factory
        self._key = instance.encode()
        self._headers = [VERSION_HEADER]
        self._producer: Any = None
        self._next_attempt = 0.0
        self._backoff = 1.0
        self._ratelog = RateLimitedLog(log)
        # Shared with the producer's sender thread (its callbacks): guarded by _cond.
        self._cond = threading.Condition()
        self._buffered_bytes = 0
        self._in_flight = 0
        self._closed = False

    # --- connection -------------------------------------------------------------------------------

    def _client_config(self) -> dict[str, Any]:
        client_id = f"kthrottle-capture-{self.instance}"
        cfg = producer_config(self.kcfg, self.bootstrap, client_id, self.connect_timeout_s)
        cfg.update(self.security)
        return cfg

    def _connect(self) -> Any:
        """A producer, or None (retried with backoff); blocks this thread for a bounded time only."""
        now = self.clock()
        if self._producer is not None or now < self._next_attempt:
            return self._producer
        try:
            cfg = self._client_config()
            if self.kcfg.create_topic:
                self._create_topic(cfg)
            producer = (self._producer_factory or _kafka_producer())(**cfg)
        except Exception as exc:
            self._next_attempt = self.clock() + self._backoff  # from the end of this attempt
            self._ratelog.log(
                logging.WARNING,
                "capture-kafka-connect",
                "capture: cannot reach the brokers %s for topic %s (%r); records are dropped, "
                "retrying in %.0fs",
                ",".join(self.bootstrap),
                self.kcfg.topic,
                exc,
                self._backoff,
            )
            self._backoff = min(60.0, self._backoff * 2)
            return None
        self._backoff = 1.0
        self._producer = producer
        _no_auto_create(producer)
        self._await_metadata(producer)
        log.info("capture: producing to topic %s on %s", self.kcfg.topic, ",".join(self.bootstrap))
        return producer

    def _create_topic(self, cfg: dict[str, Any]) -> None:
        keep = ("bootstrap_servers", "client_id", "request_timeout_ms", "bootstrap_timeout_ms")
        admin_cfg = {k: v for k, v in cfg.items() if k in keep or k.startswith(("security_", "sasl_"))}
        admin = (self._admin_factory or _kafka_admin())(**admin_cfg)
        try:
            spec = {
                "num_partitions": self.kcfg.partitions,
                "replication_factor": self.kcfg.replication_factor,
                "configs": {"cleanup.policy": "delete", "retention.ms": str(self.kcfg.retention_ms)},
            }
            result = admin.create_topics(
                {self.kcfg.topic: spec}, timeout_ms=int(self.connect_timeout_s * 1000), raise_errors=False
            )
            for topic in result.get("topics", []):
                code = topic.get("error_code", 0)
                if code == 0:
                    log.info("capture: created topic %s", self.kcfg.topic)
                elif code != TOPIC_ALREADY_EXISTS:
                    log.error(
                        "capture: creating topic %s failed (error %d: %s); producing to it anyway",
                        self.kcfg.topic,
                        code,
                        topic.get("error_message"),
                    )
        finally:
            admin.close()

    def _await_metadata(self, producer: Any) -> None:
        """Wait (bounded) until the producer knows the topic's partitions: with ``max_block_ms=0``
        a send before that fails at once. Polls, each call returning immediately."""
        from kafka.errors import KafkaTimeoutError

        deadline = self.clock() + self.connect_timeout_s
        while True:
            try:
                producer.partitions_for(self.kcfg.topic)
                return
            except KafkaTimeoutError:
                if self.clock() >= deadline:
                    log.warning(
                        "capture: no metadata for topic %s yet; dropping until it comes", self.kcfg.topic
                    )
                    return
                time.sleep(0.05)

    # --- the Sink protocol ------------------------------------------------------------------------

    def open(self) -> None:
        self._connect()

    def tick(self) -> None:
        self._connect()

    def write(self, rows: Sequence[Row]) -> None:
        producer = self._connect()
        if producer is None:
            self._dropped(len(rows), "no connection to the brokers")
            return
        from kafka.errors import KafkaTimeoutError

        limit = self.kcfg.buffer_bytes
        topic = self.kcfg.topic
        dropped = failed = 0
        why = ""
        for row in rows:
            try:
                value = capture_json.encode(row)
            except (ValueError, TypeError) as exc:
                failed += 1
                self._error(1, f"record not encodable: {exc!r}")
                continue
            size = len(value) + len(self._key) + _HEADER_OVERHEAD
            with self._cond:
                full = self._buffered_bytes + size > limit
                if not full:
                    self._buffered_bytes += size
                    self._in_flight += 1
            if full:
                dropped += 1
                why = f"producer buffer full ({limit} bytes unacknowledged)"
                continue
            try:
                future = producer.send(topic, value=value, key=self._key, headers=self._headers)
            except KafkaTimeoutError:  # the topic's metadata is not known: sending would wait
                self._release(size)
                dropped += 1
                why = f"no metadata for topic {topic} yet"
                continue
            except Exception as exc:
                self._release(size)
                failed += 1
                self._error(1, f"send failed: {exc!r}")
                continue
            future.add_callback(self._acked, size)
            future.add_errback(self._failed, size)
        if dropped:
            self._dropped(dropped, why)

    def close(self) -> None:
        """Wait up to ``close_timeout_seconds`` for what is in flight, then close; what is still
        unacknowledged then is counted as failed."""
        producer = self._producer
        if producer is None:
            return
        deadline = self.clock() + self.kcfg.close_timeout_seconds
        with self._cond:
            while self._in_flight and self.clock() < deadline:
                self._cond.wait(max(0.0, min(0.1, deadline - self.clock())))
            lost = self._in_flight
            self._closed = True
        try:
            producer.close(timeout=max(0.0, deadline - self.clock()))
        except Exception as exc:  # incomplete batches make kafka-python's close raise
            log.debug("capture: producer close: %r", exc)
        if lost:
            self.metrics.capture_errors.inc(lost)
            log.warning("capture: %d records unacknowledged at shutdown are lost", lost)
        self._producer = None

    # --- accounting -------------------------------------------------------------------------------

    def _release(self, size: int) -> None:
        with self._cond:
            self._buffered_bytes -= size
            self._in_flight -= 1
            self._cond.notify_all()

    def _settle(self, size: int) -> bool:
        """Sender thread: a record's send is over; False once closed (close counted it already)."""
        with self._cond:  # re-entrant: _release takes it again
            if self._closed:
                return False
            self._release(size)
            return True

    def _acked(self, size: int, _metadata: object) -> None:
        """Sender thread: the brokers have the record."""
        if self._settle(size):
            self.metrics.capture_records.inc()

    def _failed(self, size: int, exc: BaseException) -> None:
        """Sender thread: the record's delivery failed."""
        if self._settle(size):
            self._error(1, f"delivery failed: {exc!r}")

    def _error(self, n: int, why: str) -> None:
        self.metrics.capture_errors.inc(n)
        self._ratelog.log(logging.WARNING, "capture-kafka-error", "capture: %d records lost: %s", n, why)

    def _dropped(self, n: int, why: str) -> None:
        self.metrics.capture_dropped.inc(n)
        self._ratelog.log(logging.WARNING, "capture-kafka-drop", "capture: dropped %d records: %s", n, why)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight


def kafka_sink(cfg: ProxyConfig, metrics: ProxyMetrics, instance: str) -> KafkaSink:
    """The Kafka sink as the proxy config asks: its upstream brokers and login unless overridden.

    kafka-python's own INFO lines (connections, IO loop) are left out of the proxy's log unless
    its logger was configured otherwise; its warnings and errors stay.
    """
    kafka_log = logging.getLogger("kafka")
    if kafka_log.level == logging.NOTSET:
        kafka_log.setLevel(logging.WARNING)
    return KafkaSink(
        cfg.capture.kafka,
        capture_bootstrap(cfg),
        metrics,
        instance,
        security=security(cfg),
        connect_timeout_s=cfg.connect_timeout_seconds,
    )
