"""Who a client certificate is: its subject as a distinguished name, mapped to a principal name.

Kafka names an mTLS client by its certificate subject in RFC 2253 form (Java's
``X500Principal.getName()``: the most specific attribute first, ``CN=alice,OU=eng,O=Example``;
other attributes than Java's nine keywords as ``OID=#hex``), read here from the certificate's DER
and lets ``ssl.principal.mapping.rules`` turn that into a short name. The rules here follow
Kafka's ``SslPrincipalMapper``: tried in order, ``DEFAULT`` keeps the name as it is,
``RULE:pattern/replacement/[LU]`` applies when the pattern matches the whole name, replaces it
(``$1`` is a group), and lower- or upper-cases the result with ``L`` or ``U``. A name no rule
applies to is refused, as Kafka refuses the connection.

Each rule is one list item here (Kafka's one comma-separated string needs a splitter that knows
regular expressions; YAML lists do not).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_RULES: tuple[str, ...] = ("DEFAULT",)

# Attributes Java prints by keyword in RFC 2253 form (by OID); any other is printed as its dotted
# OID and the hex of its DER value, as ``X500Principal.getName()`` does.
_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "2.5.4.9": "STREET",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DER string types and how their bytes decode.
_STRINGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "ascii",  # PrintableString
    0x14: "latin-1",  # TeletexString (T.61; Latin-1 in practice)
    0x16: "ascii",  # IA5String
    0x1A: "ascii",  # VisibleString
    0x1E: "utf-16-be",  # BMPString
    0x1C: "utf-32-be",  # UniversalString
}
_JAVA_ESCAPED = ',=+<>#;"\\'

_RULE = re.compile(r"RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)")


class NoMatchingRule(ValueError):
    """No mapping rule applies to a certificate's name: the connection is refused."""


class BadCertificate(ValueError):
    """A certificate whose subject cannot be read (the TLS library accepted it, so: rare)."""


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of value, end of value) of the DER element at ``at``."""
    if at + 2 > len(data):
        raise BadCertificate("truncated DER")
    tag, first = data[at], data[at + 1]
    at += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or at + count > len(data):
            raise BadCertificate("bad DER length")
        length = int.from_bytes(data[at : at + count], "big")
        at += count
    if at + length > len(data):
        raise BadCertificate("DER value runs past its container")
    return tag, at, at + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(tag, value start, value end, element start) of each element in data[start:end]."""
    out = []
    at = start
    while at < end:
        tag, vstart, vend = _tlv(data, at)
        out.append((tag, vstart, vend, at))
        at = vend
    return out


def _oid(raw: bytes) -> str:
    if not raw:
        raise BadCertificate("empty OID")
    arcs: list[int] = []
    value = 0
    for byte in raw:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    if not arcs or raw[-1] & 0x80:
        raise BadCertificate("truncated OID")
    first = min(arcs[0] // 40, 2)
    return ".".join(str(a) for a in (first, arcs[0] - 40 * first, *arcs[1:]))


def _java_escape(value: str) -> str:
    """Java's RFC 2253 escaping: ``,=+<>#;"\\`` anywhere, and spaces at either end."""
    out = ["\\" + ch if ch in _JAVA_ESCAPED else ch for ch in value]
    if out and value[0] == " ":
        out[0] = "\\ "
    if len(out) > 1 and value[-1] == " ":
        out[-1] = "\\ "
    return "".join(out)


def subject_of_certificate(der: bytes) -> bytes:
    """The DER of a certificate's subject Name (the sixth field of tbsCertificate, after an
    optional [0] version, the serial, the signature algorithm, the issuer and the validity)."""
    _tag, start, _end = _tlv(der, 0)
    _tag, tbs_start, tbs_end = _tlv(der, start)
    fields = _children(der, tbs_start, tbs_end)
    if fields and fields[0][0] == 0xA0:
        fields = fields[1:]
    if len(fields) < 5:
        raise BadCertificate("certificate has no subject")
    _tag, _vs, vend, at = fields[4]
    return der[at:vend]


def distinguished_name(subject_der: bytes) -> str:
    """The RFC 2253 name of a DER-encoded subject as Java prints it (``X500Principal.getName()``,
    what Kafka maps): the last RDN first, attributes of one RDN in their encoded order."""
    _tag, start, end = _tlv(subject_der, 0)
    rdns = []
    for _set_tag, set_start, set_end, _ in _children(subject_der, start, end):
        parts = []
        for _seq, seq_start, seq_end, _ in _children(subject_der, set_start, set_end):
            pair = _children(subject_der, seq_start, seq_end)
            if len(pair) != 2:
                raise BadCertificate("attribute is not a type and a value")
            (_ot, ostart, oend, _), (vtag, vstart, vend, vat) = pair
            oid = _oid(subject_der[ostart:oend])
            keyword = _KEYWORDS.get(oid)
            encoding = _STRINGS.get(vtag)
            if keyword is not None and encoding is not None:
                try:
                    text = subject_der[vstart:vend].decode(encoding)
                except UnicodeDecodeError as exc:
                    raise BadCertificate(f"attribute {keyword} is not {encoding}") from exc
                parts.append(f"{keyword}={_java_escape(text)}")
            else:
                parts.append(f"{oid}=#{subject_der[vat:vend].hex()}")
        rdns.append("+".join(parts))
    return ",".join(reversed(rdns))


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        result = self.pattern.sub(lambda m: _expand(self.replacement, m), name)
        if self.case == "L":
            return result.lower()
        if self.case == "U":
            return result.upper()
        return result


def _expand(replacement: str, match: re.Match[str]) -> str:
    """Java's replacement syntax: ``$n`` is group n (the longest number not above the group
    count), ``\\x`` is a literal x; a ``$n`` beyond the groups stays literal, as Kafka keeps it."""
    groups = match.re.groups
    out: list[str] = []
    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\" and i + 1 < len(replacement):
            out.append(replacement[i + 1])
            i += 2
            continue
        if ch == "$" and i + 1 < len(replacement) and replacement[i + 1].isdigit():
            j = i + 1
            number = int(replacement[j])
            j += 1
            if number > groups:
                out.append(replacement[i:j])
                i = j
                continue
            while (
                j < len(replacement)
                and replacement[j].isdigit()
                and number * 10 + int(replacement[j]) <= groups
            ):
                number = number * 10 + int(replacement[j])
                j += 1
            out.append(match.group(number) or "")
            i = j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _parse(rule: str) -> _Rule:
    text = rule.strip()
    if text == "DEFAULT":
        return _Rule(None)
    found = _RULE.fullmatch(text)
    if found is None:
        raise ValueError(f"invalid rule {rule!r}: expected DEFAULT or RULE:pattern/replacement/[LU]")
    try:
        pattern = re.compile(found.group(1))
    except re.error as exc:
        raise ValueError(f"invalid rule {rule!r}: bad pattern: {exc}") from exc
    return _Rule(pattern, found.group(2), found.group(3))


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``, one rule per item."""

    def __init__(self, rules: Sequence[str] = DEFAULT_RULES) -> None:
        if not rules:
            raise ValueError("give at least one rule (DEFAULT keeps the certificate's name)")
        self.rules = [_parse(r) for r in rules]

    def name(self, distinguished: str) -> str:
        for rule in self.rules:
            mapped = rule.apply(distinguished)
            if mapped is not None:
                return mapped
        raise NoMatchingRule(f"no principal mapping rule applies to {distinguished!r}")
