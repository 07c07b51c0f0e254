"""Every message the proxy decodes, at every version the codec covers, survives a round trip."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.api_keys import api_name
from protocol.schema import UNKNOWN_TAGS, message_codec, message_schema
from protocol.versions import DECODED_APIS, codec_versions
from tests.unit.schema_strategies import struct_strategy

CASES = [
    (f"{api_name(key)}{kind}", version)
    for key in sorted(DECODED_APIS)
    for kind in ("Request", "Response")
    for version in range(codec_versions(key)[0], codec_versions(key)[1] + 1)  # type: ignore[index]
]


def _normalise(value: Any) -> Any:
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


@pytest.mark.parametrize(("name", "version"), CASES, ids=[f"{n}-v{v}" for n, v in CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(name: str, version: int, data: st.DataObject) -> None:
    schema = message_schema(name)
    obj = data.draw(struct_strategy(schema.fields, version, schema.is_flexible(version)))
    codec = message_codec(name, version)
    out = bytearray()
    codec.write(out, obj)
    decoded, end = codec.read(memoryview(bytes(out)), 0)
    assert end == len(out)
    assert _normalise(decoded) == _normalise(obj)
    again = bytearray()
    codec.write(again, decoded)
    assert again == out  # re-encoding what we decoded is byte-exact, unknown tags included


def test_covers_every_decoded_api() -> None:
    names = {n for n, _ in CASES}
    for key in DECODED_APIS:
        assert f"{api_name(key)}Request" in names
        assert f"{api_name(key)}Response" in names


def test_unknown_tags_survive_in_nested_structs() -> None:
    codec = message_codec("MetadataResponse", 12)
    obj = {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": 1, "host": "b1", "port": 9092, "rack": None, UNKNOWN_TAGS: {77: b"\x01\x02"}}
        ],
        "cluster_id": "c",
        "controller_id": 1,
        "topics": [],
        UNKNOWN_TAGS: {5: b"xyz"},
    }
    out = bytearray()
    codec.write(out, obj)
    decoded, _ = codec.read(memoryview(bytes(out)), 0)
    assert decoded[UNKNOWN_TAGS] == {5: b"xyz"}
    assert decoded["brokers"][0][UNKNOWN_TAGS] == {77: b"\x01\x02"}
