"""KIP-546 through the proxy against a real broker: Kafka's config command and Java admin client
alter and describe the quotas the proxy enforces; an alteration made through one proxy throttles
live producers on every proxy instance; only admins alter; alterations survive a restart; in
forward mode the broker's own quotas are altered.

The session's SASL-enabled broker serves the module (its PLAINTEXT listener for ANONYMOUS clients,
its SASL_PLAINTEXT listener for the principal tests). Every proxy stores its overlay in a topic of
its own test, so tests never see each other's alterations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from dev.harness import KafkaCluster, run_tool
from dev.proxy_process import ProxyProcess, gateway_config
from dev.workloads import rate_between, steady_producer
from proxy.net.upstream_client import request
from tests.integration.conftest import SASL_USERS

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

JAVA_ADMIN = str(Path(__file__).parent / "java" / "QuotaAdmin.java")
USERS = SASL_USERS
WINDOW_NUM, WINDOW_SIZE_S = 5, 0.5  # a 2.5 s quota window: the tests' bound is two of them
WINDOW_S = WINDOW_NUM * WINDOW_SIZE_S
# A producer offered more than its quota has a full queue when the test stops it, and delivers it
# at the quota before it closes: 512 KiB of it, not librdkafka's 4 MiB (8-16 s measuring nothing).
QUEUE = {"extra": {"queue.buffering.max.kbytes": 512}}
KiB = 1024


@pytest.fixture(scope="module")
def cluster(kafka_sasl_broker: KafkaCluster) -> KafkaCluster:
    return kafka_sasl_broker


def _topic_name() -> str:
    return f"__kthrottle_quotas_test_{uuid.uuid4().hex[:8]}"


def _config(cluster: KafkaCluster, quota_topic: str, **overrides: Any) -> dict[str, Any]:
    quota_api = {"mode": "proxy", "admins": ["User:ANONYMOUS"], "topic": quota_topic}
    quota_api.update(overrides.pop("quota_api", {}))
    quotas = {
        "window": {"num": WINDOW_NUM, "size_seconds": WINDOW_SIZE_S},
        # Measured from the start, as a broker always measures: the API's quota lands on live rates.
        "clients": {"<default>": {"producer_byte_rate": 100 * 1024 * 1024}},
    }
    return gateway_config(cluster, quotas=quotas, quota_api=quota_api, **overrides)


def _sasl_config(cluster: KafkaCluster, quota_topic: str, **overrides: Any) -> dict[str, Any]:
    cfg = _config(cluster, quota_topic, **overrides)
    cfg["gateway"]["upstream_bootstrap"] = cluster.sasl_bootstrap_servers.split(",")
    cfg["upstream_sasl"] = {"username": "admin", "password": USERS["admin"]}
    return cfg


def _wait_store_ready(proxy: ProxyProcess, topic: str, timeout: float = 30.0) -> None:
    """Until the proxy follows its quota topic (alterations wait for it otherwise)."""
    deadline = time.monotonic() + timeout
    while proxy.metric("kthrottle_exchange_connected", {"topic": topic}) != 1:
        assert time.monotonic() < deadline, proxy.log_tail(30)
        time.sleep(0.2)


def _config_command(bootstrap: str, *args: str, props: Path | None = None) -> tuple[int, str, str]:
    extra = ("--command-config", str(props)) if props is not None else ()
    proc = run_tool("kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, *extra, *args)
    return proc.returncode, proc.stdout, proc.stderr


def _java_admin(bootstrap: str, props: Path | None, *args: str) -> list[str]:
    proc = run_tool(JAVA_ADMIN, bootstrap, str(props) if props else "-", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [line for line in proc.stdout.splitlines() if line.startswith(("RESULT", "ENTITY", "ERROR"))]


def _sasl_props(tmp_path: Path, user: str) -> Path:
    props = tmp_path / f"{user}.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{user}" password="{USERS[user]}";\n'
    )
    return props


def _raw(bootstrap: str, api_key: int, body: dict[str, Any]) -> dict[str, Any]:
    host, port = bootstrap.rsplit(":", 1)
    return asyncio.run(request(host, int(port), api_key, 1, body, 15.0))


def _entry(entity: dict[str, str | None], *ops: tuple[str, float | None]) -> dict[str, Any]:
    return {
        "entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
        "ops": [{"key": k, "value": v or 0.0, "remove": v is None} for k, v in ops],
    }


# --- Kafka's config command and Java admin client ----------------------------------------------


@pytest.mark.timeout(240)
def test_config_command_alters_and_describes_through_the_proxy(cluster: KafkaCluster, tmp_path: Path) -> None:
    topic = _topic_name()
    user = f"cc-{uuid.uuid4().hex[:6]}"
    with ProxyProcess(_config(cluster, topic), workdir=tmp_path) as proxy:
        _wait_store_ready(proxy, topic)
        code, out, err = _config_command(
            proxy.bootstrap,
            "--alter",
            "--add-config",
            "producer_byte_rate=1048576,controller_mutation_rate=5",
            "--entity-type",
            "users",
            "--entity-name",
            user,
        )
        assert code == 0, err[-1500:]
        assert f"Completed updating config for user {user}." in out
        code, out, err = _config_command(
            proxy.bootstrap,
            "--alter",
            "--add-config",
            "consumer_byte_rate=2048",
            "--entity-type",
            "users",
            "--entity-name",
            user,
            "--entity-type",
            "clients",
            "--entity-default",
        )
        assert code == 0, err[-1500:]
        code, out, err = _config_command(
            proxy.bootstrap, "--describe", "--entity-type", "users", "--entity-name", user
        )
        assert code == 0, err[-1500:]
        expected = "controller_mutation_rate=5.0, producer_byte_rate=1048576.0"
        assert f"Quota configs for user-principal '{user}' are {expected}" in out
        code, out, _err = _config_command(
            proxy.bootstrap,
            "--describe",
            "--entity-type",
            "users",
            "--entity-name",
            user,
            "--entity-type",
            "clients",
        )
        assert (
            f"Quota configs for user-principal '{user}', the default client-id are consumer_byte_rate=2048.0"
            in out
        )
        ip_alter = ("--alter", "--add-config", "connection_creation_rate=20", "--entity-type", "ips")
        assert _config_command(proxy.bootstrap, *ip_alter, "--entity-default")[0] == 0
        _code, out, _err = _config_command(proxy.bootstrap, "--describe", "--entity-type", "ips")
        assert "Quota configs for the default ip are connection_creation_rate=20.0" in out
        # The broker resolves a host name; the proxy matches addresses and says so.
        host = _config_command(proxy.bootstrap, *ip_alter, "--entity-name", "localhost")
        assert "InvalidRequestException: kthrottle: localhost is a host name; give its IP address" in host[2]
        # The file's quota is described too: the effective quotas.
        code, out, _err = _config_command(
            proxy.bootstrap, "--describe", "--entity-type", "clients", "--entity-default"
        )
        assert "Quota configs for the default client-id are producer_byte_rate=1.048576E8" in out
        # Enforced: the proxy's entity view resolves the user to the new quota.
        state = json.loads(proxy.admin_get(f"/quotas/entity?user={user}&client_id=any")[1])
        assert state["producer_byte_rate"]["quota"] == 1048576
        assert state["controller_mutation_rate"]["quota"] == 5
        # The broker itself was not altered (mode proxy).
        _code, out, _err = _config_command(cluster.bootstrap_servers, "--describe", "--entity-type", "users")
        assert user not in out

        # A value Kafka refuses: the same error line through the proxy as from the broker.
        bad = (
            "--alter",
            "--add-config",
            "producer_byte_rate=1.5",
            "--entity-type",
            "users",
            "--entity-name",
            user,
        )
        via_proxy = _config_command(proxy.bootstrap, *bad)
        via_broker = _config_command(cluster.bootstrap_servers, *bad)
        line = (
            "org.apache.kafka.common.errors.InvalidRequestException: "
            "producer_byte_rate cannot be a fractional value."
        )
        assert via_proxy[0] == via_broker[0] == 1
        assert line in via_proxy[2] and line in via_broker[2]

        # Every validation error, raw: the proxy answers entry for entry what the broker answers.
        cases = [
            _entry({"user": "x"}, ("no_such_key", 1.0)),
            _entry({"user": "x"}, ("producer_byte_rate", 0.0)),
            _entry({"user": "x"}, ("producer_byte_rate", 1e19)),
            _entry({"user": "x"}, ("request_percentage", 12.5)),
            _entry({"ip": "1.2.3.4"}, ("connection_creation_rate", 2.5)),
            _entry({"ip": "not-an-ip"}, ("connection_creation_rate", 2.0)),
            _entry({"ip": "1.2.3.4", "user": "x"}, ("connection_creation_rate", 2.0)),
            _entry({"client-id": "c"}, ("connection_creation_rate", 2.0)),
            _entry({"group": "g"}, ("producer_byte_rate", 2.0)),
            _entry({"user": ""}, ("producer_byte_rate", 2.0)),
            _entry({"user": "y", "client-id": "c"}, ("producer_byte_rate", 2.0), ("producer_byte_rate", 3.0)),
            _entry({"user": "z"}, ("anything", None)),
        ]
        for case in cases:  # one at a time: the broker's answer order is a HashMap's
            body = {"entries": [case], "validate_only": True}
            assert (
                _raw(proxy.bootstrap, 49, body)["entries"]
                == _raw(cluster.bootstrap_servers, 49, body)["entries"]
            )
        for components in (
            [{"entity_type": "user", "match_type": 0, "match": None}],
            [{"entity_type": "group", "match_type": 2, "match": None}],
            [
                {"entity_type": "ip", "match_type": 2, "match": None},
                {"entity_type": "user", "match_type": 2, "match": None},
            ],
        ):
            body = {"components": components, "strict": False}
            mine, theirs = _raw(proxy.bootstrap, 48, body), _raw(cluster.bootstrap_servers, 48, body)
            assert (mine["error_code"], mine["error_message"]) == (
                theirs["error_code"],
                theirs["error_message"],
            )


@pytest.mark.timeout(240)
def test_java_admin_alters_and_describes_through_the_proxy(cluster: KafkaCluster, tmp_path: Path) -> None:
    topic = _topic_name()
    user = f"java-{uuid.uuid4().hex[:6]}"
    with ProxyProcess(_config(cluster, topic), workdir=tmp_path) as proxy:
        _wait_store_ready(proxy, topic)
        entity = f"user={user},client-id=app"
        assert _java_admin(
            proxy.bootstrap, None, "alter", entity, "producer_byte_rate=4096", "request_percentage=12.5"
        ) == ["RESULT OK"]
        assert _java_admin(proxy.bootstrap, None, "validate", entity, "consumer_byte_rate=99") == [
            "RESULT OK"
        ]
        assert _java_admin(proxy.bootstrap, None, "describe", f"user={user}") == [
            f"ENTITY client-id=app,user={user} VALUES producer_byte_rate=4096.0,request_percentage=12.5"
        ]
        assert _java_admin(proxy.bootstrap, None, "alter", entity, "request_percentage=") == ["RESULT OK"]
        assert _java_admin(proxy.bootstrap, None, "describe", "--strict", f"user={user}", "client-id=*") == [
            f"ENTITY client-id=app,user={user} VALUES producer_byte_rate=4096.0"
        ]
        assert _java_admin(proxy.bootstrap, None, "alter", f"user={user}", "no_such_key=1") == [
            "RESULT InvalidRequestException Invalid configuration key no_such_key"
        ]
        # The proxy's own producer_ids_rate (KIP-936) is a user key here.
        assert _java_admin(proxy.bootstrap, None, "alter", f"user={user}", "producer_ids_rate=0.5") == [
            "RESULT OK"
        ]
        assert _java_admin(proxy.bootstrap, None, "alter", "ip=<default>", "connection_creation_rate=50") == [
            "RESULT OK"
        ]
        assert _java_admin(proxy.bootstrap, None, "describe", "ip=*") == [
            "ENTITY ip=<default> VALUES connection_creation_rate=50.0"
        ]
        # The admin HTTP sees the same store.
        status, text = proxy.admin_get(f"/quotas/client-quotas?user={user}&strict=true")
        assert status == 200
        assert json.loads(text)["entries"] == [
            {"entity": {"user": user}, "values": {"producer_ids_rate": 0.5}}
        ]


@pytest.mark.timeout(120)
def test_pipelined_requests_are_answered_in_order(cluster: KafkaCluster, tmp_path: Path) -> None:
    """Forwarded and locally answered requests written back to back on one connection come back
    in request order, and the describe after an alteration sees it."""
    import socket
    import struct

    from protocol import messages
    from protocol.frames import RequestHeader, encode_request_header, response_header_size

    topic = _topic_name()
    user = f"order-{uuid.uuid4().hex[:6]}"
    with ProxyProcess(_config(cluster, topic), workdir=tmp_path) as proxy:
        _wait_store_ready(proxy, topic)
        requests: list[tuple[int, int, dict[str, Any]]] = [
            (3, 12, {"topics": [], "allow_auto_topic_creation": False}),
            (
                49,
                1,
                {"entries": [_entry({"user": user}, ("producer_byte_rate", 777.0))], "validate_only": False},
            ),
            (18, 3, {"client_software_name": "t", "client_software_version": "1"}),
            (
                48,
                1,
                {"components": [{"entity_type": "user", "match_type": 0, "match": user}], "strict": True},
            ),
            (3, 12, {"topics": [], "allow_auto_topic_creation": False}),
        ]
        out = bytearray()
        for cid, (key, version, body) in enumerate(requests, start=100):
            frame: bytes | bytearray = encode_request_header(RequestHeader(key, version, cid, "order", 0))
            frame += messages.encode(key, version, body, response=False)
            out += struct.pack(">i", len(frame)) + frame
        host, port = proxy.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=20) as sock:
            sock.sendall(out)
            answers = []
            for key, version, _body in requests:
                (size,) = struct.unpack(">i", _read(sock, 4))
                frame = _read(sock, size)
                hsize = response_header_size(key, version, frame)
                cid = struct.unpack_from(">i", frame, 0)[0]
                answers.append((cid, messages.decode_response(key, version, memoryview(frame)[hsize:])))
        assert [cid for cid, _a in answers] == [100, 101, 102, 103, 104]
        assert answers[1][1]["entries"][0]["error_code"] == 0
        assert answers[3][1]["entries"] == [
            {
                "entity": [{"entity_type": "user", "entity_name": user}],
                "values": [{"key": "producer_byte_rate", "value": 777.0}],
            }
        ]
        advertised = {e["api_key"]: (e["min_version"], e["max_version"]) for e in answers[2][1]["api_keys"]}
        assert advertised[48] == (0, 1) and advertised[49] == (0, 1)


def _read(sock: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


# --- live producers on every instance ------------------------------------------------------------


@pytest.mark.timeout(300)
def test_new_quota_throttles_live_producers_on_every_instance_within_two_windows(
    cluster: KafkaCluster, tmp_path: Path
) -> None:
    """Three proxies share one store; a producer with client id ``live`` runs through each at
    2x the coming quota. The quota is altered through proxy 0 only; two windows later every
    producer is held to it (per instance, as a broker holds its own clients)."""
    quota, offered = 512 * KiB, 1024 * KiB
    topic = _topic_name()
    data_topic = f"live-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(data_topic, partitions=3)
    proxies = []
    stop = threading.Event()
    acked: list[list[tuple[float, int]]] = [[], [], []]
    threads: list[threading.Thread] = []
    try:
        for i in range(3):
            proxies.append(ProxyProcess(_config(cluster, topic), workdir=tmp_path / f"p{i}").start())
        for proxy in proxies:
            _wait_store_ready(proxy, topic)
        threads = [
            threading.Thread(
                target=steady_producer,
                args=(p.bootstrap, data_topic, "live", offered, stop, acked[i]),
                kwargs=QUEUE,
            )
            for i, p in enumerate(proxies)
        ]
        for t in threads:
            t.start()
        time.sleep(2 * WINDOW_S)
        before = time.monotonic()
        answer = _raw(
            proxies[0].bootstrap,
            49,
            {
                "entries": [_entry({"client-id": "live"}, ("producer_byte_rate", quota))],
                "validate_only": False,
            },
        )
        altered = time.monotonic()
        assert answer["entries"][0]["error_code"] == 0, answer
        time.sleep(4 * WINDOW_S)
        stop.set()
        for t in threads:
            t.join(60)
        rates_before = [rate_between(a, before - WINDOW_S, before) for a in acked]
        rates_after = [rate_between(a, altered + 2 * WINDOW_S, altered + 4 * WINDOW_S) for a in acked]
        series = [
            [round(rate_between(a, altered + s, altered + s + 1) / KiB) for s in range(-5, 20)] for a in acked
        ]
        log.info(
            "KiB/s per instance, last window before: %s; windows 3-4 after: %s; per second from -5 s: %s",
            [round(r / KiB) for r in rates_before],
            [round(r / KiB) for r in rates_after],
            series,
        )
        for i in range(3):
            assert rates_before[i] > 1.6 * quota, (i, rates_before, series)
            assert rates_after[i] < 1.25 * quota, (i, rates_after, series)
            assert rates_after[i] > 0.3 * quota, (i, rates_after, series)  # throttled, not stopped
            _status, text = proxies[i].admin_get("/quotas/entity?client_id=live")
            assert json.loads(text)["producer_byte_rate"]["quota"] == quota
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for p in proxies:
            with contextlib.suppress(Exception):
                p.stop()


@pytest.mark.timeout(240)
def test_alteration_survives_a_restart(cluster: KafkaCluster, tmp_path: Path) -> None:
    quota, offered = 256 * KiB, 512 * KiB
    topic = _topic_name()
    data_topic = f"restart-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(data_topic)
    cfg = _config(cluster, topic)
    proxy = ProxyProcess(cfg, workdir=tmp_path).start()
    try:
        _wait_store_ready(proxy, topic)
        code, _out, err = _config_command(
            proxy.bootstrap,
            "--alter",
            "--add-config",
            f"producer_byte_rate={quota}",
            "--entity-type",
            "clients",
            "--entity-name",
            "restarted",
        )
        assert code == 0, err[-1500:]
        proxy.stop()
        proxy.start()
        code, out, err = _config_command(
            proxy.bootstrap, "--describe", "--entity-type", "clients", "--entity-name", "restarted"
        )
        assert code == 0, err[-1500:]
        assert f"Quota configs for client-id 'restarted' are producer_byte_rate={float(quota)}" in out
        stop, acked = threading.Event(), []  # type: ignore[var-annotated]
        worker = threading.Thread(
            target=steady_producer,
            args=(proxy.bootstrap, data_topic, "restarted", offered, stop, acked),
            kwargs=QUEUE,
        )
        started = time.monotonic()
        worker.start()
        time.sleep(4 * WINDOW_S)
        stop.set()
        worker.join(60)
        rate = rate_between(acked, started + 2 * WINDOW_S, started + 4 * WINDOW_S)
        assert 0.3 * quota < rate < 1.25 * quota, rate
    finally:
        proxy.stop()


# --- principals --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_only_admins_alter(cluster: KafkaCluster, tmp_path: Path) -> None:
    topic = _topic_name()
    cfg = _sasl_config(cluster, topic, quota_api={"admins": ["User:admin"]})
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        _wait_store_ready(proxy, topic)
        alice, admin = _sasl_props(tmp_path, "alice"), _sasl_props(tmp_path, "admin")
        assert _java_admin(proxy.bootstrap, admin, "alter", "user=alice", "producer_byte_rate=1000") == [
            "RESULT OK"
        ]
        refused = _java_admin(proxy.bootstrap, alice, "alter", "user=alice", "producer_byte_rate=99999999")
        assert refused == ["RESULT ClusterAuthorizationException Cluster authorization failed."]
        # Describing is open to every principal, and shows the quota unchanged.
        assert _java_admin(proxy.bootstrap, alice, "describe", "user=alice") == [
            "ENTITY user=alice VALUES producer_byte_rate=1000.0"
        ]
        state = json.loads(proxy.admin_get("/quotas/entity?user=alice&client_id=x")[1])
        assert state["producer_byte_rate"]["quota"] == 1000
        assert (
            proxy.metric(
                "kthrottle_quota_api_alterations_total",
                {"source": "kafka", "result": "CLUSTER_AUTHORIZATION_FAILED"},
            )
            == 1
        )


@pytest.mark.timeout(120)
def test_unauthenticated_clients_meet_the_broker_not_the_proxy(cluster: KafkaCluster, tmp_path: Path) -> None:
    """On a listener that requires SASL, a client that has not logged in gets no quota answer
    from the proxy, even with every principal an admin: its request goes to the broker, which
    closes the connection as it does for any request before authentication."""
    topic = _topic_name()
    cfg = _sasl_config(cluster, topic, quota_api={"admins": ["User:*"]})
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        _wait_store_ready(proxy, topic)
        describe = {"components": [{"entity_type": "user", "match_type": 2, "match": None}], "strict": False}
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
            _raw(proxy.bootstrap, 48, describe)
        alter = {
            "entries": [_entry({"user": "mallory"}, ("producer_byte_rate", 1e9))],
            "validate_only": False,
        }
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
            _raw(proxy.bootstrap, 49, alter)
        admin = _sasl_props(tmp_path, "admin")
        assert _java_admin(proxy.bootstrap, admin, "describe", "user=mallory") == []


@pytest.mark.timeout(240)
def test_no_secrets_in_logs_metrics_or_quotas(cluster: KafkaCluster, tmp_path: Path) -> None:
    """DEBUG logging, SASL logins through the proxy, the proxy's own SASL login (discovery and
    the quota store), admin calls with the token: no secret shows up anywhere."""
    topic = _topic_name()
    token = f"admin-token-{uuid.uuid4().hex}"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    cfg = _sasl_config(cluster, topic, quota_api={"admins": ["User:admin"]}, log_level="DEBUG")
    cfg["admin"]["token_file"] = str(token_file)
    with ProxyProcess(cfg, workdir=tmp_path / "proxy") as proxy:
        _wait_store_ready(proxy, topic)
        admin_props = _sasl_props(tmp_path, "admin")
        assert _java_admin(
            proxy.bootstrap, admin_props, "alter", "user=alice", "producer_byte_rate=4096"
        ) == ["RESULT OK"]
        _java_admin(proxy.bootstrap, _sasl_props(tmp_path, "alice"), "describe", "user=alice")
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "alice",
                "sasl.password": USERS["alice"],
            }
        )
        producer.produce(f"secrets-{uuid.uuid4().hex[:6]}", b"x")
        producer.flush(15)
        url = f"http://127.0.0.1:{proxy.admin_port}/quotas/client-quotas"
        body = json.dumps(
            {"entries": [{"entity": {"user": "bob"}, "ops": [{"key": "producer_byte_rate", "value": 8}]}]}
        )
        req = urllib.request.Request(
            url,
            data=body.encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        wrong = urllib.request.Request(url, data=body.encode(), headers={"Authorization": f"Bearer {token}x"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(wrong, timeout=10)
        assert refused.value.code == 403
        views = [proxy.admin_get(path)[1] for path in ("/metrics", "/quotas", "/quotas/client-quotas")]
        log_text = proxy.log_text()
        assert "DEBUG" in log_text and "authenticated as alice" in log_text
        for secret in (token, USERS["admin"], USERS["alice"]):
            assert secret not in log_text
            for view in views:
                assert secret not in view


# --- forward and both --------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_forward_and_both_modes_alter_the_brokers_quotas(cluster: KafkaCluster, tmp_path: Path) -> None:
    fwd_user, both_user = f"fwd-{uuid.uuid4().hex[:6]}", f"both-{uuid.uuid4().hex[:6]}"
    both_topic = _topic_name()
    forward = ProxyProcess(
        _config(cluster, _topic_name(), quota_api={"mode": "forward"}), workdir=tmp_path / "f"
    )
    both = ProxyProcess(_config(cluster, both_topic, quota_api={"mode": "both"}), workdir=tmp_path / "b")
    try:
        forward.start()
        both.start()
        _wait_store_ready(both, both_topic)
        alter = ("--alter", "--add-config", "producer_byte_rate=3072", "--entity-type", "users")
        assert _config_command(forward.bootstrap, *alter, "--entity-name", fwd_user)[0] == 0
        assert _config_command(both.bootstrap, *alter, "--entity-name", both_user)[0] == 0
        _code, out, _err = _config_command(cluster.bootstrap_servers, "--describe", "--entity-type", "users")
        assert f"Quota configs for user-principal '{fwd_user}' are producer_byte_rate=3072.0" in out
        assert f"Quota configs for user-principal '{both_user}' are producer_byte_rate=3072.0" in out
        # Forward: the proxy holds nothing of it; both: the proxy applied it too.
        assert forward.admin_get("/quotas/client-quotas")[0] == 409
        _status, text = both.admin_get(f"/quotas/client-quotas?user={both_user}")
        assert json.loads(text)["entries"] == [
            {"entity": {"user": both_user}, "values": {"producer_byte_rate": 3072.0}}
        ]
        # Both: what the broker refuses is not applied by the proxy either, and the answer says why.
        assert _java_admin(both.bootstrap, None, "alter", f"user={both_user}", "producer_ids_rate=2") == [
            "RESULT InvalidRequestException Invalid configuration key producer_ids_rate"
        ]
        _status, text = both.admin_get(f"/quotas/client-quotas?user={both_user}")
        assert "producer_ids_rate" not in text
    finally:
        for user in (fwd_user, both_user):
            with contextlib.suppress(Exception):
                _config_command(
                    cluster.bootstrap_servers,
                    "--alter",
                    "--delete-config",
                    "producer_byte_rate",
                    "--entity-type",
                    "users",
                    "--entity-name",
                    user,
                )
        forward.stop()
        both.stop()
