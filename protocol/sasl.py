"""The user name a client claims in the SASL exchange the proxy forwards.

The broker authenticates; the proxy only reads who the client says it is, and believes it once
the broker has accepted the exchange. PLAIN carries ``authzid NUL authcid NUL password`` in one
message; SCRAM's client-first message is ``gs2-header,n=<name>,r=<nonce>`` (RFC 5802), with
',' and '=' in the name escaped as '=2C' and '=3D'. OAUTHBEARER's initial response (RFC 7628)
carries ``auth=Bearer <token>``: a JWT's subject claim is the principal a broker names, as
Kafka's validators name it (``sasl.oauthbearer.sub.claim.name``), else its authorization id.
GSSAPI's last client message (RFC 4752) is a Kerberos wrap token whose plain text, after the
security layer it chose, is the client's authorization id: Java clients send their Kerberos
principal there. A name the exchange does not show leaves an unnamed principal, someone but not
ANONYMOUS; OAUTHBEARER and GSSAPI names go through the configured mapping rules.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from dataclasses import dataclass, field

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
GSSAPI = "GSSAPI"
# Who a client is after a successful exchange of a mechanism the proxy cannot read a name from
# (OAUTHBEARER, GSSAPI): someone, but not the certificate's principal nor ANONYMOUS.
UNNAMED_PRINCIPAL = "<unnamed-sasl-principal>"
SCRAM_PREFIX = "SCRAM-"


class SaslError(ValueError):
    """A SASL message the proxy cannot read a user name from."""


def plain_user(auth_bytes: bytes) -> str:
    parts = auth_bytes.split(b"\x00")
    if len(parts) != 3 or not parts[1]:
        raise SaslError("PLAIN message is not authzid NUL authcid NUL password")
    try:
        return parts[1].decode("utf-8")
    except UnicodeDecodeError as exc:  # the broker refuses it; the proxy must only not crash
        raise SaslError("PLAIN user name is not UTF-8") from exc


def _unescape(saslname: str) -> str:
    """A gs2 header's or SCRAM's saslname: ',' and '=' are written '=2C' and '=3D' (RFC 5801)."""
    return saslname.replace("=2C", ",").replace("=3D", "=")


def scram_user(client_first: bytes) -> str:
    try:
        text = client_first.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslError("SCRAM client-first message is not UTF-8") from exc
    fields = text.split(",")
    # gs2-cbind-flag, authzid (may be empty), then the bare message: n=<user>,r=<nonce>,...
    if len(fields) < 4 or (fields[0] not in ("n", "y") and not fields[0].startswith("p=")):
        raise SaslError("SCRAM client-first message has no gs2 header")
    name = next((f[2:] for f in fields[2:] if f.startswith("n=")), None)
    if not name:
        raise SaslError("SCRAM client-first message has no user name")
    return _unescape(name)


def oauthbearer_name(initial_response: bytes, claim: str = "sub") -> str:
    """The principal of an OAUTHBEARER client initial response: the token's ``claim`` when it is
    a JWT with one, else the gs2 header's authorization id (Kafka requires the two to agree)."""
    try:
        text = initial_response.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslError("OAUTHBEARER initial response is not UTF-8") from exc
    header, _, rest = text.partition("\x01")
    gs2 = header.split(",")
    if len(gs2) < 2 or (gs2[0] not in ("n", "y") and not gs2[0].startswith("p=")):
        raise SaslError("OAUTHBEARER initial response has no gs2 header")
    authzid = gs2[1][2:] if gs2[1].startswith("a=") else ""
    token = next((kv[len("auth=") :] for kv in rest.split("\x01") if kv.startswith("auth=")), "")
    scheme, _, jwt = token.partition(" ")
    if scheme.lower() != "bearer" or not jwt:
        raise SaslError("OAUTHBEARER initial response has no bearer token")
    subject = _jwt_claim(jwt, claim)
    if subject:
        return subject
    if authzid:
        return _unescape(authzid)
    raise SaslError(f"OAUTHBEARER token has no {claim!r} claim the proxy can read")


def _jwt_claim(jwt: str, claim: str) -> str | None:
    parts = jwt.split(".")
    if len(parts) != 3:
        return None  # an opaque token: only the broker's validator knows whose it is
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return None
    value = payload.get(claim) if isinstance(payload, dict) else None
    return value if isinstance(value, str) and value else None


_KRB5_WRAP = b"\x05\x04"  # RFC 4121 wrap token
_KRB5_SEALED = 0x02
_KRB5_HEADER = 16


def gssapi_authzid(message: bytes) -> str | None:
    """The authorization id in GSSAPI's last client message (RFC 4752: a wrap token of four bytes,
    the security layer and buffer size chosen, then the id), when the token is an RFC 4121 wrap
    token without confidentiality (Kafka's only layer, auth, asks for none) whose data is not
    rotated; None when the exchange does not show it (an earlier round, a sealed token)."""
    if len(message) < _KRB5_HEADER + 4 or message[:2] != _KRB5_WRAP:
        return None
    flags, ec, rrc = message[2], int.from_bytes(message[4:6], "big"), int.from_bytes(message[6:8], "big")
    if flags & _KRB5_SEALED or message[3] != 0xFF or rrc != 0:
        return None
    data = message[_KRB5_HEADER : len(message) - ec]  # the checksum (ec bytes) follows the data
    if len(data) <= 4:
        return None
    try:
        name = data[4:].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name or None


Mapper = Callable[[str], str]


@dataclass(frozen=True)
class SaslNaming:
    """How names of OAUTHBEARER and GSSAPI logins are read: the JWT claim, and the mapping
    (Kafka-style rules) from the name the exchange shows to the principal quotas know."""

    oauthbearer_claim: str = "sub"
    mapper: Mapper | None = None

    def mapped(self, name: str) -> str:
        return self.mapper(name) if self.mapper is not None else name


@dataclass
class SaslTracker:
    """Per connection: the mechanism chosen, the name claimed, and whether the broker agreed."""

    mechanism: str | None = None
    claimed: str | None = None
    rounds: int = 0  # SaslAuthenticate requests seen
    authenticated: str | None = None
    naming: SaslNaming = field(default_factory=SaslNaming)
    unmapped: str | None = None  # a name the mapping rules refused (the connection stays unnamed)

    def on_handshake(self, mechanism: str) -> None:
        self.mechanism = mechanism

    def on_authenticate_request(self, auth_bytes: bytes) -> None:
        self.rounds += 1
        if self.mechanism == GSSAPI:
            name = gssapi_authzid(auth_bytes) if self.rounds > 1 else None
            self.claimed = self._map(name) if name else None
            return
        if self.rounds != 1 or self.mechanism is None:
            return
        try:
            if self.mechanism == PLAIN:
                self.claimed = plain_user(auth_bytes)
            elif self.mechanism.startswith(SCRAM_PREFIX):
                self.claimed = scram_user(auth_bytes)
            elif self.mechanism == OAUTHBEARER:
                self.claimed = self._map(oauthbearer_name(auth_bytes, self.naming.oauthbearer_claim))
        except SaslError:
            self.claimed = None

    def _map(self, name: str) -> str | None:
        try:
            return self.naming.mapped(name)
        except ValueError:  # no rule maps it: a broker with those rules would refuse the login
            self.unmapped = name
            return None

    def on_authenticate_response(self, error_code: int) -> str | None:
        """The principal once this response completes a successful exchange, else None."""
        if error_code != 0:
            self.claimed = None  # never charge a name the broker refused
            return None
        scram = (self.mechanism or "").startswith(SCRAM_PREFIX)
        if self.mechanism in (OAUTHBEARER, GSSAPI):
            # GSSAPI answers each round with success; the last one follows the wrap token that
            # names the client (claimed), the earlier ones leave it someone unnamed until then.
            self.authenticated = self.claimed or self.authenticated or UNNAMED_PRINCIPAL
            return self.authenticated
        if self.mechanism is not None and self.mechanism != PLAIN and not scram:
            self.authenticated = UNNAMED_PRINCIPAL
            return self.authenticated
        done = self.mechanism == PLAIN or (scram and self.rounds >= 2)
        if done and self.claimed:
            self.authenticated = self.claimed
            return self.authenticated
        return None

    @property
    def in_progress(self) -> bool:
        """A SASL exchange has started and has not succeeded yet."""
        return self.mechanism is not None and self.authenticated is None
