"""Reading the claimed user from PLAIN, SCRAM, OAUTHBEARER and GSSAPI messages; believing it
only on success; mapping OAUTHBEARER and GSSAPI names."""

from __future__ import annotations

import base64
import json

import pytest

from protocol.sasl import (
    UNNAMED_PRINCIPAL,
    SaslError,
    SaslNaming,
    SaslTracker,
    gssapi_authzid,
    oauthbearer_name,
    plain_user,
    scram_user,
)
from quota.principal_mapping import PrincipalMapper


def test_plain_user() -> None:
    assert plain_user(b"\x00alice\x00secret") == "alice"
    assert plain_user(b"admin\x00alice\x00secret") == "alice"
    with pytest.raises(SaslError):
        plain_user(b"alice-secret")


def test_scram_user_unescapes() -> None:
    assert scram_user(b"n,,n=bob,r=abc123") == "bob"
    assert scram_user(b"n,a=bob,n=b=2Cob=3D1,r=x") == "b,ob=1"
    with pytest.raises(SaslError):
        scram_user(b"garbage")


def test_plain_exchange() -> None:
    t = SaslTracker()
    t.on_handshake("PLAIN")
    t.on_authenticate_request(b"\x00alice\x00pw")
    assert t.on_authenticate_response(0) == "alice"


def test_scram_needs_both_rounds() -> None:
    t = SaslTracker()
    t.on_handshake("SCRAM-SHA-256")
    t.on_authenticate_request(b"n,,n=bob,r=nonce")
    assert t.on_authenticate_response(0) is None  # server-first: not done yet
    t.on_authenticate_request(b"c=biws,r=nonce2,p=proof")
    assert t.on_authenticate_response(0) == "bob"


def test_failed_exchange_is_never_believed() -> None:
    t = SaslTracker()
    t.on_handshake("PLAIN")
    t.on_authenticate_request(b"\x00mallory\x00wrong")
    assert t.on_authenticate_response(58) is None
    assert t.authenticated is None and t.claimed is None


def test_unreadable_mechanism_success_is_an_unnamed_principal() -> None:
    """An opaque OAUTHBEARER token without an authorization id: the proxy cannot read the name,
    but the connection is someone who logged in, not the certificate's principal or ANONYMOUS,
    and no longer mid-exchange."""
    from protocol.sasl import UNNAMED_PRINCIPAL, SaslTracker

    tracker = SaslTracker()
    tracker.on_handshake("OAUTHBEARER")
    tracker.on_authenticate_request(b"n,,\x01auth=Bearer xyz\x01\x01")
    assert tracker.in_progress
    assert tracker.on_authenticate_response(0) == UNNAMED_PRINCIPAL
    assert not tracker.in_progress


def test_failed_exchange_stays_in_progress() -> None:
    from protocol.sasl import SaslTracker

    tracker = SaslTracker()
    tracker.on_handshake("PLAIN")
    tracker.on_authenticate_request(b"\x00mallory\x00wrong")
    assert tracker.on_authenticate_response(58) is None
    assert tracker.in_progress


def _jwt(claims: dict[str, object]) -> str:
    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part(claims)}."


def test_oauthbearer_names_the_tokens_subject_else_its_authorization_id() -> None:
    token = _jwt({"sub": "carol", "scope": "x", "iat": 1})
    assert oauthbearer_name(f"n,,\x01auth=Bearer {token}\x01\x01".encode()) == "carol"
    # Another claim, as the brokers' sasl.oauthbearer.sub.claim.name may say.
    other = _jwt({"sub": "svc-1", "client_id": "orders"})
    assert oauthbearer_name(f"n,,\x01auth=Bearer {other}\x01\x01".encode(), "client_id") == "orders"
    # An opaque token names nothing; its authorization id does.
    assert oauthbearer_name(b"n,a=dave,\x01auth=Bearer opaque-xyz\x01\x01") == "dave"
    for bad in (b"n,,\x01auth=Bearer opaque\x01\x01", b"garbage", b"n,,\x01auth=Basic abc\x01\x01", b"\xff"):
        with pytest.raises(SaslError):
            oauthbearer_name(bad)


def _wrap_token(plain: bytes, sealed: bool = False, rrc: int = 0, checksum: bytes = b"c" * 12) -> bytes:
    """An RFC 4121 wrap token: TOK_ID 05 04, flags, filler, EC (checksum length), RRC, SND_SEQ."""
    flags = 0x02 if sealed else 0x00  # from the initiator (0x01 would be SentByAcceptor)
    header = b"\x05\x04" + bytes([flags, 0xFF]) + len(checksum).to_bytes(2, "big")
    return header + rrc.to_bytes(2, "big") + (7).to_bytes(8, "big") + plain + checksum


def test_gssapi_names_the_authorization_id_of_its_last_message_mapped() -> None:
    last = _wrap_token(b"\x01\x00\x10\x00" + b"alice/app.example.com@EXAMPLE.COM")
    assert gssapi_authzid(last) == "alice/app.example.com@EXAMPLE.COM"
    assert gssapi_authzid(_wrap_token(b"\x01\x00\x10\x00")) is None  # no authorization id
    assert gssapi_authzid(_wrap_token(b"\x01\x00\x10\x00alice", sealed=True)) is None
    assert gssapi_authzid(_wrap_token(b"\x01\x00\x10\x00alice", rrc=28)) is None
    assert gssapi_authzid(b"\x60\x82\x02\x00" + b"\x00" * 40) is None  # an AP-REQ, not a wrap

    mapper = PrincipalMapper([r"RULE:([^\/@]*)(\/.*)?@EXAMPLE.COM/$1/L", "DEFAULT"]).name
    t = SaslTracker(naming=SaslNaming(mapper=mapper))
    t.on_handshake("GSSAPI")
    t.on_authenticate_request(b"\x60\x82 ap-req")
    assert t.on_authenticate_response(0) == UNNAMED_PRINCIPAL  # mid-exchange: someone
    t.on_authenticate_request(b"")
    t.on_authenticate_response(0)
    t.on_authenticate_request(_wrap_token(b"\x01\x00\x10\x00" + b"Alice/app@EXAMPLE.COM"))
    assert t.on_authenticate_response(0) == "alice"


def test_a_name_no_rule_maps_is_left_unnamed() -> None:
    mapper = PrincipalMapper(["RULE:(.*)@EXAMPLE.COM/$1/"]).name
    t = SaslTracker(naming=SaslNaming(mapper=mapper))
    t.on_handshake("OAUTHBEARER")
    t.on_authenticate_request(f"n,,\x01auth=Bearer {_jwt({'sub': 'eve@OTHER.ORG'})}\x01\x01".encode())
    assert t.on_authenticate_response(0) == UNNAMED_PRINCIPAL
    assert t.unmapped == "eve@OTHER.ORG"


@pytest.mark.parametrize(
    ("section", "field", "why"),
    [
        (
            "client_sasl: {principal_mapping_rules: ['RULE:x']}",
            "client_sasl.principal_mapping_rules",
            "invalid rule",
        ),
        ("client_sasl: {oauthbearer_sub_claim: ''}", "client_sasl.oauthbearer_sub_claim", "at least 1"),
        (
            "upstream_sasl: {username: p, password: s, mechanism: GSSAPI}",
            "upstream_sasl.mechanism",
            "SCRAM-SHA-256",
        ),
    ],
)
def test_a_malformed_sasl_section_is_refused_with_its_line_and_field(
    section: str, field: str, why: str
) -> None:
    from proxy.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:
        parse_config("gateway: {upstream_bootstrap: [b:9092]}\n" + section + "\n", "kthrottle.yaml")
    assert f"kthrottle.yaml:2: {field}" in str(err.value) and why in str(err.value), str(err.value)
