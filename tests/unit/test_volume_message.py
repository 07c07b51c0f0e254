"""The volume usage message (Strimzi proposal): exact JSON, round trips, and decode errors by field."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.volume_message import (
    MAX_SNAPSHOT_MS,
    LimitDefinition,
    LimitType,
    VolumeDetails,
    VolumeMessageError,
    VolumeSnapshot,
    decode,
    decode_key,
    encode_key,
    format_snapshot_at,
    parse_snapshot_at,
)

T0 = 1_714_564_800_250  # 2024-05-01T12:00:00.250Z
SOFT = LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10)
HARD = LimitDefinition(LimitType.MIN_FREE_BYTES, 5_000)


def sample() -> VolumeSnapshot:
    return VolumeSnapshot(
        T0,
        SOFT,
        HARD,
        (
            VolumeDetails("/var/lib/kafka/data-0", 1_000_000, 200_000),
            VolumeDetails(
                "/var/lib/kafka/data-1",
                2_000_000,
                1_500_000,
                soft_limit=LimitDefinition(LimitType.CONSUMED_SPACE, 1_800_000),
            ),
        ),
    )


SAMPLE_JSON = (
    '{"SnapshotAt":"2024-05-01T12:00:00.250Z",'
    '"HardLimit":{"type":"MinFreeBytes","level":5000},'
    '"SoftLimit":{"type":"MinFreePercentage","level":10},'
    '"Volumes":[{"VolumeName":"/var/lib/kafka/data-0","Capacity":1000000,"Consumed":200000},'
    '{"VolumeName":"/var/lib/kafka/data-1","Capacity":2000000,"Consumed":1500000,'
    '"SoftLimit":{"type":"ConsumedSpace","level":1800000}}]}'
)


def test_encode_is_the_proposals_json_exactly() -> None:
    assert sample().encode() == SAMPLE_JSON.encode()


def test_decode_of_the_encoding_is_the_snapshot() -> None:
    snap = decode(SAMPLE_JSON.encode())
    assert snap == sample()
    assert snap.snapshot_at == "2024-05-01T12:00:00.250Z"
    assert snap.volumes[1].soft_limit == LimitDefinition(LimitType.CONSUMED_SPACE, 1_800_000)
    assert snap.volumes[1].hard_limit is None
    assert snap.volumes[1].free == 500_000
    assert snap.volume("/var/lib/kafka/data-0") == VolumeDetails("/var/lib/kafka/data-0", 1_000_000, 200_000)
    assert snap.volume("nope") is None


def test_the_tables_spelling_of_the_limits_is_read_too() -> None:
    text = SAMPLE_JSON.replace('"HardLimit"', '"Hard limit"')
    text = text.replace('"SoftLimit":{"type":"MinFree', '"Soft limit":{"type":"MinFree')
    assert decode(text.encode()) == sample()


def test_unknown_fields_are_ignored() -> None:
    data = json.loads(SAMPLE_JSON)
    data["BrokerId"] = 3
    data["Volumes"][0]["Device"] = "/dev/sda1"
    data["SoftLimit"]["unit"] = "percent"
    assert decode(json.dumps(data).encode()) == sample()


def test_snapshot_at_reads_any_offset_and_floors_to_the_millisecond() -> None:
    assert parse_snapshot_at("2024-05-01T14:00:00.250+02:00") == T0
    assert parse_snapshot_at("2024-05-01T12:00:00.250999Z") == T0
    assert parse_snapshot_at("2024-05-01T12:00:00Z") == T0 - 250
    assert parse_snapshot_at("1970-01-01T00:00:00Z") == 0
    assert format_snapshot_at(0) == "1970-01-01T00:00:00.000Z"
    assert format_snapshot_at(-1) == "1969-12-31T23:59:59.999Z"


def test_levels_keep_their_json_number_type() -> None:
    snap = VolumeSnapshot(T0, LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 12.5), HARD, sample().volumes)
    raw = snap.encode()
    assert b'"level":12.5' in raw
    assert decode(raw).soft_limit.level == 12.5


def test_keys_are_decimal_broker_ids() -> None:
    assert encode_key(0) == b"0"
    assert encode_key(1001) == b"1001"
    assert decode_key(b"1001") == 1001
    for bad in (None, b"", b"-1", b"1a", b" 1", b"\xff", b"99999999999", b"2147483648"):
        with pytest.raises(VolumeMessageError) as err:
            decode_key(bad)
        assert err.value.field == "(key)"
    with pytest.raises(VolumeMessageError):
        encode_key(-1)
    with pytest.raises(VolumeMessageError):
        encode_key(True)


def _mutated(path: tuple[str | int, ...], value: Any, delete: bool = False) -> bytes:
    data = json.loads(SAMPLE_JSON)
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return json.dumps(data).encode()


M = _mutated
TYPES = "must be one of ConsumedSpace, MinFreeBytes, MinFreePercentage, got"
LONG = "9223372036854775807"
BIG = 2**63
SJ = SAMPLE_JSON


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "(message): is not JSON: Expecting value at line 1 column 1"),
        (b"\xff{}", "(message): is not UTF-8 (byte 0)"),
        (b"[1]", "(message): must be a JSON object, got list"),
        (b"null", "(message): must be a JSON object, got null"),
        (M(("SnapshotAt",), None, delete=True), "SnapshotAt: is missing"),
        (M(("SnapshotAt",), 1714564800), "SnapshotAt: must be an ISO 8601 date-time string, got 1714564800"),
        (M(("SnapshotAt",), "yesterday"), 'SnapshotAt: is not an ISO 8601 date-time: "yesterday"'),
        (
            M(("SnapshotAt",), "2024-05-01T12:00:00"),
            'SnapshotAt: needs a UTC offset or Z (a time without one is ambiguous): "2024-05-01T12:00:00"',
        ),
        (M(("HardLimit",), None, delete=True), "HardLimit: is missing"),
        (M(("SoftLimit",), 10), "SoftLimit: must be a JSON object, got 10"),
        (M(("SoftLimit", "type"), None, delete=True), "SoftLimit.type: is missing"),
        (M(("SoftLimit", "type"), "MaxUsed"), f'SoftLimit.type: {TYPES} "MaxUsed"'),
        (M(("HardLimit", "level"), None, delete=True), "HardLimit.level: is missing"),
        (M(("HardLimit", "level"), "5000"), 'HardLimit.level: must be a number, got "5000"'),
        (M(("HardLimit", "level"), True), "HardLimit.level: must be a number, got true"),
        (M(("HardLimit", "level"), -1), "HardLimit.level: must be a finite number >= 0, got -1"),
        (
            M(("HardLimit", "level"), 10**400),
            "HardLimit.level: must be a finite number >= 0, got an integer past a float's range",
        ),
        (
            M(("SoftLimit", "level"), 101),
            "SoftLimit.level: a MinFreePercentage level is a percentage (0 to 100), got 101",
        ),
        (M(("Volumes",), None, delete=True), "Volumes: is missing"),
        (M(("Volumes",), {}), "Volumes: must be a JSON array, got dict"),
        (M(("Volumes",), []), "Volumes: must list at least one volume"),
        (M(("Volumes", 1), "disk"), 'Volumes[1]: must be a JSON object, got "disk"'),
        (M(("Volumes", 1, "VolumeName"), None, delete=True), "Volumes[1].VolumeName: is missing"),
        (M(("Volumes", 1, "VolumeName"), ""), 'Volumes[1].VolumeName: must be a non-empty string, got ""'),
        (
            M(("Volumes", 1, "VolumeName"), "/var/lib/kafka/data-0"),
            'Volumes[1].VolumeName: "/var/lib/kafka/data-0" is listed twice',
        ),
        (M(("Volumes", 0, "Capacity"), "1000"), 'Volumes[0].Capacity: must be an integer, got "1000"'),
        (M(("Volumes", 0, "Capacity"), 1e6), "Volumes[0].Capacity: must be an integer, got 1000000.0"),
        (M(("Volumes", 0, "Capacity"), 0), f"Volumes[0].Capacity: must be between 1 and {LONG}, got 0"),
        (M(("Volumes", 0, "Capacity"), BIG), f"Volumes[0].Capacity: must be between 1 and {LONG}, got {BIG}"),
        (M(("Volumes", 0, "Consumed"), None, delete=True), "Volumes[0].Consumed: is missing"),
        (M(("Volumes", 0, "Consumed"), None), "Volumes[0].Consumed: must be an integer, got null"),
        (M(("Volumes", 0, "Consumed"), -5), f"Volumes[0].Consumed: must be between 0 and {LONG}, got -5"),
        (M(("Volumes", 0, "Consumed"), 1_000_001), "Volumes[0].Consumed: 1000001 is more than the Capacity,"),
        (M(("Volumes", 1, "SoftLimit", "type"), 7), f"Volumes[1].SoftLimit.type: {TYPES} 7"),
        (M(("Volumes", 1, "HardLimit"), []), "Volumes[1].HardLimit: must be a JSON object, got list"),
        (SJ.replace("5000", "NaN").encode(), "(message): NaN is not a JSON number"),
        (SJ.replace("5000", "1e999").encode(), "HardLimit.level: must be a finite number >= 0, got inf"),
        (SJ.replace('"level":10', '"level":10,"level":20').encode(), "level: appears twice in one object"),
        (
            SJ.replace('"HardLimit"', '"Hard limit":{"type":"MinFreeBytes","level":1},"HardLimit"').encode(),
            "HardLimit: given twice, as 'HardLimit' and 'Hard limit'",
        ),
        (
            SJ.replace('"HardLimit":{"type":"MinFreeBytes"', '"Hard limit":{"type":"MinFreeBits"').encode(),
            f'Hard limit.type: {TYPES} "MinFreeBits"',
        ),
        (SJ.replace("200000", "2" + "0" * 5000).encode(), "(message): is not usable JSON"),
        (b"[" * 100_000, "(message): is"),
    ],
)
def test_decode_errors_name_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(VolumeMessageError) as err:
        decode(raw)
    assert str(err.value).startswith(message)
    assert isinstance(err.value, ValueError)
    assert err.value.field == message.split(": ", 1)[0]


def test_decode_refuses_what_is_not_bytes() -> None:
    with pytest.raises(VolumeMessageError, match=r"\(message\): must be bytes, got str"):
        decode(SAMPLE_JSON)  # type: ignore[arg-type]


def test_construction_checks_as_decode_does() -> None:
    with pytest.raises(VolumeMessageError, match="Consumed: 11 is more than the Capacity, 10"):
        VolumeDetails("v", 10, 11)
    with pytest.raises(VolumeMessageError, match="VolumeName: must be valid Unicode"):
        VolumeDetails("\udc80", 10, 1)
    with pytest.raises(VolumeMessageError, match="level: must be a finite number >= 0, got nan"):
        LimitDefinition(LimitType.MIN_FREE_BYTES, float("nan"))
    with pytest.raises(VolumeMessageError, match="SnapshotAt: must be between"):
        VolumeSnapshot(MAX_SNAPSHOT_MS + 1, SOFT, HARD, sample().volumes)
    with pytest.raises(VolumeMessageError, match="Volumes: must list at least one volume"):
        VolumeSnapshot(T0, SOFT, HARD, ())
    with pytest.raises(VolumeMessageError, match="Volumes: must be a tuple of volume details, got list"):
        VolumeSnapshot(T0, SOFT, HARD, list(sample().volumes))  # type: ignore[arg-type]
    with pytest.raises(VolumeMessageError, match="HardLimit: must be a limit definition, got dict"):
        VolumeSnapshot(T0, SOFT, {"type": "MinFreeBytes"}, sample().volumes)  # type: ignore[arg-type]


# --- properties -------------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=20)


@st.composite
def limits(draw: st.DrawFn) -> LimitDefinition:
    kind = draw(st.sampled_from(list(LimitType)))
    if kind is LimitType.MIN_FREE_PERCENTAGE:
        level: int | float = draw(
            st.one_of(st.integers(0, 100), st.floats(0, 100, allow_nan=False, allow_infinity=False))
        )
    else:
        level = draw(st.one_of(st.integers(0, 2**63 - 1), st.floats(0, 1e19, allow_nan=False)))
    return LimitDefinition(kind, level)


@st.composite
def volumes(draw: st.DrawFn, name: str) -> VolumeDetails:
    capacity = draw(st.integers(1, 2**63 - 1))
    consumed = draw(st.integers(0, capacity))
    soft = draw(st.none() | limits())
    hard = draw(st.none() | limits())
    return VolumeDetails(name, capacity, consumed, soft, hard)


@st.composite
def snapshots(draw: st.DrawFn) -> VolumeSnapshot:
    at = draw(st.integers(-62_135_596_800_000, MAX_SNAPSHOT_MS))
    vol_names = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    vols = tuple(draw(volumes(n)) for n in vol_names)
    return VolumeSnapshot(at, draw(limits()), draw(limits()), vols)


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_round_trip(snap: VolumeSnapshot) -> None:
    raw = snap.encode()
    back = decode(raw)
    assert back == snap
    assert back.encode() == raw
    assert [type(v.capacity) for v in back.volumes] == [int] * len(back.volumes)
    assert type(back.soft_limit.level) is type(snap.soft_limit.level)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_fail_with_a_value_error(raw: bytes) -> None:
    with contextlib.suppress(VolumeMessageError):
        decode(raw)


scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_values = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
FIELD_PATHS: list[tuple[str | int, ...]] = [
    ("SnapshotAt",),
    ("HardLimit",),
    ("SoftLimit", "type"),
    ("SoftLimit", "level"),
    ("Volumes",),
    ("Volumes", 0),
    ("Volumes", 1, "VolumeName"),
    ("Volumes", 0, "Capacity"),
    ("Volumes", 1, "Consumed"),
    ("Volumes", 1, "SoftLimit"),
]


def _path_name(path: tuple[str | int, ...]) -> str:
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELD_PATHS), json_values)
def test_a_bad_field_is_named_in_the_error(path: tuple[str | int, ...], value: Any) -> None:
    """Replace one field by any JSON value: it decodes, or the error names that field or one inside it."""
    try:
        decode(M(path, value))
    except VolumeMessageError as err:
        # a duplicate volume name is blamed on the later volume, a capacity below the consumed on that
        also = {"Volumes[1].VolumeName", "Volumes[0].Consumed" if path[-1] == "Capacity" else ""}
        assert err.field.startswith(_path_name(path)) or err.field in also, err


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_any_json_decodes_or_fails_with_a_value_error(value: Any) -> None:
    with contextlib.suppress(VolumeMessageError):
        decode(json.dumps(value).encode())
