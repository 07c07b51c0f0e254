"""The user name a client claims in the SASL exchange the proxy forwards.

The broker authenticates; the proxy only reads who the client says it is, and believes it once
the broker has accepted the exchange. PLAIN carries ``authzid NUL authcid NUL password`` in one
message; SCRAM's client-first message is ``gs2-header,n=<name>,r=<nonce>`` (RFC 5802), with
',' and '=' in the name escaped as '=2C' and '=3D'. Other mechanisms (OAUTHBEARER, GSSAPI)
are not read: their connections keep the anonymous principal.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN = "PLAIN"
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
    return name.replace("=2C", ",").replace("=3D", "=")


@dataclass
class SaslTracker:
    """Per connection: the mechanism chosen, the name claimed, and whether the broker agreed."""

    mechanism: str | None = None
    claimed: str | None = None
    rounds: int = 0  # SaslAuthenticate requests seen
    authenticated: str | None = None

    def on_handshake(self, mechanism: str) -> None:
        self.mechanism = mechanism

    def on_authenticate_request(self, auth_bytes: bytes) -> None:
        self.rounds += 1
        if self.rounds != 1 or self.mechanism is None:
            return
        try:
            if self.mechanism == PLAIN:
                self.claimed = plain_user(auth_bytes)
            elif self.mechanism.startswith(SCRAM_PREFIX):
                self.claimed = scram_user(auth_bytes)
        except SaslError:
            self.claimed = None

    def on_authenticate_response(self, error_code: int) -> str | None:
        """The principal once this response completes a successful exchange, else None."""
        if error_code != 0:
            self.claimed = None  # never charge a name the broker refused
            return None
        scram = (self.mechanism or "").startswith(SCRAM_PREFIX)
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
