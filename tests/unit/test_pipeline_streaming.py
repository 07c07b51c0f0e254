"""Large frames go through as they arrive, byte for byte, and answers the proxy makes itself
still come in their turn: a real Pipeline on in-memory transports (fuzz/fakenet.py), driven by
the pipeline fuzzer's records, with frames split the way a socket may split them."""

from __future__ import annotations

import struct

from dev.loadgen import produce_request
from fuzz.pipeline_target import shared_fuzzer
from protocol.frames import FrameDecoder

SIDECAR = b"\x00"  # the fuzzer's first setup: a sidecar without quotas


def _rec(op: int, data: bytes = b"") -> bytes:
    return struct.pack(">BH", op, len(data)) + data


def _split(data: bytes, *cuts: int) -> list[bytes]:
    out, pos = [], 0
    for cut in (*cuts, len(data)):
        out.append(data[pos:cut])
        pos = cut
    return out


def _frames(data: bytes | bytearray) -> list[bytes]:
    return [bytes(f) for f in FrameDecoder(2**31 - 1).feed(data)]


def test_a_large_produce_reaches_the_broker_whole_and_its_answer_comes_back() -> None:
    request = bytes(produce_request("t", 7, bytes(range(256)) * 40, "streamer"))  # ~10 KiB
    assert len(request) > 4096
    answer = struct.pack(">i", 7) + b"\x00" * 2000  # the broker's bytes, whatever they say
    framed = struct.pack(">i", len(answer)) + answer
    data = SIDECAR
    for part in _split(request, 700, 3000, 8000):
        data += _rec(0, part)
    for part in _split(framed, 900):
        data += _rec(2, part)
    fuzzer = shared_fuzzer()
    client = fuzzer.run(data)
    assert client is not None
    (broker,) = fuzzer.brokers
    assert _frames(broker.transport.written) == [request[4:]]
    assert _frames(client.written) == [answer]


def test_a_local_answer_waits_for_the_response_being_streamed() -> None:
    """ApiVersions v99 is answered by the proxy itself (UNSUPPORTED_VERSION); read while an
    earlier request's large response is half through, it goes out after that response."""
    fetch = struct.pack(">hhih", 1, 4, 41, 2) + b"fe"  # Fetch v4 (no stage reads it here)
    api_versions = struct.pack(">hhih", 18, 99, 42, 2) + b"av\x00"
    big = struct.pack(">i", 41) + bytes(range(256)) * 20  # ~5 KiB, arriving in two parts
    framed = struct.pack(">i", len(big)) + big
    data = SIDECAR + _rec(0, struct.pack(">i", len(fetch)) + fetch)
    first, rest = _split(framed, 1500)
    data += _rec(2, first)
    data += _rec(0, struct.pack(">i", len(api_versions)) + api_versions)
    data += _rec(2, rest)
    client = shared_fuzzer().run(data)
    assert client is not None
    frames = _frames(client.written)
    assert len(frames) == 2
    assert frames[0] == big
    assert struct.unpack_from(">ih", frames[1]) == (42, 35)  # UNSUPPORTED_VERSION, after it
