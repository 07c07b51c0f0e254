"""The Kafka capture sink without a broker: the JSON record codec (round trip to the Arrow schema and
the files sink's Parquet), the sink's accounting when the producer cannot take records, the
export's refusal of other schema versions, and the config defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.capture.export import ExportError, export
from proxy.capture.kafka_sink import VERSION_HEADER, KafkaSink, producer_config
from proxy.capture.writer import CaptureFiles, CaptureWriter
from proxy.config import CaptureConfig, CaptureKafkaConfig, ConfigError, capture_bootstrap, parse_config
from proxy.metrics import ProxyMetrics
from quota import capture_json
from quota.capture_schema import (
    CAPTURE_SCHEMA_VERSION,
    CAPTURE_VERSION_KEY,
    FIELD_NAMES,
    FIELDS,
    PARTITION_FIELDS,
)

# --- the JSON codec ------------------------------------------------------------------------------

_SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats(allow_nan=False, allow_infinity=False),
    "bool": st.booleans(),
    "string": st.text(max_size=16),
}
_PARTITION = st.tuples(*(_SCALARS[f.type] for f in PARTITION_FIELDS))


def _strategy(type_name: str) -> st.SearchStrategy[Any]:
    if type_name == "list<partition>":
        return st.lists(_PARTITION, max_size=4)
    if type_name.startswith("list<"):
        return st.lists(_SCALARS[type_name[5:-1]], max_size=4)
    return _SCALARS[type_name]


# Built from the schema itself, so a new field is covered without touching this test.
ROWS = st.tuples(*(_strategy(f.type) for f in FIELDS))


def _row(i: int = 0, **changes: Any) -> tuple[Any, ...]:
    values = {
        "ts_ms": 1_700_000_000_000 + i,
        "proxy": "proxy-a",
        "node": 1,
        "conn": 7,
        "client_addr": "127.0.0.1:5000",
        "principal": "ANONYMOUS",
        "client_id": "c-é",
        "api_key": 0,
        "api_version": 11,
        "request_bytes": 1200 + i,
        "response_bytes": 60,
        "partitions": [("t", 0, 900, 3), ("t", 1, 100, -1)],
        "producer_ids": [42],
        "new_producer_ids": 1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": 0,
        "decided_throttle_ms": 5,
        "broker_throttle_ms": -1,
        "upstream_ms": 1.25,
        "dry_run": False,
    }
    values.update(changes)
    return tuple(values[name] for name in FIELD_NAMES)


def test_the_value_is_a_compact_object_with_exactly_the_schema_names() -> None:
    value = capture_json.encode(_row())
    assert b" " not in value.replace(b"c-\xc3\xa9", b"")
    obj = json.loads(value)
    assert list(obj) == list(FIELD_NAMES)
    assert obj["partitions"][0] == {"topic": "t", "partition": 0, "bytes": 900, "records": 3}
    assert obj["client_id"] == "c-é"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROWS, min_size=1, max_size=5))
def test_json_round_trip_through_the_arrow_schema(tmp_path: Path, rows: list[tuple[Any, ...]]) -> None:
    decoded = [capture_json.decode(capture_json.encode(r)) for r in rows]
    assert decoded == [
        tuple(list(map(tuple, v)) if n == "partitions" else v for n, v in zip(FIELD_NAMES, r, strict=True))
        for r in rows
    ]
    out = tmp_path / f"rt-{abs(hash(tuple(map(repr, rows))))}"
    files = CaptureFiles(out, "t", 1 << 30, 3600.0)
    files.write(decoded)  # the files sink's own writer takes decoded rows as they are
    files.close()
    (path,) = out.glob("*.parquet")
    table = pq.read_table(path)
    assert table.schema.metadata[CAPTURE_VERSION_KEY.encode()] == str(CAPTURE_SCHEMA_VERSION).encode()
    back = table.to_pylist()
    for want, got in zip(rows, back, strict=True):
        for f, value in zip(FIELDS, want, strict=True):
            if f.name == "partitions":
                names = [p.name for p in PARTITION_FIELDS]
                assert got["partitions"] == [dict(zip(names, p, strict=True)) for p in value]
            else:
                assert got[f.name] == value, f.name


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("client_id"), "missing client_id"),
        (lambda o: o.update(extra=1), "unknown extra"),
        (lambda o: o.update(api_key="0"), "api_key"),
        (lambda o: o.update(api_key=2**15), "out of range for int16"),
        (lambda o: o.update(dry_run=0), "dry_run"),
        (lambda o: o.update(partitions=[{"topic": "t", "partition": 0, "bytes": 1}]), "missing records"),
        (lambda o: o.update(error_codes=[True]), "error_codes[0]"),
    ],
)
def test_decode_names_the_bad_field(mutate: Any, message: str) -> None:
    obj = json.loads(capture_json.encode(_row()))
    mutate(obj)
    with pytest.raises(capture_json.CaptureJsonError, match=message.replace("[", r"\[").replace("]", r"\]")):
        capture_json.decode(json.dumps(obj).encode())


def test_decode_refuses_what_is_not_a_json_object() -> None:
    for value in (b"\xff", b"[1]", b"{"):
        with pytest.raises(capture_json.CaptureJsonError):
            capture_json.decode(value)


# --- the sink's accounting ------------------------------------------------------------------------


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.errbacks: list[Any] = []

    def add_callback(self, f: Any, *args: Any) -> FakeFuture:
        self.callbacks.append((f, args))
        return self

    def add_errback(self, f: Any, *args: Any) -> FakeFuture:
        self.errbacks.append((f, args))
        return self

    def succeed(self) -> None:
        for f, args in self.callbacks:
            f(*args, "metadata")

    def fail(self, exc: BaseException) -> None:
        for f, args in self.errbacks:
            f(*args, exc)


class FakeProducer:
    """Takes records and never completes them unless told: a broker that is slow to acknowledge."""

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.sent: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]] = []
        self.futures: list[FakeFuture] = []
        self.metadata = True
        self.closed = False

    def partitions_for(self, topic: str) -> set[int]:
        from kafka.errors import KafkaTimeoutError

        if not self.metadata:
            raise KafkaTimeoutError("no metadata")
        return {0}

    def send(self, topic: str, value: bytes, key: bytes, headers: list[tuple[str, bytes]]) -> FakeFuture:
        from kafka.errors import KafkaTimeoutError

        if not self.metadata:
            raise KafkaTimeoutError("Failed to update metadata after 0.0 secs.")
        self.sent.append((topic, value, key, headers))
        self.futures.append(FakeFuture())
        return self.futures[-1]

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


def _sink(metrics: ProxyMetrics, producer: FakeProducer | None = None, **kafka: Any) -> KafkaSink:
    kcfg = CaptureKafkaConfig(create_topic=False, close_timeout_seconds=0, **kafka)

    def factory(**config: Any) -> FakeProducer:
        assert producer is not None
        producer.config = config
        return producer

    return KafkaSink(kcfg, ["127.0.0.1:1"], metrics, "proxy-a", connect_timeout_s=0, producer_factory=factory)


def _sample(metrics: ProxyMetrics, name: str) -> float:
    return metrics.registry.get_sample_value(name) or 0.0


def test_records_the_producer_cannot_buffer_are_dropped_and_counted() -> None:
    metrics = ProxyMetrics()
    producer = FakeProducer()
    sink = _sink(metrics, producer, buffer_bytes=64 * 1024)
    sink.open()
    assert producer.config["max_block_ms"] == 0  # a send never waits
    rows = [_row(i) for i in range(1000)]
    sink.write(rows)
    taken = len(producer.sent)
    per_record = len(capture_json.encode(rows[0])) + len(b"proxy-a") + 70
    assert taken == 64 * 1024 // per_record  # the bound, in bytes handed over and not acknowledged
    assert _sample(metrics, "kthrottle_capture_dropped_total") == 1000 - taken
    assert sink.in_flight == taken

    # What the producer took is on the topic as the schema says: key, header, value.
    topic, value, key, headers = producer.sent[0]
    assert (topic, key, headers) == ("__kthrottle_capture", b"proxy-a", [VERSION_HEADER])
    assert VERSION_HEADER[1] == str(CAPTURE_SCHEMA_VERSION).encode()
    assert VERSION_HEADER[0] == "kthrottle.capture.version"
    assert capture_json.decode(value) == capture_json.decode(capture_json.encode(rows[0]))

    # Acknowledgements free the buffer; failed deliveries are write errors.
    for future in producer.futures[:10]:
        future.succeed()
    for future in producer.futures[10:15]:
        future.fail(RuntimeError("NotLeaderForPartition"))
    assert _sample(metrics, "kthrottle_capture_records_total") == 10
    assert _sample(metrics, "kthrottle_capture_write_errors_total") == 5
    sink.write([_row(1000 + i) for i in range(20)])
    assert len(producer.sent) == taken + 15  # room for as many as were completed
    assert _sample(metrics, "kthrottle_capture_dropped_total") == 1000 - taken + 5

    # Shutdown with records still unacknowledged: bounded, and they count as write errors.
    in_flight = sink.in_flight
    sink.close()
    assert producer.closed
    assert _sample(metrics, "kthrottle_capture_write_errors_total") == 5 + in_flight
    total = sum(
        _sample(metrics, f"kthrottle_capture_{m}_total") for m in ("records", "dropped", "write_errors")
    )
    assert total == 1020  # every record accounted for exactly once
    producer.futures[-1].succeed()  # a late acknowledgement is not counted twice
    assert _sample(metrics, "kthrottle_capture_records_total") == 10


def test_no_metadata_or_no_broker_drops_without_waiting() -> None:
    metrics = ProxyMetrics()
    producer = FakeProducer()
    producer.metadata = False
    sink = _sink(metrics, producer)
    sink.open()  # waits at most connect_timeout_s (0 here) for the topic's metadata
    sink.write([_row(i) for i in range(5)])
    assert _sample(metrics, "kthrottle_capture_dropped_total") == 5
    assert sink.in_flight == 0

    clock = [100.0]
    calls: list[int] = []

    def unreachable(**_config: Any) -> Any:
        from kafka.errors import KafkaTimeoutError

        calls.append(1)
        raise KafkaTimeoutError("Unable to bootstrap")  # what kafka-python raises for no broker

    down = KafkaSink(
        CaptureKafkaConfig(create_topic=False),
        ["127.0.0.1:1"],
        metrics,
        "proxy-a",
        producer_factory=unreachable,
        clock=lambda: clock[0],
    )
    down.open()
    down.write([_row(i) for i in range(3)])  # within the backoff: no new attempt
    assert calls == [1]
    assert _sample(metrics, "kthrottle_capture_dropped_total") == 8
    clock[0] += 1.5
    down.write([_row(0)])
    assert calls == [1, 1]
    down.close()


def test_the_writer_thread_feeds_the_kafka_sink_and_flushes_on_close(tmp_path: Path) -> None:
    metrics = ProxyMetrics()
    producer = FakeProducer()
    sink = _sink(metrics, producer)
    cfg = CaptureConfig(enabled=True, sink="kafka", directory=tmp_path / "unused", instance="proxy-a")
    writer = CaptureWriter(cfg, metrics, start=False, sink=sink)
    for i in range(50):
        writer.record(_row(i))
    writer.start()
    writer.close()
    assert len(producer.sent) == 50 and producer.closed
    assert not (tmp_path / "unused").exists()  # the kafka sink writes no files


# --- the export's refusal of other versions -------------------------------------------------------


class FakeRecord:
    def __init__(self, offset: int, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self.partition, self.offset, self.value, self.headers = 0, offset, value, headers


class FakeConsumer:
    def __init__(self, records: list[FakeRecord]) -> None:
        self.records = records
        self.closed = False

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}

    def assign(self, tps: Any) -> None: ...
    def seek_to_beginning(self, *tps: Any) -> None: ...
    def seek_to_end(self, *tps: Any) -> None: ...

    def poll(self, timeout_ms: int) -> dict[str, list[FakeRecord]]:
        records, self.records = self.records, []
        return {"tp": records} if records else {}

    def close(self) -> None:
        self.closed = True


def _export(tmp_path: Path, records: list[FakeRecord], **kw: Any) -> Any:
    return export(
        ["127.0.0.1:1"],
        "cap",
        tmp_path / "out",
        from_beginning=True,
        idle_timeout_s=0.05,
        consumer_factory=lambda *_a: FakeConsumer(records),
        **kw,
    )


def test_export_refuses_another_schema_version_and_leaves_nothing(tmp_path: Path) -> None:
    good = [FakeRecord(i, capture_json.encode(_row(i)), [VERSION_HEADER]) for i in range(3)]
    result = _export(tmp_path, good)
    assert result.records == 3 and len(result.files) == 1
    assert [r["ts_ms"] for r in pq.read_table(result.files[0]).to_pylist()] == [_row(i)[0] for i in range(3)]

    for bad, why in [
        (FakeRecord(3, capture_json.encode(_row(3)), [(CAPTURE_VERSION_KEY, b"2")]), "version '2'"),
        (FakeRecord(3, capture_json.encode(_row(3)), []), "no kthrottle.capture.version header"),
        (FakeRecord(3, b'{"ts_ms": 1}', [VERSION_HEADER]), "missing"),
    ]:
        out = tmp_path / f"bad-{len(why)}"
        with pytest.raises(ExportError, match=f"partition 0 offset 3: .*{why}"):
            _export(out, [*good, bad])
        assert not list((out / "out").iterdir())  # nothing half-written
        skipped = _export(out, [*good, bad], skip_invalid=True)
        assert (skipped.records, skipped.skipped) == (3, 1)


# --- config --------------------------------------------------------------------------------------

_GATEWAY = """
gateway:
  bootstrap_port: 9092
  upstream_bootstrap: ["10.0.0.1:9092", "10.0.0.2:9092"]
"""


def test_kafka_sink_defaults_come_from_the_proxy_config() -> None:
    cfg = parse_config(_GATEWAY + "capture: {enabled: true, sink: kafka}\n")
    kafka = cfg.capture.kafka
    assert (kafka.topic, kafka.create_topic, kafka.partitions, kafka.replication_factor) == (
        "__kthrottle_capture",
        True,
        3,
        -1,
    )
    assert capture_bootstrap(cfg) == ["10.0.0.1:9092", "10.0.0.2:9092"]
    pc = producer_config(kafka, capture_bootstrap(cfg), "x", 10)
    assert pc["compression_type"] in ("zstd", "gzip") and pc["max_block_ms"] == 0
    assert parse_config(_GATEWAY).capture.sink == "files"


def test_the_capture_producer_may_not_go_through_the_proxy() -> None:
    with pytest.raises(ConfigError, match=r"capture\.kafka\.bootstrap_servers: .* own listener"):
        parse_config(
            _GATEWAY
            + "capture: {enabled: true, sink: kafka, kafka: {bootstrap_servers: ['127.0.0.1:9092']}}\n"
        )
    with pytest.raises(ConfigError, match=r"capture\.kafka\.topic"):
        parse_config(_GATEWAY + "capture: {sink: kafka, kafka: {topic: 'no spaces'}}\n")
