"""The quota API's store and answers without a broker: the compacted topic is replaced by a stub
that loops each publication back as a record (what the real topic does), plus admin auth and the
CLI's exit codes."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from protocol.errors import ErrorCode
from proxy.admin import quota_cli
from proxy.admin.http import AdminAuth, build_app
from proxy.cli import main
from proxy.config import AdminConfig, parse_config
from proxy.reload import apply
from proxy.server import ProxyServer
from proxy.shared.quota_api import STORE_OUTCOMES, QuotaAlterBoth, QuotaApiService, alterations_of
from quota import client_quota_ops as ops

GATEWAY = """
gateway: {upstream_bootstrap: ["127.0.0.1:9"], broker_port_base: 9100}
quotas:
  users:
    alice: {producer_byte_rate: 1000}
quota_api: {mode: proxy, admins: ["User:admin"], topic: t}
"""


class LoopbackTopic:
    """Stands in for CompactedTopic: every publication comes back as a record, in order."""

    def __init__(self, service: QuotaApiService, up: bool = True) -> None:
        self.service = service
        self.up = up
        self.caught_up = asyncio.Event()
        self.records: list[tuple[bytes, bytes | None]] = []
        if up:
            self.caught_up.set()

    async def publish(self, key: bytes, value: bytes | None) -> bool:
        if not self.up:
            return False
        self.records.append((key, value))
        self.service._on_record(key, value)
        return True

    async def stop(self) -> None:
        return None


def _server(text: str = GATEWAY) -> ProxyServer:
    server = ProxyServer(parse_config(text))
    assert server.quota_api is not None
    server.quota_api.exchange = LoopbackTopic(server.quota_api)  # type: ignore[assignment]
    return server


def _kafka_alter(*entries: tuple[dict[str, str | None], list[tuple[str, float | None]]]) -> dict[str, Any]:
    return {
        "entries": [
            {
                "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                "ops": [{"key": k, "value": v or 0.0, "remove": v is None} for k, v in op_list],
            }
            for entity, op_list in entries
        ],
        "validate_only": False,
    }


async def test_alteration_is_stored_enforced_and_survives_a_reload() -> None:
    server = _server()
    service = server.quota_api
    assert service is not None
    body = _kafka_alter(({"user": "alice"}, [("producer_byte_rate", 2048.0), ("consumer_byte_rate", 10.0)]))
    result = await service.alter(alterations_of(body), validate_only=False)
    assert [e.name for _x, e in result.results] == ["NONE"]
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 2048.0
    records = service.exchange.records  # type: ignore[attr-defined]
    assert records == [  # one record per key: concurrent alterations of other keys never collide
        (b'[[["user","alice"]],"producer_byte_rate"]', b"2048.0"),
        (b'[[["user","alice"]],"consumer_byte_rate"]', b"10.0"),
    ]
    # A hot reload of the file with a new value for alice: the API's value stays on top.
    apply(server, parse_config(GATEWAY.replace("1000}", "1000, request_percentage: 40}")))
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 2048.0
    assert server.enforcer.cfg.users["alice"].request_percentage == 40.0


async def test_validate_only_and_failures_store_nothing() -> None:
    server = _server()
    service = server.quota_api
    assert service is not None
    ok = _kafka_alter(({"user": "bob"}, [("producer_byte_rate", 5.0)]))
    await service.alter(alterations_of(ok), validate_only=True)
    bad = _kafka_alter(({"user": "bob"}, [("producer_byte_rate", 0.5)]))
    result = await service.alter(alterations_of(bad), validate_only=False)
    assert result.results[0][1].message == "producer_byte_rate cannot be a fractional value."
    assert service.exchange.records == []  # type: ignore[attr-defined]
    assert "bob" not in server.enforcer.cfg.users


async def test_store_not_read_yet_is_a_retriable_error_and_changes_nothing() -> None:
    server = _server(GATEWAY.replace("topic: t}", "topic: t, catch_up_timeout_seconds: 0.05}"))
    service = server.quota_api
    assert service is not None
    service.exchange = LoopbackTopic(service, up=False)  # type: ignore[assignment]
    body = _kafka_alter(({"user": "bob"}, [("producer_byte_rate", 5.0)]))
    result = await service.alter(alterations_of(body), validate_only=False)
    assert result.results[0][1].name == "REQUEST_TIMED_OUT"
    assert "bob" not in server.enforcer.cfg.users
    # Describe still answers, from the file.
    found = service.describe([ops.Component("user", ops.MATCH_ANY)], strict=True)
    assert found == [((("user", "alice"),), {"producer_byte_rate": 1000.0})]


async def test_other_keys_of_an_entity_altered_elsewhere_are_kept() -> None:
    """Two instances alter different keys of alice at the same instant: each applies the other's
    record and keeps its own (one record per (entity, key) in the topic)."""
    server = _server()
    service = server.quota_api
    assert service is not None
    body = _kafka_alter(({"user": "alice"}, [("consumer_byte_rate", 10.0)]))
    await service.alter(alterations_of(body), validate_only=False)
    service._on_record(ops.encode_key((("user", "alice"),), "producer_byte_rate"), b"4096")
    alice = server.enforcer.cfg.users["alice"]
    assert (alice.producer_byte_rate, alice.consumer_byte_rate) == (4096.0, 10.0)


async def test_records_from_other_instances_apply_and_tombstones_hand_back_to_the_file() -> None:
    server = _server()
    service = server.quota_api
    assert service is not None
    key = ops.encode_key((("user", "alice"),), "producer_byte_rate")
    service._on_record(key, b"null")
    assert server.enforcer.cfg.users["alice"].producer_byte_rate is None
    service._on_record(b"garbage", b"{}")  # skipped, logged
    service._on_record(key, None)
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 1000


def _store_records(server: ProxyServer) -> dict[str, float | None]:
    return {
        outcome: server.metrics.registry.get_sample_value(
            "kthrottle_quota_store_records_total", {"outcome": outcome}
        )
        for outcome in STORE_OUTCOMES
    }


async def test_store_records_are_counted_and_bad_ones_change_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every record read from the store is counted by its outcome; a skipped one is logged too."""
    server = _server()
    service = server.quota_api
    assert service is not None
    assert _store_records(server) == dict.fromkeys(STORE_OUTCOMES, 0.0)  # each series from the start
    key = ops.encode_key((("user", "alice"),), "producer_byte_rate")
    with caplog.at_level(logging.WARNING, logger="proxy.shared.quota_api"):
        service._on_record(b'[[["user","alice"]],"no_such_key"]', b"2048")  # a key that is no quota
        service._on_record(key, b"not json")
        service._on_record(key, b"0")  # a value Kafka would refuse (must be greater than 0)
        service._on_record(None, b"2048")
    assert service.overlay == {}
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 1000
    assert _store_records(server) == {
        "applied": 0.0,
        "cleared": 0.0,
        "unchanged": 0.0,
        "unreadable": 3.0,
        "no_key": 1.0,
    }
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(skipped) == 4
    assert skipped[-1] == "quota API: a record of t without a key skipped (value b'2048')"
    assert all(" skipped" in line for line in skipped)

    service._on_record(key, b"4096")  # a good record from another instance
    service._on_record(key, b"4096")  # read again (a reconnect reads the topic from its start)
    assert service.overlay == {(("user", "alice"),): {"producer_byte_rate": 4096.0}}
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 4096
    service._on_record(key, None)  # a tombstone: back to the file
    service._on_record(key, None)  # nothing left to clear
    assert service.overlay == {}
    assert server.enforcer.cfg.users["alice"].producer_byte_rate == 1000
    assert _store_records(server) == {
        "applied": 1.0,
        "cleared": 1.0,
        "unchanged": 2.0,
        "unreadable": 3.0,
        "no_key": 1.0,
    }


async def test_keyless_record_log_names_a_long_value_in_part(caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    service = server.quota_api
    assert service is not None
    with caplog.at_level(logging.WARNING, logger="proxy.shared.quota_api"):
        service._on_record(None, b"x" * 5000)
        service._on_record(None, None)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert lines == [
        f"quota API: a record of t without a key skipped (value b'{'x' * 100}'...)",
        "quota API: a record of t without a key skipped (value null)",
    ]
    assert _store_records(server)["no_key"] == 2.0


async def test_mode_both_merges_the_brokers_answer() -> None:
    server = _server(GATEWAY.replace("topic: t}", "topic: t, mode: both}"))
    service = server.quota_api
    assert service is not None
    body = _kafka_alter(
        ({"user": "a"}, [("producer_byte_rate", 5.0)]),
        ({"user": "b"}, [("producer_ids_rate", 2.0)]),  # the proxy's key: the broker refuses it
        ({"user": "c"}, [("producer_byte_rate", 0.5)]),  # both refuse
    )
    state = QuotaAlterBoth(await service.validate(alterations_of(body)), body)

    def entry(name: str, code: int, message: str | None) -> dict[str, Any]:
        return {
            "error_code": code,
            "error_message": message,
            "entity": [{"entity_type": "user", "entity_name": name}],
        }

    broker = {
        "throttle_time_ms": 3,
        "entries": [
            entry("a", 0, None),
            entry("b", 42, "Invalid configuration key producer_ids_rate"),
            entry("c", 42, "producer_byte_rate cannot be a fractional value."),
        ],
    }
    answer = await state.complete(service, broker)
    assert answer["throttle_time_ms"] == 3
    assert [(e["error_code"], e["error_message"]) for e in answer["entries"]] == [
        (0, None),
        (42, "Invalid configuration key producer_ids_rate"),
        (42, "producer_byte_rate cannot be a fractional value."),
    ]
    assert server.enforcer.cfg.users["a"].producer_byte_rate == 5.0
    assert "b" not in server.enforcer.cfg.users  # stored only where both accepted


async def test_ip_host_names_are_resolved_for_kafkas_text() -> None:
    server = _server()
    service = server.quota_api
    assert service is not None
    body = _kafka_alter(
        ({"ip": "localhost"}, [("connection_creation_rate", 5.0)]),
        ({"ip": "no-such-host.invalid"}, [("connection_creation_rate", 5.0)]),
    )
    result = await service.validate(alterations_of(body))
    messages = [err.message for _e, err in result.results]
    assert messages[0] is not None and messages[0].startswith("kthrottle: localhost is a host name")
    assert messages[1] == "no-such-host.invalid is not a valid IP or resolvable host."


# --- admin HTTP ------------------------------------------------------------------------------


def _request(auth_header: str | None) -> web.Request:
    headers = {"Authorization": auth_header} if auth_header is not None else {}
    return make_mocked_request("POST", "/quotas/client-quotas", headers=headers)


def test_admin_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    auth = AdminAuth(AdminConfig(token_file=token_file))
    assert auth.check(_request(None)).status == 401  # type: ignore[union-attr]
    assert auth.check(_request("Bearer nope")).status == 403  # type: ignore[union-attr]
    assert auth.check(_request("Bearer first-token")) is None
    token_file.write_text("second-token-longer\n")  # re-read when the file changes
    assert auth.check(_request("Bearer first-token")).status == 403  # type: ignore[union-attr]
    assert auth.check(_request("Bearer second-token-longer")) is None


def test_no_token_file_refuses_changes_unless_allowed() -> None:
    refused = AdminAuth(AdminConfig()).check(_request("Bearer x"))
    assert refused is not None and refused.status == 403
    assert "admin.token_file" in refused.text  # type: ignore[operator]
    assert AdminAuth(AdminConfig(allow_unauthenticated_changes=True)).check(_request(None)) is None


async def test_http_describe_and_alter(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok")
    server = _server(GATEWAY + f"admin: {{token_file: {token_file}}}\n")
    client = TestClient(TestServer(build_app(server)))
    await client.start_server()
    try:
        body = {"entries": [{"entity": {"user": "bob"}, "ops": [{"key": "producer_byte_rate", "value": 64}]}]}
        assert (await client.post("/quotas/client-quotas", json=body)).status == 401
        resp = await client.post("/quotas/client-quotas", json=body, headers={"Authorization": "Bearer tok"})
        assert resp.status == 200
        assert (await resp.json())["entries"] == [
            {"entity": {"user": "bob"}, "error_code": "NONE", "error": None}
        ]
        auth = {"Authorization": "Bearer tok"}
        query = {"user": "*", "strict": "true"}
        assert (await client.get("/quotas/client-quotas", params=query)).status == 401  # it names users
        resp = await client.get("/quotas/client-quotas", params=query, headers=auth)
        entries = (await resp.json())["entries"]
        assert {"entity": {"user": "bob"}, "values": {"producer_byte_rate": 64.0}} in entries
        resp = await client.get("/quotas/client-quotas", params={"ip": "*", "user": "x"}, headers=auth)
        assert resp.status == 400
        bad = await client.post("/quotas/client-quotas", data=b"{", headers={"Authorization": "Bearer tok"})
        assert bad.status == 400
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("admin", "named", "expected"),
    [
        ("{}", None, 403),  # no token file: closed, and the message says how to open it
        ("{token_file: TOKEN}", None, 401),
        ("{token_file: TOKEN}", "Bearer wrong", 403),
        ("{token_file: TOKEN}", "Bearer tok", 200),
        ("{allow_unauthenticated_reads: true}", None, 200),
    ],
)
async def test_endpoints_that_name_users_need_the_token_and_probes_do_not(
    tmp_path: Path, admin: str, named: str | None, expected: int
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok")
    server = _server(GATEWAY + "admin: " + admin.replace("TOKEN", str(token_file)) + "\n")
    client = TestClient(TestServer(build_app(server)))
    await client.start_server()
    try:
        headers = {"Authorization": named} if named else {}
        for path in ("/quotas", "/quotas/entity?client_id=app", "/quotas/ip?ip=10.0.0.1", "/quotas/cluster"):
            resp = await client.get(path, headers=headers)
            assert resp.status == expected, (path, await resp.text())
            if expected == 403 and admin == "{}":
                assert "admin.allow_unauthenticated_reads" in (await resp.json())["error"]
        for path in ("/healthz", "/metrics", "/volume", "/cluster/peer"):  # probes and metrics: open
            assert (await client.get(path)).status in (200, 404), path
    finally:
        await client.close()


# --- CLI -----------------------------------------------------------------------------------


def test_cli_usage_and_unreachable_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://127.0.0.1:9"  # discard port: nothing listens
    assert main(["quotas", "alter", "--user", "a", "--admin-url", url]) == quota_cli.EXIT_USAGE
    assert main(["quotas", "alter", "--add", "x=1", "--admin-url", url]) == quota_cli.EXIT_USAGE
    assert (
        main(["quotas", "alter", "--user", "a", "--add", "x=fast", "--admin-url", url])
        == quota_cli.EXIT_USAGE
    )
    missing = str(tmp_path / "none")
    args = ["quotas", "alter", "--user", "a", "--add", "x=1", "--token-file", missing, "--admin-url", url]
    assert main(args) == quota_cli.EXIT_USAGE
    assert main(["quotas", "describe", "--admin-url", url, "--timeout", "2"]) == quota_cli.EXIT_UNREACHABLE
    with pytest.raises(SystemExit) as usage:
        main(["quotas", "frobnicate"])
    assert usage.value.code == 2
    assert "unreachable" in capsys.readouterr().err


def test_error_names_are_protocol_codes() -> None:
    for name in (
        "NONE",
        "INVALID_REQUEST",
        "UNSUPPORTED_VERSION",
        "CLUSTER_AUTHORIZATION_FAILED",
        "REQUEST_TIMED_OUT",
    ):
        assert ErrorCode[name] is not None
    assert (
        ops.encode_key(((ops.USER, None),), "producer_byte_rate") == b'[[["user",null]],"producer_byte_rate"]'
    )


def test_registered_secrets_are_masked_in_log_records(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from proxy import secrets

    secret = "pw-with-'quote'-ünï"
    secrets.register(secret)
    record = logging.LogRecord("aiokafka.conn", logging.DEBUG, "f", 1, "Request %s", (secret.encode(),), None)
    secrets.RedactSecrets().filter(record)
    assert "pw-with" not in record.getMessage() and secrets.MASK in record.getMessage()
    record = logging.LogRecord("x", logging.INFO, "f", 1, "login %r then %s", (secret, secret), None)
    secrets.RedactSecrets().filter(record)
    assert "pw-with" not in record.getMessage() and record.getMessage().count(secrets.MASK) == 2


def test_principals() -> None:
    from proxy.shared.quota_api import allowed, principal_of

    assert principal_of("ANONYMOUS") == "User:ANONYMOUS"
    assert allowed("User:alice", None)  # describers default: everyone
    assert not allowed("User:alice", [])  # admins default: nobody
    assert allowed("User:alice", ["User:admin", "User:alice"])
    assert allowed("User:ANONYMOUS", ["User:*"])
    assert not allowed("User:ANONYMOUS", ["User:admin"])


def test_every_exchange_of_one_process_shares_the_exchange_metrics() -> None:
    text = GATEWAY.replace(
        "quota_api:",
        "  clients: {spread: {producer_byte_rate: 100, scope: cluster}}\nvolume: {enabled: true}\nquota_api:",
    )
    server = ProxyServer(parse_config(text))  # three compacted topics, one registry: no duplicate
    assert server.cluster_quotas is not None and server.volume is not None and server.quota_api is not None
