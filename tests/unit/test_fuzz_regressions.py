"""Inputs the fuzzer (fuzz/) found that crashed the proxy, each pinned by a test of the fix.

Every file in fuzz/crashes/ is named ``<target>-<what>`` and replays through its target; the
tests below also check the behaviour the fix chose, one bug each.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from fuzz.pipeline_target import MAX_FRAME_BYTES, shared_fuzzer
from fuzz.targets import request_target, response_target
from protocol import messages, mutations
from protocol.api_keys import ApiKey
from protocol.sasl import PLAIN, SaslTracker
from proxy.shared.throttling import FetchRequestInfo, throttled_fetch_response

CRASHES = Path(__file__).resolve().parents[2] / "fuzz" / "crashes"
TARGETS: dict[str, Callable[[bytes], object]] = {
    "requests": request_target,
    "responses": response_target,
    "pipeline": lambda data: shared_fuzzer().run(data),
}


@pytest.mark.parametrize("path", sorted(CRASHES.iterdir()), ids=lambda p: p.name)
def test_crash_input_replays_clean(path: Path) -> None:
    TARGETS[path.name.split("-", 1)[0]](path.read_bytes())


def _rec(op: int, data: bytes = b"") -> bytes:
    return struct.pack(">BH", op, len(data)) + data


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


# 1. SaslAuthenticate with PLAIN and a user name that is not UTF-8: UnicodeDecodeError escaped
#    the pipeline's read callback (the transport died with a traceback, uncounted, and the frame
#    never reached the broker). Now the name is simply not known: the frame goes on unchanged.


def test_plain_user_not_utf8_is_not_claimed() -> None:
    tracker = SaslTracker()
    tracker.on_handshake(PLAIN)
    tracker.on_authenticate_request(b"\x00al\x9d\x9a\x00secret")
    assert tracker.claimed is None
    assert tracker.on_authenticate_response(0) is None


def test_plain_user_not_utf8_is_forwarded_byte_for_byte() -> None:
    handshake = struct.pack(">hhih", 17, 1, 1, 3) + b"cli" + struct.pack(">h", 5) + b"PLAIN"
    auth_bytes = b"\x00al\x9d\x9a\x00secret"
    authenticate = (
        struct.pack(">hhih", 36, 1, 2, 3) + b"cli" + struct.pack(">i", len(auth_bytes)) + auth_bytes
    )
    data = (
        bytes([0])
        + _rec(0, _frame(handshake))
        + _rec(1, b"\x00\x00" + b"\x00\x00\x00\x00")
        + _rec(0, _frame(authenticate))
    )
    fuzzer = shared_fuzzer()
    client = fuzzer.run(data)
    assert client is not None
    # The client got the handshake answer, and the broker the authenticate frame as it was sent.
    assert client.written.startswith(struct.pack(">ii", 10, 1))
    assert _frame(authenticate) in bytes(fuzzer.brokers[0].transport.written)


# 2. A mutation burst far over a tiny controller_mutation_rate decided a throttle of 5.9e11 ms;
#    patching it into the int32 throttle_time_ms raised struct.error out of the response path.
#    Now the wire value is the most the field holds (the client stays muted for the whole time).


def test_throttle_past_int32_is_clamped_on_the_wire() -> None:
    body = bytearray(b"\x00\x00\x00\x05" + b"\x00\x00\x00\x00")  # CreateTopics v4: throttle, no topics
    sent = messages.patch_throttle_time(ApiKey.CREATE_TOPICS, 4, body, 587_202_551_000)
    assert sent == messages.MAX_THROTTLE_MS
    assert messages.decode_response(ApiKey.CREATE_TOPICS, 4, body)["throttle_time_ms"] == 2**31 - 1
    merged = mutations.merged_response(ApiKey.CREATE_TOPICS, [], [], {"topics": []}, 2**40)
    assert merged["throttle_time_ms"] == 2**31 - 1
    messages.encode_response(ApiKey.CREATE_TOPICS, 4, merged)
    empty = throttled_fetch_response(12, 2**40, FetchRequestInfo(0, 0))
    assert messages.decode_response(ApiKey.FETCH, 12, empty)["throttle_time_ms"] == 2**31 - 1


# 3. With request_percentage on, a throttled ConsumerGroupHeartbeat (an API whose schema
#    kafka-python does not ship) had its response decoded to patch the throttle in:
#    FileNotFoundError escaped the upstream read callback. A broker newer than the schemas
#    (a version past them) closed the connection as "undecodable". Now such a response goes
#    out unchanged and the mute alone throttles.


def test_throttled_response_without_schema_goes_through_unchanged() -> None:
    header = struct.pack(">hhih", 68, 0, 1, 3) + b"cli" + b"\x00"
    request = header + b"\x02g\x00" + bytes(10)
    answer = b"\x00" + bytes(12)
    data = bytes([1]) + _rec(0, _frame(request)) + struct.pack(">BH", 3, 2000) + _rec(1, answer)
    client = shared_fuzzer().run(data)
    assert client is not None
    response = struct.pack(">i", 1) + answer
    assert bytes(client.written) == _frame(response)


def test_response_codec_versions() -> None:
    assert messages.response_codec_versions(68) is None
    assert not messages.can_read_response(68, 0)
    assert messages.can_read_response(ApiKey.METADATA, 12)
    assert not messages.can_read_response(ApiKey.METADATA, 999)


def test_oversize_frame_is_one_counted_rejection() -> None:
    data = bytes([0]) + _rec(0, struct.pack(">i", MAX_FRAME_BYTES + 1))
    client = shared_fuzzer().run(data)
    assert client is not None and client.closed and client.written == b""


# 4. A plain read of several frames, one of which closes the connection (here a request header
#    too short to read, or a response for a request nobody sent): the close flushes the read's
#    collected writes, and the compiled pipeline then raised TypeError out of the read callback
#    where it looked at the batch again (mypyc trusted the type mypy had narrowed the attribute
#    to). Now the frames before the bad one go on, and the close is the one counted rejection.


def _list_offsets(correlation_id: int) -> bytes:
    """ListOffsets v1, no topics: no stage reads it or its answer."""
    return struct.pack(">hhih", 2, 1, correlation_id, 3) + b"cli" + struct.pack(">ii", -1, 0)


def test_a_bad_request_amid_a_read_closes_after_the_ones_before_it() -> None:
    first, second = _frame(_list_offsets(1)), _frame(_list_offsets(2))
    data = bytes([0]) + _rec(0, first)  # the broker connection is open before the read below
    data += _rec(0, second + _frame(b"\x00\x02\x00")) + _rec(0, _frame(_list_offsets(3)))
    fuzzer = shared_fuzzer()
    client = fuzzer.run(data)
    assert client is not None and client.closed
    (broker,) = fuzzer.brokers
    assert bytes(broker.transport.written) == first + second  # none after the bad one


def test_a_stray_response_amid_a_read_closes_after_the_answers_before_it() -> None:
    answer = struct.pack(">i", 1) + bytes(8)
    stray = struct.pack(">i", 99) + bytes(8)
    data = bytes([0]) + _rec(0, _frame(_list_offsets(1)) + _frame(_list_offsets(2)))
    data += _rec(2, _frame(answer) + _frame(stray))
    client = shared_fuzzer().run(data)
    assert client is not None and client.closed
    assert bytes(client.written) == _frame(answer)
