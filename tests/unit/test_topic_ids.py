"""Topics addressed by name or by id, in every Produce and Fetch version the proxy decodes: the
topic-partition quotas (KIP-1010) and the capture see names, and an id nobody has shown the proxy
yet is looked up, counted, and charged once named, never skipped."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.versions import codec_versions
from proxy.capture.rows import CaptureDraft
from proxy.metrics import ProxyMetrics
from proxy.shared.throttling import QuotaEnforcer
from proxy.shared.topic_names import TopicNames
from quota.config import QuotaConfig
from tests.unit.test_messages import _batch

TOPIC = "orders"
TOPIC_ID = uuid.uuid4().bytes
PRODUCE_VERSIONS = range(*(lambda r: (r[0], r[1] + 1))(codec_versions(ApiKey.PRODUCE) or (0, -1)))
FETCH_VERSIONS = range(*(lambda r: (r[0], r[1] + 1))(codec_versions(ApiKey.FETCH) or (0, -1)))
BY_ID_FROM = 13  # Produce v13 and Fetch v13 name topics by id only


def _produce_request(version: int, records: bytes) -> dict[str, Any]:
    topic: dict[str, Any] = {"partition_data": [{"index": 2, "records": records}]}
    topic.update({"topic_id": TOPIC_ID} if version >= BY_ID_FROM else {"name": TOPIC})
    return {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [topic]}


def _fetch_response(version: int, records: bytes) -> dict[str, Any]:
    partition = {
        "partition_index": 1,
        "error_code": 0,
        "high_watermark": 10,
        "last_stable_offset": 10,
        "log_start_offset": 0,
        "aborted_transactions": [],
        "preferred_read_replica": -1,
        "records": records,
    }
    topic: dict[str, Any] = {"partitions": [partition]}
    topic.update({"topic_id": TOPIC_ID} if version >= BY_ID_FROM else {"topic": TOPIC})
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [topic]}


def _partitions(version: int, records: bytes) -> list[messages.PartitionBytes]:
    return messages.produce_request_partitions(_decoded_produce(version, records))


def _decoded_produce(version: int, records: bytes) -> dict[str, Any]:
    wire = messages.encode(ApiKey.PRODUCE, version, _produce_request(version, records), response=False)
    return messages.decode_request(ApiKey.PRODUCE, version, wire)


def _decoded_fetch(version: int, records: bytes) -> dict[str, Any]:
    wire = messages.encode(ApiKey.FETCH, version, _fetch_response(version, records), response=True)
    return messages.decode_response(ApiKey.FETCH, version, wire)


def _metadata(pairs: list[tuple[bytes, str]]) -> dict[str, Any]:
    topics = [
        {"error_code": 0, "name": name, "topic_id": tid, "is_internal": False, "partitions": []}
        for tid, name in pairs
    ]
    wire = messages.encode(ApiKey.METADATA, 12, {"brokers": [], "topics": topics}, response=True)
    return messages.decode_response(ApiKey.METADATA, 12, wire)


def test_every_version_is_covered() -> None:
    assert PRODUCE_VERSIONS[0] <= 3 and PRODUCE_VERSIONS[-1] >= BY_ID_FROM
    assert FETCH_VERSIONS[0] <= 4 and FETCH_VERSIONS[-1] >= BY_ID_FROM


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_partitions_name_their_topic_or_its_id(version: int) -> None:
    records = _batch(5)
    (part,) = messages.produce_request_partitions(_decoded_produce(version, records))
    assert part.topic == (TOPIC_ID if version >= BY_ID_FROM else TOPIC)
    assert (part.partition, part.size, part.record_count) == (2, len(records), 3)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_partitions_name_their_topic_or_its_id(version: int) -> None:
    records = _batch(-1)
    (part,) = messages.fetch_response_partitions(_decoded_fetch(version, records))
    # Fetch v4-12 calls the name "topic" (Produce calls it "name"); v13+ sends only the id.
    assert part.topic == (TOPIC_ID if version >= BY_ID_FROM else TOPIC)
    assert (part.partition, part.size) == (1, len(records))


def test_metadata_pairs_skip_errors_and_zero_ids() -> None:
    other = uuid.uuid4().bytes
    body = _metadata([(TOPIC_ID, TOPIC), (bytes(16), "old-style"), (other, "two")])
    body["topics"][2]["error_code"] = 3
    assert messages.metadata_topic_ids(body) == [(TOPIC_ID, TOPIC)]


def test_names_follow_a_topic_deleted_and_re_created() -> None:
    names = TopicNames()
    names.learn([(TOPIC_ID, TOPIC)])
    assert names.name(TOPIC_ID) == TOPIC
    new_id = uuid.uuid4().bytes
    names.learn([(new_id, TOPIC)])
    assert names.name(new_id) == TOPIC and names.name(TOPIC_ID) is None
    names.learn([(uuid.uuid4().bytes, "other")], every_topic=True)  # orders deleted since
    assert names.name(new_id) is None and len(names) == 1
    names.forget(uuid.uuid4().bytes)  # an id never seen: nothing happens
    assert len(names) == 1


def test_names_stay_bounded_by_the_least_recently_shown() -> None:
    names = TopicNames(max_topics=3)
    ids = [uuid.uuid4().bytes for _ in range(4)]
    names.learn([(ids[0], "a"), (ids[1], "b"), (ids[2], "c")])
    names.learn([(ids[0], "a")])  # shown again: now the most recent
    names.learn([(ids[3], "d")])
    assert len(names) == 3 and names.name(ids[1]) is None
    assert [names.name(i) for i in (ids[0], ids[2], ids[3])] == ["a", "c", "d"]


# --- quotas: topic-partition byte rates by name, whatever the version --------------------------


def _enforcer(topic_rate: dict[str, float], now: list[float]) -> tuple[QuotaEnforcer, ProxyMetrics]:
    cfg = QuotaConfig.model_validate({"topics": {TOPIC: topic_rate}})
    metrics = ProxyMetrics()
    return QuotaEnforcer(cfg, metrics, clock=lambda: now[0]), metrics


def _topic_ids_counted(metrics: ProxyMetrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value("kthrottle_topic_ids_total", {"outcome": outcome})
    return value or 0.0


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_topic_quota_holds_by_id_and_by_name(version: int) -> None:
    now = [100.0]
    enforcer, metrics = _enforcer({"producer.byte.rate": 1000}, now)
    enforcer.topic_names.learn(messages.metadata_topic_ids(_metadata([(TOPIC_ID, TOPIC)])))
    records = _batch(-1) * 400  # 46 KB against 1000 B/s per partition over an 11 s window
    charge = enforcer.on_produce("u", "c", 100, _partitions(version, records))
    assert charge.throttle_ms > 0, "the topic quota was not applied"
    assert charge.partitions[0].topic == TOPIC
    assert _topic_ids_counted(metrics, "unresolved") == 0


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_topic_quota_holds_by_id_and_by_name(version: int) -> None:
    now = [100.0]
    enforcer, _metrics = _enforcer({"consumer.byte.rate": 1000}, now)
    enforcer.topic_names.learn([(TOPIC_ID, TOPIC)])
    charge = enforcer.on_fetch_response("u", "c", 5000, _decoded_fetch(version, _batch(-1) * 400), None)
    assert charge.throttle_ms > 0, "the topic quota was not applied"
    assert charge.partitions[0].topic == TOPIC


def test_an_unknown_id_is_looked_up_counted_and_charged_once_named() -> None:
    now = [100.0]
    enforcer, metrics = _enforcer({"producer.byte.rate": 1000}, now)
    lookups: list[int] = []
    enforcer.lookup_topic_ids = lambda: lookups.append(1)
    records = _batch(-1) * 400
    first = enforcer.on_produce("u", "c", 100, _partitions(13, records))
    # Not known yet: nothing to throttle on now, but counted and a lookup asked for.
    assert first.throttle_ms == 0 and lookups
    assert _topic_ids_counted(metrics, "unresolved") == 1
    enforcer.topic_names.learn([(TOPIC_ID, TOPIC)], every_topic=True)
    enforcer.names_found()
    assert _topic_ids_counted(metrics, "resolved") == 1
    assert first.partitions[0].topic == TOPIC  # the capture of that request sees the name too
    # The waiting bytes were charged: the next request is throttled for both.
    now[0] += 0.01
    second = enforcer.on_produce("u", "c", 100, _partitions(13, _batch(-1)))
    assert second.throttle_ms > 0


def test_an_id_the_cluster_does_not_know_is_counted_not_dropped_silently() -> None:
    now = [100.0]
    enforcer, metrics = _enforcer({"producer.byte.rate": 1000}, now)
    enforcer.on_produce("u", "c", 100, _partitions(13, _batch(-1)))
    enforcer.topic_names.learn([(uuid.uuid4().bytes, "something-else")], every_topic=True)
    enforcer.names_found()
    assert _topic_ids_counted(metrics, "unknown") == 1


def test_capture_rows_show_names_once_known() -> None:
    names = TopicNames()
    draft = CaptureDraft(0, 100)
    parts = messages.produce_request_partitions(_decoded_produce(13, _batch(7)))
    draft.on_produce(parts, 0, 0)
    assert draft.unnamed()
    names.learn([(TOPIC_ID, TOPIC)])
    names.rename(draft.parts)
    assert not draft.unnamed()
    row = draft.row("i", 1, 1, "peer", "User:a", "c", ApiKey.PRODUCE, 13, 0, 1.0, False)
    assert row[11][0][0] == TOPIC


# --- the proxy's own lookup: one at a time, then what waited is charged and written ------------


class _Catalog:
    """Answers the lookup's Metadata request as the cluster would (or fails, as a dead one)."""

    def __init__(self, pairs: list[tuple[bytes, str]], failures: int = 0) -> None:
        self.pairs = pairs
        self.failures = failures
        self.asked = 0

    async def topic_ids(self) -> list[tuple[bytes, str]]:
        self.asked += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("no broker answered")
        return self.pairs


async def _settled(lookup: Any) -> None:
    import asyncio

    async def idle() -> None:
        while lookup.running:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(idle(), 5)


async def test_lookup_runs_once_for_many_requests_then_charges_and_writes() -> None:
    from proxy.shared.topic_lookup import TopicIdLookup

    now = [100.0]
    enforcer, metrics = _enforcer({"producer.byte.rate": 1000}, now)
    catalog = _Catalog([(TOPIC_ID, TOPIC)])
    lookup = TopicIdLookup(catalog, enforcer.topic_names, enforcer, min_interval=0.01)  # type: ignore[arg-type]
    enforcer.lookup_topic_ids = lookup.wanted
    charges = [enforcer.on_produce("u", "c", 100, _partitions(13, _batch(-1) * 100)) for _ in range(5)]
    written: list[str] = []
    lookup.after(lambda: written.append(str(charges[0].partitions[0].topic)))
    assert lookup.running
    await _settled(lookup)
    assert catalog.asked == 1, "five requests with the same unknown id asked more than once"
    assert written == [TOPIC]
    assert _topic_ids_counted(metrics, "resolved") == 5
    assert enforcer.produce.partitions, "the waiting bytes were not charged to the topic partition"


async def test_lookup_retries_a_failure_then_gives_up_counting() -> None:
    from proxy.shared.topic_lookup import ATTEMPTS, TopicIdLookup

    now = [100.0]
    enforcer, metrics = _enforcer({"producer.byte.rate": 1000}, now)
    retried = _Catalog([(TOPIC_ID, TOPIC)], failures=1)
    lookup = TopicIdLookup(retried, enforcer.topic_names, enforcer, min_interval=0.001)  # type: ignore[arg-type]
    enforcer.lookup_topic_ids = lookup.wanted
    enforcer.on_produce("u", "c", 100, _partitions(13, _batch(-1)))
    await _settled(lookup)
    assert retried.asked == 2 and _topic_ids_counted(metrics, "resolved") == 1

    dead = _Catalog([], failures=ATTEMPTS)
    enforcer.topic_names.learn([], every_topic=True)
    lookup = TopicIdLookup(dead, enforcer.topic_names, enforcer, min_interval=0.001)  # type: ignore[arg-type]
    enforcer.lookup_topic_ids = lookup.wanted
    enforcer.on_produce("u", "c", 100, _partitions(13, _batch(-1)))
    await _settled(lookup)
    assert dead.asked == ATTEMPTS and _topic_ids_counted(metrics, "unknown") == 1
