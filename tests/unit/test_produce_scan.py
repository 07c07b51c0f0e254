"""protocol/produce_scan.py reads what the schema walker reads, at every Produce version, and
refuses what the walker refuses."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.produce_scan import produce_partitions
from protocol.schema import SchemaError
from protocol.versions import codec_versions
from tests.unit.test_messages import _batch

VERSIONS = codec_versions(ApiKey.PRODUCE)
assert VERSIONS is not None
ALL = list(range(VERSIONS[0], VERSIONS[1] + 1))

_LEGACY = (
    # a magic-1 message set entry: offset, size, crc, magic 1, attributes, timestamp, key, value
    (0).to_bytes(8, "big")
    + (22).to_bytes(4, "big")
    + bytes(4)
    + b"\x01\x00"
    + bytes(8)
    + b"\xff" * 4
    + bytes(4)
)


def _request(version: int, seed: int) -> dict[str, Any]:
    rnd = random.Random(seed)
    record_sets = [None, b"", _batch(-1), _batch(4242) + _batch(77), _batch(9) + _batch(-1) * 2, _LEGACY]
    topics = []
    for t in range(rnd.randint(1, 3)):
        parts = [
            {"index": rnd.randint(0, 50), "records": rnd.choice(record_sets)}
            for _ in range(rnd.randint(1, 4))
        ]
        topics.append(
            {"name": f"topic-{t}-é", "topic_id": uuid.UUID(int=seed * 7 + t).bytes, "partition_data": parts}
        )
    txn = rnd.choice([None, "", "txn-1"])
    return {"transactional_id": txn, "acks": -1, "timeout_ms": 1000, "topic_data": topics}


def _as_tuples(parts: list[messages.PartitionBytes]) -> list[tuple[Any, ...]]:
    return [(p.topic, p.partition, p.size, p.record_count, sorted(p.producer_ids)) for p in parts]


@pytest.mark.parametrize("version", ALL)
def test_the_scan_reads_what_the_walker_reads(version: int) -> None:
    for seed in range(12):
        wire = bytes(messages.encode(ApiKey.PRODUCE, version, _request(version, seed), response=False))
        walked = messages.produce_request_partitions(messages.decode_request(ApiKey.PRODUCE, version, wire))
        assert _as_tuples(produce_partitions(version, wire)) == _as_tuples(walked), (version, seed)
        assert _as_tuples(produce_partitions(version, memoryview(wire))) == _as_tuples(walked)


@pytest.mark.parametrize("version", [ALL[0], 9, ALL[-1]])
def test_a_request_the_walker_refuses_the_scan_refuses(version: int) -> None:
    wire = bytes(messages.encode(ApiKey.PRODUCE, version, _request(version, 3), response=False))
    for cut in range(len(wire)):  # every truncation
        try:
            messages.decode_request(ApiKey.PRODUCE, version, wire[:cut])
        except (SchemaError, ValueError, IndexError):
            with pytest.raises(SchemaError):
                produce_partitions(version, wire[:cut])
    with pytest.raises(SchemaError):
        produce_partitions(version, wire + b"\x00")  # trailing garbage
