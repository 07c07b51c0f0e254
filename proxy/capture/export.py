"""`kthrottle capture-export`: the Kafka capture sink's topic back into capture files.

Consumes the topic (all partitions, assigned directly: no consumer group, no committed offsets)
and writes the records with the files sink's own writer (``proxy.capture.writer.CaptureFiles``), so the
output is exactly what ``capture.sink: files`` writes and ``kthrottle tune --input DIR`` reads it
unchanged.

Every message must carry the ``kthrottle.capture.version`` header with the version this
kthrottle reads and a value that decodes to a capture record (quota/capture_json.py). By default
the first message that does not is an error: the export stops, deletes the files it wrote, and
names the partition, offset and problem; versions are never mixed in one output. With
``skip_invalid`` such messages are counted, logged (rate-limited) and left out instead.

It stops after ``max_records`` records, after ``idle_timeout_s`` without a message, or (with
``to_end``) once every partition reached the end it had when the export started; Ctrl-C stops it
too, keeping what was written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.capture.writer import CaptureFiles, Row
from proxy.ratelog import RateLimitedLog
from quota import capture_json
from quota.capture_schema import CAPTURE_SCHEMA_VERSION, CAPTURE_VERSION_KEY

log = logging.getLogger(__name__)

BATCH_RECORDS = 8192
MAX_FILE_BYTES = 128 * 1024 * 1024
_WANT_VERSION = str(CAPTURE_SCHEMA_VERSION).encode()


class ExportError(Exception):
    """The export cannot go on; the message says where and why. Nothing of it is left on disk."""


@dataclass
class ExportResult:
    records: int = 0
    skipped: int = 0
    files: list[Path] = field(default_factory=list)
    partitions: int = 0


def _problem(headers: Any, value: bytes | None) -> tuple[Row | None, str]:
    """The decoded row, or None and why the message is not a capture record we can read."""
    versions = [v for k, v in headers or () if k == CAPTURE_VERSION_KEY]
    if not versions:
        return None, f"no {CAPTURE_VERSION_KEY} header: not a kthrottle capture record"
    if versions[-1] != _WANT_VERSION:
        found = versions[-1].decode(errors="replace") if isinstance(versions[-1], bytes) else versions[-1]
        return (
            None,
            f"capture schema version {found!r}; this kthrottle reads version {CAPTURE_SCHEMA_VERSION}",
        )
    if value is None:
        return None, "no value"
    try:
        return capture_json.decode(value), ""
    except capture_json.CaptureJsonError as exc:
        return None, f"not a capture record of version {CAPTURE_SCHEMA_VERSION}: {exc}"


def _consumer(bootstrap: list[str], from_beginning: bool, security: dict[str, Any]) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="kthrottle-capture-export",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        max_poll_records=BATCH_RECORDS,
        bootstrap_timeout_ms=10_000,
        **security,
    )


def export(
    bootstrap: list[str],
    topic: str,
    output: Path,
    from_beginning: bool = False,
    max_records: int | None = None,
    idle_timeout_s: float = 10.0,
    to_end: bool = False,
    skip_invalid: bool = False,
    security: dict[str, Any] | None = None,
    consumer_factory: Callable[..., Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ExportResult:
    """Consume ``topic`` into capture files under ``output``; raises ``ExportError``."""
    from kafka import TopicPartition
    from kafka.errors import KafkaError

    result = ExportResult()
    try:
        consumer = (consumer_factory or _consumer)(bootstrap, from_beginning, security or {})
    except KafkaError as exc:
        raise ExportError(f"cannot reach {','.join(bootstrap)}: {exc}") from exc
    files = CaptureFiles(output, "export", MAX_FILE_BYTES, float("inf"), on_closed=result.files.append)
    ratelog = RateLimitedLog(log)
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        if not partitions:
            raise ExportError(f"topic {topic} not found on {','.join(bootstrap)}")
        result.partitions = len(partitions)
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        if from_beginning:
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
        ends = consumer.end_offsets(tps) if to_end else {}
        batch: list[Row] = []
        last_message = clock()
        last_progress = clock()
        try:
            while max_records is None or result.records < max_records:
                if to_end and all(consumer.position(tp) >= end for tp, end in ends.items()):
                    break
                idle_left = idle_timeout_s - (clock() - last_message)
                if idle_left <= 0:
                    break
                polled = consumer.poll(timeout_ms=int(min(idle_left, 1.0) * 1000) or 1)
                for messages in polled.values():
                    for msg in messages:
                        row, why = _problem(msg.headers, msg.value)
                        if row is None:
                            where = f"topic {topic} partition {msg.partition} offset {msg.offset}"
                            if not skip_invalid:
                                raise ExportError(f"{where}: {why}")
                            result.skipped += 1
                            ratelog.log(logging.WARNING, "export-skip", "skipped %s: %s", where, why)
                            continue
                        batch.append(row)
                        result.records += 1
                        if max_records is not None and result.records >= max_records:
                            break
                    if max_records is not None and result.records >= max_records:
                        break
                if polled:
                    last_message = clock()
                if len(batch) >= BATCH_RECORDS:
                    files.write(batch)
                    batch = []
                if clock() - last_progress >= 10:
                    last_progress = clock()
                    log.info("capture-export: %d records so far (%d skipped)", result.records, result.skipped)
        except KeyboardInterrupt:
            log.warning("capture-export: interrupted; keeping the %d records read so far", result.records)
        if batch:
            files.write(batch)
        files.close()
    except BaseException as exc:
        files.abandon(delete=True)
        for path in result.files:
            path.unlink(missing_ok=True)
        result.files.clear()
        if isinstance(exc, KafkaError):
            raise ExportError(f"reading topic {topic} failed: {exc!r}") from exc
        raise
    finally:
        consumer.close()
    return result
