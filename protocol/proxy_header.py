"""The PROXY protocol header (HAProxy's spec, versions 1 and 2), sans-IO.

A load balancer that speaks it sends one header at the start of each connection, before the
client's own bytes, naming the client it accepted the connection from:

- v1, text: ``PROXY TCP4 <src> <dst> <sport> <dport>\\r\\n`` (or ``TCP6``, or ``PROXY UNKNOWN``
  followed by anything up to the CRLF), 107 bytes at most;
- v2, binary: the 12-byte signature ``\\r\\n\\r\\n\\x00\\r\\nQUIT\\n``, a version/command byte
  (version 2; LOCAL or PROXY), a family/transport byte, a 16-bit length, the addresses (TCP over
  IPv4 or IPv6, UNIX paths, or none) and then TLVs, which are skipped.

``ProxyHeaderParser.feed`` takes bytes as they arrive and returns None (more needed), the
``ProxyHeader``, or raises ``ProxyHeaderError`` with the reason. ``wanted()`` says how many more
bytes surely belong to the header, so a caller that must not read past it (the TLS handshake
follows on the same connection) never does. A LOCAL header (the load balancer's own connection,
a health check) and an UNKNOWN, UNSPEC or UNIX one name no client address: the connection's own
peer stands for the client.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX_BYTES = 107  # the spec's bound, CRLF included
V1_MIN_BYTES = 15  # "PROXY UNKNOWN\r\n"
V2_FIXED_BYTES = 16  # signature, version/command, family/transport, length
DEFAULT_MAX_V2_BYTES = 4096  # headers past this (TLVs mostly) are refused: the spec allows a bound

_V1_PROTOCOLS = (b"TCP4", b"TCP6", b"UNKNOWN")
_V1_FIELD_MIN = {b"TCP4": (7, 7, 1, 1), b"TCP6": (2, 2, 1, 1)}  # src, dst, sport, dport
_V1_FIELD_MAX = {b"TCP4": (15, 15, 5, 5), b"TCP6": (45, 45, 5, 5)}
_V1_FIELD_CHARS = {
    b"TCP4": (frozenset(b"0123456789."),) * 2,
    b"TCP6": (frozenset(b"0123456789abcdefABCDEF:."),) * 2,
}
_DIGITS = frozenset(b"0123456789")
_FIELD_NAMES = ("source address", "destination address", "source port", "destination port")

_V2_COMMANDS = {0x0: "LOCAL", 0x1: "PROXY"}
_V2_FAMILIES = {0x0: "UNSPEC", 0x1: "TCP4", 0x2: "TCP6", 0x3: "UNIX"}  # with a STREAM transport
_V2_TRANSPORTS = {0x0: "UNSPEC", 0x1: "STREAM", 0x2: "DGRAM"}
_V2_ADDRESS_BYTES = {"TCP4": 12, "TCP6": 36, "UNIX": 216, "UNSPEC": 0}


class ProxyHeaderError(ValueError):
    """Bytes that are not a PROXY protocol header this proxy accepts; the message says why."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed header. ``family`` is TCP4, TCP6, UNIX or UNKNOWN (v1 UNKNOWN, v2 UNSPEC);
    ``local`` is a v2 LOCAL command. ``length`` is the header's size in bytes."""

    version: int
    local: bool
    family: str
    source: str | None
    source_port: int | None
    destination: str | None
    destination_port: int | None
    length: int

    @property
    def client(self) -> tuple[str, int] | None:
        """The real client's (address, port), when the header names one (PROXY over TCP/IPv4 or
        IPv6); None: the connection's own peer stands for the client."""
        if self.local or self.family not in ("TCP4", "TCP6"):
            return None
        assert self.source is not None and self.source_port is not None
        return self.source, self.source_port

    def describe(self) -> str:
        """One line for logs: ``v2 PROXY TCP4 10.0.0.5:40000 -> 10.0.0.1:9092``."""
        command = "LOCAL" if self.local else "PROXY"
        if self.source is None:
            return f"v{self.version} {command} {self.family}"
        src = f"{self.source}:{self.source_port}" if self.source_port is not None else self.source
        dst = (
            f"{self.destination}:{self.destination_port}"
            if self.destination_port is not None
            else self.destination
        )
        return f"v{self.version} {command} {self.family} {src} -> {dst}"


def _hint(first: bytes) -> str:
    """What a connection that sent no header seems to have sent instead."""
    shown = first[:8].hex(" ")
    if first[:1] == b"\x16":
        what = "a TLS handshake: the client reached this listener without the load balancer"
    elif first[:1] == b"\x00":
        what = "a Kafka request, it seems: the client reached this listener without the load balancer"
    elif first[:3] in (b"GET", b"POS", b"HEA", b"PUT", b"OPT"):
        what = "an HTTP request"
    else:
        what = "no PROXY protocol signature"
    return f"not a PROXY protocol header: the connection began with {shown} ({what})"


class ProxyHeaderParser:
    """One connection's header, fed as its bytes arrive (see the module's docstring)."""

    def __init__(self, max_v2_bytes: int = DEFAULT_MAX_V2_BYTES) -> None:
        if max_v2_bytes < V2_FIXED_BYTES + _V2_ADDRESS_BYTES["UNIX"]:
            raise ValueError(f"max_v2_bytes must allow at least {V2_FIXED_BYTES + 216} bytes")
        self.max_v2_bytes = max_v2_bytes
        self._buf = bytearray()
        self.header: ProxyHeader | None = None
        self.error: ProxyHeaderError | None = None
        self.rest = b""  # bytes fed past the end of the header (none when fed ``wanted()`` at a time)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> ProxyHeader | None:
        """Add bytes; the header once complete (then again on every call), None while more is
        needed. Raises ProxyHeaderError when the bytes cannot be a header (and on every call after)."""
        if self.error is not None:
            raise self.error
        if self.header is not None:
            self.rest += bytes(data)
            return self.header
        self._buf += data
        try:
            header = self._v2() if self._buf[:1] == b"\r" else self._v1()
        except ProxyHeaderError as exc:
            self.error = exc
            raise
        if header is not None:
            self.header = header
            self.rest = bytes(self._buf[header.length :])
            self._buf = bytearray()
        return header

    def wanted(self) -> int:
        """How many more bytes surely belong to the header (at least 1 until it is complete, 0
        after): reading no more than this never takes bytes that follow it."""
        if self.header is not None or self.error is not None:
            return 0
        buf = self._buf
        n = len(buf)
        if n == 0:
            return V1_MIN_BYTES  # the shortest header of either version (a v2 one has 16 bytes)
        if buf[:1] == b"\r":
            if n < V2_FIXED_BYTES:
                return V2_FIXED_BYTES - n
            return V2_FIXED_BYTES + int.from_bytes(buf[14:16], "big") - n
        return self._v1_wanted()

    # --- v1 ------------------------------------------------------------------------------------

    def _v1_wanted(self) -> int:
        buf = self._buf
        if buf.endswith(b"\r"):
            return 1
        tokens = bytes(buf[len(V1_PREFIX) :]).split(b" ") if len(buf) >= len(V1_PREFIX) else []
        if len(tokens) < 2:
            return max(1, V1_MIN_BYTES - len(buf))  # the protocol name is not complete yet
        mins = _V1_FIELD_MIN.get(tokens[0])
        if mins is None:  # UNKNOWN: anything, then CRLF
            return 2
        k = len(tokens) - 2  # the field being read
        later = sum(1 + mins[j] for j in range(k + 1, 4))
        return max(0, mins[k] - len(tokens[-1])) + later + 2

    def _v1(self) -> ProxyHeader | None:
        buf = bytes(self._buf)
        n = min(len(buf), len(V1_PREFIX))
        if buf[:n] != V1_PREFIX[:n]:
            raise ProxyHeaderError(_hint(buf))
        end = buf.find(b"\r\n")
        line = buf if end == -1 else buf[:end]
        if b"\n" in line:
            raise ProxyHeaderError("PROXY v1: a line feed without a carriage return before it")
        if b"\r" in (line[:-1] if end == -1 else line):
            raise ProxyHeaderError("PROXY v1: a carriage return inside the line")
        if (end == -1 and len(buf) >= V1_MAX_BYTES) or end + 2 > V1_MAX_BYTES:
            raise ProxyHeaderError(f"PROXY v1: no CRLF within {V1_MAX_BYTES} bytes (the spec's limit)")
        if end == -1 and line.endswith(b"\r"):
            line = line[:-1]
        if len(line) < len(V1_PREFIX):
            return None
        tokens = line[len(V1_PREFIX) :].split(b" ")
        complete = end != -1
        proto = tokens[0]
        if len(tokens) > 1 or complete:
            if proto not in _V1_PROTOCOLS:
                raise ProxyHeaderError(f"PROXY v1: unknown protocol {proto[:16]!r} (TCP4, TCP6 or UNKNOWN)")
        elif not any(p.startswith(proto) for p in _V1_PROTOCOLS):
            raise ProxyHeaderError(f"PROXY v1: unknown protocol {proto[:16]!r} (TCP4, TCP6 or UNKNOWN)")
        if proto == b"UNKNOWN":
            if complete:
                return ProxyHeader(1, False, "UNKNOWN", None, None, None, None, end + 2)
            return None
        if len(tokens) == 1:
            return None
        fields = tokens[1:]
        for i, value in enumerate(fields[:4]):
            whole = complete or i < len(fields) - 1
            _v1_field_prefix(proto, i, value, whole)
        if len(fields) > 4:
            raise ProxyHeaderError(
                f"PROXY v1: {len(fields)} fields after {proto.decode()} (4: two addresses, two ports)"
            )
        if not complete:
            return None
        if len(fields) < 4:
            raise ProxyHeaderError(
                f"PROXY v1: {len(fields)} fields after {proto.decode()} (4: two addresses, two ports)"
            )
        family = proto.decode()
        src, dst = (_v1_address(proto, fields[i], _FIELD_NAMES[i]) for i in (0, 1))
        sport, dport = int(fields[2]), int(fields[3])
        return ProxyHeader(1, False, family, src, sport, dst, dport, end + 2)

    # --- v2 ------------------------------------------------------------------------------------

    def _v2(self) -> ProxyHeader | None:
        buf = self._buf
        n = min(len(buf), len(V2_SIGNATURE))
        if buf[:n] != V2_SIGNATURE[:n]:
            raise ProxyHeaderError(_hint(bytes(buf)))
        if len(buf) > 12:
            version, command = buf[12] >> 4, buf[12] & 0x0F
            if version != 2:
                raise ProxyHeaderError(f"PROXY v2: version {version} in the version byte (2 expected)")
            if command not in _V2_COMMANDS:
                raise ProxyHeaderError(f"PROXY v2: unknown command 0x{command:x} (LOCAL 0x0, PROXY 0x1)")
        local = len(buf) > 12 and (buf[12] & 0x0F) == 0
        family = "UNSPEC"
        if len(buf) > 13 and not local:
            family = _v2_family(buf[13])
        if len(buf) < V2_FIXED_BYTES:
            return None
        length = int.from_bytes(buf[14:16], "big")
        total = V2_FIXED_BYTES + length
        if total > self.max_v2_bytes:
            raise ProxyHeaderError(
                f"PROXY v2: a header of {total} bytes, over this proxy's limit of {self.max_v2_bytes}"
            )
        if length < _V2_ADDRESS_BYTES[family]:
            raise ProxyHeaderError(
                f"PROXY v2: {length} bytes of addresses, too few for {family} ({_V2_ADDRESS_BYTES[family]})"
            )
        if len(buf) < total:
            return None
        if local:
            return ProxyHeader(2, True, "UNKNOWN", None, None, None, None, total)
        block = bytes(buf[V2_FIXED_BYTES:total])  # the addresses, then TLVs (skipped)
        if family == "TCP4":
            src4, dst4 = ipaddress.IPv4Address(block[0:4]), ipaddress.IPv4Address(block[4:8])
            ports = int.from_bytes(block[8:10], "big"), int.from_bytes(block[10:12], "big")
            return ProxyHeader(2, False, family, str(src4), ports[0], str(dst4), ports[1], total)
        if family == "TCP6":
            src6, dst6 = ipaddress.IPv6Address(block[0:16]), ipaddress.IPv6Address(block[16:32])
            ports = int.from_bytes(block[32:34], "big"), int.from_bytes(block[34:36], "big")
            return ProxyHeader(2, False, family, str(src6), ports[0], str(dst6), ports[1], total)
        if family == "UNIX":
            src_path, dst_path = _unix_path(block[0:108]), _unix_path(block[108:216])
            return ProxyHeader(2, False, family, src_path, None, dst_path, None, total)
        return ProxyHeader(2, False, "UNKNOWN", None, None, None, None, total)


def _v2_family(byte: int) -> str:
    family, transport = byte >> 4, byte & 0x0F
    if family not in _V2_FAMILIES:
        raise ProxyHeaderError(f"PROXY v2: unknown address family 0x{family:x}")
    if transport not in _V2_TRANSPORTS:
        raise ProxyHeaderError(f"PROXY v2: unknown transport protocol 0x{transport:x}")
    name = _V2_FAMILIES[family]
    if name != "UNSPEC" and _V2_TRANSPORTS[transport] != "STREAM":
        kind = "datagrams (UDP)" if transport == 0x2 else "an unspecified transport"
        raise ProxyHeaderError(f"PROXY v2: {name} over {kind}, where a stream connection was proxied")
    return name


def _unix_path(raw: bytes) -> str:
    return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")


def _v1_field_prefix(proto: bytes, index: int, value: bytes, whole: bool) -> None:
    """Refuse a field (or the part of it that arrived) no valid header could have."""
    name = _FIELD_NAMES[index]
    chars = _V1_FIELD_CHARS[proto][index] if index < 2 else _DIGITS
    if whole and not value:
        raise ProxyHeaderError(f"PROXY v1: empty {name} (fields are separated by one space)")
    if any(c not in chars for c in value):
        raise ProxyHeaderError(f"PROXY v1: {name} {value[:48]!r} is not valid for {proto.decode()}")
    if len(value) > _V1_FIELD_MAX[proto][index]:
        raise ProxyHeaderError(f"PROXY v1: {name} {value[:48]!r} is too long for {proto.decode()}")
    if index >= 2 and whole and int(value) > 65535:
        raise ProxyHeaderError(f"PROXY v1: {name} {value.decode()} is over 65535")


def _v1_address(proto: bytes, value: bytes, name: str) -> str:
    text = value.decode("ascii")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = (
            ipaddress.IPv4Address(text) if proto == b"TCP4" else ipaddress.IPv6Address(text)
        )
    except ValueError as exc:
        raise ProxyHeaderError(f"PROXY v1: {name} {text!r} is not an {proto.decode()} address") from exc
    return str(address)


def parse_proxy_header(data: bytes, max_v2_bytes: int = DEFAULT_MAX_V2_BYTES) -> ProxyHeader | None:
    """The header at the start of ``data``, or None when ``data`` is only its beginning; raises
    ProxyHeaderError when it cannot be one."""
    return ProxyHeaderParser(max_v2_bytes).feed(data)
