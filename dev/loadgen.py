"""Load-generator pieces for the benchmarks: raw Kafka requests, process CPU readings.

For the benchmarks, and for tests of hostile clients (frames no real client sends); the
acceptance tests otherwise use real clients.
"""

from __future__ import annotations

import asyncio
import os
import time

from protocol import messages
from protocol.frames import SIZE, RequestHeader, encode_request_header


def record_batch(value: bytes, timestamp_ms: int | None = None) -> bytes:
    """A v2 record batch (no producer id, uncompressed) of one record carrying ``value``."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    when = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    builder.append(0, timestamp=when, key=None, value=value, headers=[])
    return bytes(builder.build())


def produce_request(topic: str, correlation_id: int, payload: bytes, client_id: str = "bench") -> bytearray:
    """One framed Produce v9 request (acks=1) carrying a 1-record batch for partition 0."""
    body = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": record_batch(payload)}]}],
    }
    frame = encode_request_header(RequestHeader(0, 9, correlation_id, client_id, 0))
    frame += messages.encode(0, 9, body, response=False)
    return bytearray(SIZE.pack(len(frame)) + bytes(frame))


CORRELATION_OFFSET = 8  # size (4), api key (2), api version (2), then the correlation id


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def open_many(host: str, port: int, count: int) -> tuple[list[asyncio.StreamWriter], int, float]:
    """Open ``count`` connections at once (at most 500 handshakes in flight); returns the
    writers, the errors, and the seconds it took."""
    gate = asyncio.Semaphore(500)
    writers: list[asyncio.StreamWriter] = []
    errors = 0

    async def one() -> None:
        nonlocal errors
        async with gate:
            try:
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
                writers.append(writer)
            except (OSError, TimeoutError):
                errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    return writers, errors, time.perf_counter() - began
