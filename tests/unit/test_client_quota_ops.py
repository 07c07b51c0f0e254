"""KIP-546 ops: validation with Kafka's error texts, describe filters, the overlay on the file.

The expected messages are what a Kafka 4.1.1 broker answered to the same alterations with
validate_only (sent raw to the harness broker while writing this module).
"""

from __future__ import annotations

from typing import Any

import pytest

from quota import client_quota_ops as ops
from quota.client_quota_ops import Alteration, Component, Op, Overlay
from quota.config import QuotaConfig
from quota.entities import resolve
from quota.keys import DEFAULT

FILE: dict[str, Any] = {
    "users": {
        "alice": {"producer_byte_rate": 1000, "clients": {"app": {"consumer_byte_rate": 2000}}},
        DEFAULT: {"producer_byte_rate": 500, "clients": {DEFAULT: {"request_percentage": 50}}},
    },
    "clients": {"reporting": {"consumer_byte_rate": 3000}, DEFAULT: {"producer_byte_rate": 10}},
    "ips": {"10.0.0.1": {"connection_creation_rate": 7}},
}


def _alt(entity: dict[str, str | None], *op_list: tuple[str, float | None]) -> Alteration:
    return Alteration(tuple(entity.items()), tuple(Op(k, v) for k, v in op_list))


def _one(entity: dict[str, str | None], *op_list: tuple[str, float | None]) -> ops.ApiError:
    result = ops.alter([_alt(entity, *op_list)], {})
    assert len(result.results) == 1
    return result.results[0][1]


BROKER_ANSWERS = [  # (entity, ops, Kafka's message); all INVALID_REQUEST
    ({"user": "alice"}, [("foo", 1.0)], "Invalid configuration key foo"),
    ({"user": "alice"}, [("producer_byte_rate", 0.0)], "Quota producer_byte_rate must be greater than 0"),
    ({"user": "alice"}, [("producer_byte_rate", -5.0)], "Quota producer_byte_rate must be greater than 0"),
    ({"user": "alice"}, [("producer_byte_rate", 1.5)], "producer_byte_rate cannot be a fractional value."),
    (
        {"user": "alice"},
        [("producer_byte_rate", 1e19)],
        "Proposed value for producer_byte_rate is too large for a LONG.",
    ),
    (
        {"ip": "1.2.3.4"},
        [("connection_creation_rate", 3e9)],
        "Proposed value for connection_creation_rate is too large for an INT.",
    ),
    (
        {"ip": "1.2.3.4"},
        [("connection_creation_rate", 2.5)],
        "connection_creation_rate cannot be a fractional value.",
    ),
    (
        {"ip": "not an ip"},
        [("connection_creation_rate", 2.0)],
        "not an ip is not a valid IP or resolvable host.",
    ),
    (
        {"ip": "1.2.3.4", "user": "a"},
        [("connection_creation_rate", 2.0)],
        "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
    ),
    (
        {"user": "a"},
        [("connection_creation_rate", 2.0)],
        "Invalid configuration key connection_creation_rate",
    ),
    ({"ip": "1.2.3.4"}, [("producer_byte_rate", 2.0)], "Invalid configuration key producer_byte_rate"),
    ({}, [("producer_byte_rate", 2.0)], "Invalid empty client quota entity"),
    ({"group": "x"}, [("producer_byte_rate", 2.0)], "Unhandled client quota entity type: group"),
    ({"user": ""}, [("producer_byte_rate", 2.0)], "Empty user not supported"),
    (
        {"user": "alice", "client-id": "app"},
        [("producer_byte_rate", 2.0), ("producer_byte_rate", 3.0)],
        "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=app, user=alice})",
    ),
    # The proxy's own per-user key is not a client-id key.
    ({"client-id": "app"}, [("producer_ids_rate", 2.0)], "Invalid configuration key producer_ids_rate"),
]


@pytest.mark.parametrize(("entity", "op_list", "message"), BROKER_ANSWERS)
def test_validation_errors_are_kafkas(
    entity: dict[str, str | None], op_list: list[Any], message: str
) -> None:
    assert _one(entity, *op_list) == ops.ApiError("INVALID_REQUEST", message)


def test_host_names_for_ip_entities() -> None:
    # Spelled as a host name: the proxy's own text (Kafka would resolve it; the proxy matches
    # addresses); the proxy layer resolves names first and passes what resolved.
    error = _one({"ip": "kafka-client.example"}, ("connection_creation_rate", 2.0))
    assert error.message == (
        "kthrottle: kafka-client.example is a host name; give its IP address (the proxy matches client "
        "connections by address)"
    )
    result = ops.alter(
        [_alt({"ip": "gone.example"}, ("connection_creation_rate", 2.0))], {}, resolvable=lambda _n: False
    )
    assert result.results[0][1].message == "gone.example is not a valid IP or resolvable host."


def test_valid_alterations_and_what_kafka_lets_through() -> None:
    assert _one({"user": "alice"}, ("request_percentage", 1.5)) == ops.NONE  # a DOUBLE key
    assert _one({"user": "carol"}, ("foo", None)) == ops.NONE  # removal checks no key
    assert _one({"user": None, "client-id": None}, ("producer_byte_rate", 1024.0)) == ops.NONE
    assert _one({"user": "carol"}, ("producer_ids_rate", 0.5)) == ops.NONE  # per user: the proxy's key
    assert _one({"ip": None}, ("connection_creation_rate", 20.0)) == ops.NONE
    assert _one({"ip": "::1"}, ("connection_creation_rate", 20.0)) == ops.NONE


def test_entities_echo_in_kafkas_order_and_duplicates_change_nothing() -> None:
    result = ops.alter(
        [
            _alt({"user": "bob"}, ("producer_byte_rate", 2.0)),
            _alt({"user": "alice", "client-id": "app"}, ("consumer_byte_rate", 5.0)),
            _alt({"user": "bob"}, ("consumer_byte_rate", 3.0)),
        ],
        {},
    )
    assert result.results == [
        (
            (("user", "bob"),),
            ops.ApiError(
                "INVALID_REQUEST", "Ignoring duplicate entity ClientQuotaEntity(entries={user=bob})"
            ),
        ),
        ((("client-id", "app"), ("user", "alice")), ops.NONE),
    ]
    assert result.changes == {(("client-id", "app"), ("user", "alice")): {"consumer_byte_rate": 5.0}}


def test_one_bad_entry_leaves_the_others() -> None:
    result = ops.alter(
        [_alt({"user": "a"}, ("producer_byte_rate", 5.0)), _alt({"user": "b"}, ("producer_byte_rate", 0.5))],
        {},
    )
    assert [err.name for _e, err in result.results] == ["NONE", "INVALID_REQUEST"]
    assert list(result.changes) == [(("user", "a"),)]


def test_changes_only_what_differs_and_records_removals() -> None:
    current: Overlay = {(("user", "a"),): {"producer_byte_rate": 5.0, "consumer_byte_rate": None}}
    result = ops.alter(
        [
            _alt(
                {"user": "a"},
                ("producer_byte_rate", 5.0),
                ("consumer_byte_rate", None),
                ("request_percentage", None),
            )
        ],
        current,
    )
    # Every key given is recorded, changed or not: the overlay seen here may be stale.
    assert result.changes == {
        (("user", "a"),): {"producer_byte_rate": 5.0, "consumer_byte_rate": None, "request_percentage": None}
    }


def test_default_spellings_are_one_entity() -> None:
    assert ops.canonical({"user": DEFAULT}) == ops.canonical({"user": None}) == (("user", None),)


# --- overlay -------------------------------------------------------------------------------


def test_overlay_sets_adds_and_removes_over_the_file() -> None:
    cfg = QuotaConfig.model_validate(FILE)
    overlay: ops.Overlay = {
        (("user", "alice"),): {"producer_byte_rate": 4096.0, "controller_mutation_rate": 5.0},
        (("client-id", "reporting"),): {"consumer_byte_rate": None},  # the file sets it: removal wins
        (("client-id", "new"), ("user", "bob")): {"producer_byte_rate": 64.0},
        (("ip", None),): {"connection_creation_rate": 3.0},
    }
    eff = ops.apply_overlay(cfg, overlay)
    assert resolve(eff, "alice", "x", "producer_byte_rate").quota == 4096.0  # type: ignore[union-attr]
    assert eff.users["alice"].controller_mutation_rate == 5.0
    assert eff.users["alice"].clients["app"].consumer_byte_rate == 2000  # untouched
    assert eff.clients["reporting"].consumer_byte_rate is None
    assert eff.users["bob"].clients["new"].producer_byte_rate == 64.0
    assert eff.ips[DEFAULT].connection_creation_rate == 3.0
    assert cfg.users["alice"].producer_byte_rate == 1000  # the file's model is not changed


def test_a_reloaded_file_keeps_the_overlay_on_top() -> None:
    overlay: ops.Overlay = {(("user", "alice"),): {"producer_byte_rate": None}}
    new_file = QuotaConfig.model_validate(
        {**FILE, "users": {"alice": {"producer_byte_rate": 9, "consumer_byte_rate": 8}}}
    )
    eff = ops.apply_overlay(new_file, overlay)
    assert eff.users["alice"].producer_byte_rate is None  # still removed by the API
    assert eff.users["alice"].consumer_byte_rate == 8  # the new file's other keys apply


def test_removing_the_last_byte_rate_of_a_cluster_scoped_entity() -> None:
    cfg = QuotaConfig.model_validate({"clients": {"spread": {"producer_byte_rate": 100, "scope": "cluster"}}})
    eff = ops.apply_overlay(cfg, {(("client-id", "spread"),): {"producer_byte_rate": None}})
    assert eff.clients["spread"].scope is None


# --- describe ------------------------------------------------------------------------------


def _described(components: list[Component], strict: bool = False) -> dict[ops.Entity, dict[str, float]]:
    return dict(ops.describe(QuotaConfig.model_validate(FILE), components, strict))


def test_describe_filters_as_kafka() -> None:
    alice = (("user", "alice"),)
    alice_app = (("client-id", "app"), ("user", "alice"))
    default_user = (("user", None),)
    defaults = (("client-id", None), ("user", None))
    assert set(_described([Component("user", ops.MATCH_EXACT, "alice")])) == {alice, alice_app}
    assert set(_described([Component("user", ops.MATCH_EXACT, "alice")], strict=True)) == {alice}
    assert set(_described([Component("user", ops.MATCH_DEFAULT)], strict=True)) == {default_user}
    assert set(_described([Component("user", ops.MATCH_ANY)], strict=True)) == {alice, default_user}
    assert set(_described([Component("user", ops.MATCH_ANY), Component("client-id", ops.MATCH_DEFAULT)])) == {
        defaults
    }
    assert _described([Component("ip", ops.MATCH_ANY)]) == {
        (("ip", "10.0.0.1"),): {"connection_creation_rate": 7}
    }
    assert len(_described([])) == 7  # every entity with a key
    assert _described([Component("user", ops.MATCH_EXACT, "alice")], strict=True)[alice] == {
        "producer_byte_rate": 1000.0
    }


@pytest.mark.parametrize(
    ("components", "error"),
    [
        ([Component("", 0, "x")], ("INVALID_REQUEST", "Invalid empty entity type.")),
        (
            [Component("user", 0, "x"), Component("user", 2)],
            ("INVALID_REQUEST", "Entity type user cannot appear more than once in the filter."),
        ),
        ([Component("group", 0, "x")], ("UNSUPPORTED_VERSION", "Unsupported entity type group")),
        (
            [Component("user", 0, None)],
            ("INVALID_REQUEST", "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ),
        (
            [Component("user", 1, "x")],
            ("INVALID_REQUEST", "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
        ),
        (
            [Component("user", 2, "x")],
            ("INVALID_REQUEST", "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
        ),
        ([Component("user", 7)], ("INVALID_REQUEST", "Unknown match type 7")),
        (
            [Component("ip", 2), Component("user", 2)],
            (
                "INVALID_REQUEST",
                "Invalid entity filter component combination. IP filter component should not be used "
                "with user or clientId filter component.",
            ),
        ),
    ],
)
def test_describe_errors_are_kafkas(components: list[Component], error: tuple[str, str]) -> None:
    with pytest.raises(ops.DescribeError) as caught:
        _described(components)
    assert caught.value.error == ops.ApiError(*error)


# --- records ---------------------------------------------------------------------------------


def test_records_round_trip() -> None:
    entity = (("client-id", None), ("user", "alice"))
    key = ops.encode_key(entity, "producer_byte_rate")
    assert key == b'[[["client-id",null],["user","alice"]],"producer_byte_rate"]'
    assert ops.decode_key(key) == (entity, "producer_byte_rate")
    assert ops.decode_value(entity, "producer_byte_rate", ops.encode_value(1024.0)) == (True, 1024.0)
    assert ops.decode_value(entity, "producer_byte_rate", ops.encode_value(None)) == (True, None)
    assert ops.decode_value(entity, "producer_byte_rate", None) == (False, None)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (b"not json", b"1"),
        (b'[[["group","x"]],"producer_byte_rate"]', b"1"),
        (b'[[["user","a"]],"producer_byte_rate"]', b"0"),
        (b'[[["user","a"]],"connection_creation_rate"]', b"5"),
        (b'[[["user","a"]],"producer_byte_rate"]', b'"fast"'),
        (b'[[["user","a"]],"producer_byte_rate"]', b"[1]"),
        (b'[["user","a"]]', b"1"),
        # Refused as unreadable rather than raising something the store does not expect.
        (b"[" * 100_000, b"1"),  # nested past the recursion limit
        (b'[[["user","a"]],"producer_byte_rate"]', b"[" * 100_000),
        (b'[[["user","a"]],"producer_byte_rate"]', b"1" + b"0" * 400),  # past a float's range
    ],
)
def test_bad_records_are_refused(key: bytes, value: bytes) -> None:
    with pytest.raises(ops.RecordError):
        ops.decode_value(*ops.decode_key(key), value)
