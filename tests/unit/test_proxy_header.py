"""The PROXY protocol parser (protocol/proxy_header.py) on hand-built headers of both versions:
every family, byte-by-byte arrival, the size limits, bad signatures and fields, TLVs skipped,
and ``wanted()`` never asking for a byte past the header (the TLS handshake that follows must
stay unread)."""

from __future__ import annotations

import contextlib
import ipaddress
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.proxy_header import (
    V1_MAX_BYTES,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    ProxyHeaderParser,
    parse_proxy_header,
)

KAFKA_REQUEST = bytes.fromhex("0000001f0012000300000001000d6164") + b"minclient"  # ApiVersions v3
TLS_HELLO = bytes.fromhex("160301020001") + bytes(20)


def v2(
    command: int = 0x1,
    family: int = 0x1,
    transport: int = 0x1,
    addresses: bytes = b"",
    tlvs: bytes = b"",
    version: int = 2,
    length: int | None = None,
) -> bytes:
    body = addresses + tlvs
    size = len(body) if length is None else length
    return (
        V2_SIGNATURE
        + bytes([version << 4 | command, family << 4 | transport])
        + struct.pack(">H", size)
        + body
    )


def inet4(src: str, dst: str, sport: int, dport: int) -> bytes:
    return (
        ipaddress.IPv4Address(src).packed
        + ipaddress.IPv4Address(dst).packed
        + struct.pack(">HH", sport, dport)
    )


def inet6(src: str, dst: str, sport: int, dport: int) -> bytes:
    return (
        ipaddress.IPv6Address(src).packed
        + ipaddress.IPv6Address(dst).packed
        + struct.pack(">HH", sport, dport)
    )


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack(">H", len(value)) + value


def one_by_one(data: bytes) -> tuple[ProxyHeader, ProxyHeaderParser]:
    """Feed ``data`` a byte at a time: None before its last byte, and ``wanted()`` never more
    than the bytes still to come."""
    parser = ProxyHeaderParser()
    for i in range(len(data) - 1):
        assert parser.wanted() <= len(data) - i, (i, data[:i])
        assert parser.feed(data[i : i + 1]) is None, (i, data[: i + 1])
    assert 1 <= parser.wanted() <= 1
    header = parser.feed(data[-1:])
    assert header is not None and header.length == len(data)
    assert parser.wanted() == 0 and parser.rest == b""
    return header, parser


# --- version 1 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "family", "client", "destination"),
    [
        (
            b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n",
            "TCP4",
            ("192.168.0.1", 56324),
            ("192.168.0.11", 443),
        ),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 0 65535\r\n", "TCP4", ("1.2.3.4", 0), ("5.6.7.8", 65535)),
        (b"PROXY TCP6 2001:db8::1 ::1 40000 9092\r\n", "TCP6", ("2001:db8::1", 40000), ("::1", 9092)),
        (b"PROXY TCP6 ::ffff:10.0.0.5 :: 1 2\r\n", "TCP6", ("::ffff:a00:5", 1), ("::", 2)),
    ],
)
def test_v1_tcp(line: bytes, family: str, client: tuple[str, int], destination: tuple[str, int]) -> None:
    header, _ = one_by_one(line)
    assert (header.version, header.local, header.family) == (1, False, family)
    assert header.client == client
    assert (header.destination, header.destination_port) == destination


@pytest.mark.parametrize(
    "line",
    [
        b"PROXY UNKNOWN\r\n",
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 16) + b"\r\n",  # exactly the limit
    ],
)
def test_v1_unknown_names_no_client(line: bytes) -> None:
    header, _ = one_by_one(line)
    assert header.family == "UNKNOWN" and header.client is None and header.length == len(line)


def test_v1_longest_tcp6_header() -> None:
    full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(line) == 104  # the spec's worst case for TCP6
    header, _ = one_by_one(line)
    assert header.client == (full, 65535)


def test_bytes_after_the_header_are_kept() -> None:
    parser = ProxyHeaderParser()
    header = parser.feed(b"PROXY TCP4 10.0.0.5 10.0.0.1 40000 9092\r\n" + KAFKA_REQUEST)
    assert header is not None and header.client == ("10.0.0.5", 40000)
    assert parser.rest == KAFKA_REQUEST
    assert parser.feed(b"more") is header and parser.rest == KAFKA_REQUEST + b"more"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 15) + b"\r\n", "107 bytes"),
        (b"PROXY UNKNOWN " + b"x" * 200, "107 bytes"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "line feed without a carriage return"),
        (b"PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n", "carriage return inside"),
        (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol"),
        (b"PROXY tcp4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol"),
        (b"PROXY  TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol"),
        (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "empty destination address"),
        (b"PROXY TCP4 256.2.3.4 5.6.7.8 1 2\r\n", "not an TCP4 address"),
        (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "not an TCP4 address"),
        (b"PROXY TCP4 2001:db8::1 5.6.7.8 1 2\r\n", "not valid for TCP4"),
        (b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n", "not an TCP6 address"),
        (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "not valid for TCP6"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "over 65535"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "not valid"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 123456 2\r\n", "too long"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "3 fields"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "5 fields"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n", "5 fields"),
        (b"PROXY\r\n", "not a PROXY protocol header"),
        (b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "not a PROXY protocol header"),
    ],
)
def test_v1_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError, match=reason):
        parse_proxy_header(data)


def test_v1_bad_byte_is_refused_as_soon_as_it_arrives() -> None:
    """A field that cannot be valid fails on its first impossible byte, not at the CRLF."""
    parser = ProxyHeaderParser()
    assert parser.feed(b"PROXY TCP4 10.0.0.") is None
    with pytest.raises(ProxyHeaderError, match="source address"):
        parser.feed(b"x")
    with pytest.raises(ProxyHeaderError):  # and stays refused
        parser.feed(b"1 10.0.0.1 1 2\r\n")


# --- version 2 --------------------------------------------------------------------------------------


def test_v2_tcp4() -> None:
    header, _ = one_by_one(v2(addresses=inet4("10.0.0.5", "10.0.0.1", 40000, 9092)))
    assert (header.version, header.family, header.client) == (2, "TCP4", ("10.0.0.5", 40000))
    assert (header.destination, header.destination_port) == ("10.0.0.1", 9092)
    assert header.describe() == "v2 PROXY TCP4 10.0.0.5:40000 -> 10.0.0.1:9092"


def test_v2_tcp6() -> None:
    header, _ = one_by_one(v2(family=0x2, addresses=inet6("2001:db8::5", "2001:db8::1", 1, 65535)))
    assert (header.family, header.client) == ("TCP6", ("2001:db8::5", 1))
    assert (header.destination, header.destination_port) == ("2001:db8::1", 65535)


def test_v2_unix_names_paths_and_no_client() -> None:
    paths = b"/run/client.sock".ljust(108, b"\x00") + b"/run/lb.sock".ljust(108, b"\x00")
    header, _ = one_by_one(v2(family=0x3, addresses=paths))
    assert (header.family, header.source, header.destination) == ("UNIX", "/run/client.sock", "/run/lb.sock")
    assert header.client is None and header.source_port is None


def test_v2_unspec_and_local_name_no_client() -> None:
    unspec, _ = one_by_one(v2(family=0x0, transport=0x0))
    assert (unspec.family, unspec.local, unspec.client) == ("UNKNOWN", False, None)
    # LOCAL: the load balancer's own connection (a health check); family and addresses are ignored
    local, _ = one_by_one(v2(command=0x0, family=0x1, addresses=inet4("1.1.1.1", "2.2.2.2", 1, 2)))
    assert (local.local, local.client) == (True, None)
    odd_local, _ = one_by_one(v2(command=0x0, family=0xF, transport=0xF))
    assert odd_local.local and odd_local.client is None


def test_v2_tlvs_are_skipped() -> None:
    tlvs = tlv(0x01, b"kafka") + tlv(0x05, b"\x00" * 40) + tlv(0xEA, b"vpce-0123456789abcdef")
    data = v2(addresses=inet4("10.0.0.5", "10.0.0.1", 40000, 9092), tlvs=tlvs)
    header, _ = one_by_one(data)
    assert header.client == ("10.0.0.5", 40000) and header.length == len(data)
    parser = ProxyHeaderParser()
    assert parser.feed(data + TLS_HELLO) == header and parser.rest == TLS_HELLO


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (v2(version=1, addresses=inet4("1.1.1.1", "2.2.2.2", 1, 2)), "version 1"),
        (v2(command=0x2), "unknown command 0x2"),
        (v2(family=0x4), "unknown address family 0x4"),
        (v2(transport=0x3), "unknown transport protocol 0x3"),
        (v2(transport=0x2, addresses=inet4("1.1.1.1", "2.2.2.2", 1, 2)), "TCP4 over datagrams"),
        (v2(transport=0x0, addresses=inet4("1.1.1.1", "2.2.2.2", 1, 2)), "unspecified transport"),
        (v2(addresses=b"\x01" * 8), "8 bytes of addresses, too few for TCP4"),
        (v2(family=0x2, addresses=inet4("1.1.1.1", "2.2.2.2", 1, 2)), "too few for TCP6"),
        (v2(length=5000), "5016 bytes, over"),
        (b"\r\n\r\n\x00\r\nQUIT\r", "not a PROXY protocol header"),
        (b"\r\n\r\n\x01", "not a PROXY protocol header"),
    ],
)
def test_v2_refused(data: bytes, reason: str) -> None:
    with pytest.raises(ProxyHeaderError, match=reason):
        parse_proxy_header(data)


def test_v2_oversize_is_refused_from_its_length_alone() -> None:
    """A length over the limit is refused once the 16 fixed bytes are in: nothing more is read."""
    parser = ProxyHeaderParser(max_v2_bytes=512)
    fixed = v2(length=600)
    assert parser.feed(fixed[:15]) is None
    with pytest.raises(ProxyHeaderError, match="616 bytes, over this proxy's limit of 512"):
        parser.feed(fixed[15:])


# --- not a header at all --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (KAFKA_REQUEST, "a Kafka request"),
        (TLS_HELLO, "a TLS handshake"),
        (b"SSH-2.0-OpenSSH\r\n", "no PROXY protocol signature"),
    ],
)
def test_other_protocols_are_refused_on_their_first_byte(data: bytes, hint: str) -> None:
    parser = ProxyHeaderParser()
    with pytest.raises(ProxyHeaderError, match=hint) as refused:
        parser.feed(data[:1])
    assert "not a PROXY protocol header" in str(refused.value)


def test_the_first_read_names_what_came_instead() -> None:
    parser = ProxyHeaderParser()
    with pytest.raises(ProxyHeaderError, match=r"began with 47 45 54 20 2f 6d 65 74 \(an HTTP request\)"):
        parser.feed(b"GET /metrics HTTP/1.1\r\n"[: parser.wanted()])


def test_first_read_takes_no_more_than_the_shortest_header() -> None:
    assert ProxyHeaderParser().wanted() == len(b"PROXY UNKNOWN\r\n") < len(v2(family=0, transport=0))


# --- properties ----------------------------------------------------------------------------------

ipv4s = st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1))
ipv6s = st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1))
ports = st.integers(0, 65535)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, tuple[str, int] | None]:
    """A valid header of either version, and the client it names."""
    kind = draw(st.sampled_from(["v1-4", "v1-6", "v1-unknown", "v2-4", "v2-6", "v2-local", "v2-unspec"]))
    sport, dport = draw(ports), draw(ports)
    if kind.endswith("6"):
        src, dst = str(draw(ipv6s)), str(draw(ipv6s))
    else:
        src, dst = str(draw(ipv4s)), str(draw(ipv4s))
    tlvs = draw(st.binary(max_size=64))
    if kind == "v1-4":
        return f"PROXY TCP4 {src} {dst} {sport} {dport}\r\n".encode(), (src, sport)
    if kind == "v1-6":
        return f"PROXY TCP6 {src} {dst} {sport} {dport}\r\n".encode(), (src, sport)
    if kind == "v1-unknown":
        junk = draw(st.binary(max_size=90).filter(lambda b: b"\r" not in b and b"\n" not in b))
        return b"PROXY UNKNOWN" + (b" " + junk if junk else b"") + b"\r\n", None
    if kind == "v2-4":
        return v2(addresses=inet4(src, dst, sport, dport), tlvs=tlvs), (src, sport)
    if kind == "v2-6":
        return v2(family=0x2, addresses=inet6(src, dst, sport, dport), tlvs=tlvs), (src, sport)
    if kind == "v2-local":
        return v2(command=0x0, addresses=tlvs), None
    return v2(family=0x0, transport=0x0, tlvs=tlvs), None


@settings(max_examples=300, deadline=None)
@given(headers(), st.binary(max_size=40), st.data())
def test_any_split_of_a_valid_header_parses_and_wanted_never_reads_past_it(
    made: tuple[bytes, tuple[str, int] | None], after: bytes, data: st.DataObject
) -> None:
    raw, client = made
    parser = ProxyHeaderParser()
    at, header = 0, None
    stream = raw + after
    while header is None:
        want = parser.wanted()
        assert 1 <= want <= len(raw) - at, (at, raw)
        take = data.draw(st.integers(1, want))
        header = parser.feed(stream[at : at + take])
        at += take
    assert at == len(raw) and header.length == len(raw) and parser.rest == b""
    assert header.client == client
    whole = ProxyHeaderParser()
    assert whole.feed(stream) == header and whole.rest == after


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 50))
def test_arbitrary_bytes_parse_or_are_refused_with_a_reason(data: bytes, chunk: int) -> None:
    """Whatever arrives, in whatever pieces: a header, more wanted, or ProxyHeaderError; and a
    refusal is the same however the bytes were split."""
    parser = ProxyHeaderParser()
    outcome: object = None
    try:
        for i in range(0, len(data), chunk):
            outcome = parser.feed(data[i : i + chunk])
            if outcome is not None:
                break
    except ProxyHeaderError as exc:
        assert str(exc)
        with pytest.raises(ProxyHeaderError):
            parse_proxy_header(data)
        return
    if outcome is None:
        assert parse_proxy_header(data) is None
    else:
        assert parse_proxy_header(data) == outcome


@settings(max_examples=300, deadline=None)
@given(headers(), st.integers(0, 200), st.integers(0, 255))
def test_a_changed_byte_never_crashes_the_parser(
    made: tuple[bytes, tuple[str, int] | None], where: int, value: int
) -> None:
    raw = bytearray(made[0])
    raw[where % len(raw)] = value
    with contextlib.suppress(ProxyHeaderError):
        parse_proxy_header(bytes(raw))
