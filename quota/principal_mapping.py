"""Who a client certificate is: its subject as a distinguished name, mapped to a principal name.

Kafka names an mTLS client by its certificate subject in RFC 2253 form (Java's
``X500Principal.getName()``: the most specific attribute first, ``CN=alice,OU=eng,O=Example``)
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_RULES: tuple[str, ...] = ("DEFAULT",)

# Attribute names Java prints by keyword in RFC 2253 form; Python's ssl module gives long names.
_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}

_RULE = re.compile(r"RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)")


class NoMatchingRule(ValueError):
    """No mapping rule applies to a certificate's name: the connection is refused."""


def _escape(value: str) -> str:
    """RFC 2253 escaping of an attribute value."""
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (ch == "#" and i == 0) or (ch == " " and i in (0, len(value) - 1)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def distinguished_name(subject: Iterable[Iterable[tuple[str, str]]]) -> str:
    """RFC 2253 string of a subject as Python's ``SSLObject.getpeercert()`` gives it (RDNs in
    certificate order, each a tuple of (attribute, value)): reversed, as Java prints it."""
    rdns = []
    for rdn in subject:
        rdns.append("+".join(f"{_KEYWORDS.get(attr, attr)}={_escape(value)}" for attr, value in rdn))
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
