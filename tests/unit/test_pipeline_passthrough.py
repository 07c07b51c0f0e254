"""Frames the proxy does not change go through byte for byte, both ways (property-based).

A unit test of the pipeline: the upstream here is a stub that records what it receives and
answers each request with random bytes under the right correlation id.
"""

from __future__ import annotations

import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.versions import is_flexible
from tests.unit.conftest import Harness, recv_exactly

PASSTHROUGH_KEYS = [2, 8, 9, 11, 12, 13, 14, 15, 16, 32, 68, 71]


@st.composite
def request_frames(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(PASSTHROUGH_KEYS))
    version = draw(st.integers(0, 12))
    correlation_id = draw(st.integers(-(2**31), 2**31 - 1))
    client_id = draw(st.one_of(st.none(), st.text(max_size=20)))
    header = struct.pack(">hhi", key, version, correlation_id)
    if client_id is None:
        header += struct.pack(">h", -1)
    else:
        cid = client_id.encode()
        header += struct.pack(">h", len(cid)) + cid
    if is_flexible(key, version):
        header += b"\x00"
    body = draw(st.binary(max_size=300))
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    frames=st.lists(request_frames(), min_size=1, max_size=8),
    replies=st.lists(st.binary(max_size=200), min_size=8, max_size=8),
    split=st.integers(1, 64),
)
def test_unchanged_frames_pass_byte_for_byte(
    harness: Harness, frames: list[bytes], replies: list[bytes], split: int
) -> None:
    stub = harness.stub
    stub.received.clear()
    stub.sent.clear()
    stub.replies[:] = replies
    wire = b"".join(frames)
    with socket.create_connection(("127.0.0.1", harness.port), timeout=10) as sock:
        # Dribble the bytes in odd-sized pieces: framing must not depend on how reads split.
        for i in range(0, len(wire), split):
            sock.sendall(wire[i : i + split])
        expected_back = sum(4 + 4 + len(r) for r in replies[: len(frames)])
        got = recv_exactly(sock, expected_back)
    assert bytes(stub.received) == wire
    assert got == bytes(stub.sent)
