"""Reading the claimed user from PLAIN and SCRAM messages; believing it only on success."""

from __future__ import annotations

import pytest

from protocol.sasl import SaslError, SaslTracker, plain_user, scram_user


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
    """OAUTHBEARER or GSSAPI: the proxy cannot read the name, but the connection is someone who
    logged in, not the certificate's principal or ANONYMOUS, and no longer mid-exchange."""
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
