"""The frame decoder gives back exactly the frames sent, however the stream is split."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.frames import FrameDecoder

sizes = st.one_of(st.integers(0, 300), st.integers(1000, 5000))


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        sizes.map(lambda n: bytes((i * 7 + n) % 251 for i in range(n))), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(1, 4000), min_size=1, max_size=50),
    buffered=st.booleans(),
)
def test_frames_survive_any_split(payloads: list[bytes], cuts: list[int], buffered: bool) -> None:
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    # Small scratch and threshold so that large-frame mode and compaction are exercised.
    dec = FrameDecoder(scratch_bytes=2048, big_frame_bytes=512)
    got: list[bytes] = []
    pos = 0
    i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        i += 1
        if buffered:
            target = dec.get_buffer()
            n = min(n, len(target), len(stream) - pos)
            target[:n] = stream[pos : pos + n]
            got.extend(bytes(f) for f in dec.written(n))
        else:
            got.extend(bytes(f) for f in dec.feed(stream[pos : pos + n]))
            n = min(n, len(stream) - pos)
        pos += n
    assert got == payloads
    assert not dec.mid_frame
