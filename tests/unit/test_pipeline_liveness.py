"""A request the proxy has read is forwarded, answered or its connection closed: never left
waiting with the connection open. A real Pipeline on in-memory transports (fuzz/fakenet.py),
driven by hand for the cases found, and by seeded random client traffic (consumers, producers,
clients logging in with SASL; pipelined requests, throttles, waits, streamed answers, a clock
that jumps, a client or its broker hanging up) for the property."""

from __future__ import annotations

import gc
import logging
import random
import struct
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from dev.loadgen import record_batch
from fuzz.fakenet import FakeTransport, FuzzLoop
from fuzz.pipeline_target import _listener, in_memory_server
from protocol import messages
from protocol.frames import (
    FrameDecoder,
    RequestHeader,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_header_size,
)
from protocol.produce_scan import read_produce_acks
from proxy.config import parse_config
from proxy.net.pipeline_reads import UpstreamReads
from proxy.net.transports import ClientProtocol
from proxy.pipeline.connection import Pipeline
from proxy.pipeline.stages.group_requests import GroupRequestStage
from proxy.pipeline.stages.version_gate import VersionGate

SIDECAR = (
    "mode: sidecar\nsidecar: {listen_port: 19092, upstream: '127.0.0.1:9092'}\n"
    "admin: {enabled: false}\nmetadata_refresh_seconds: 3600\nsilent_connection_close_seconds: null\n"
)
# A burst of one join (two 1 s windows at 0.5/s): the second new member waits.
JOIN_RATE = (
    "quotas:\n  window: {num: 2, size_seconds: 1}\n  clients:\n    <default>: {join_group_rate: 0.5}\n"
)
CLIENT_ID = "kafka-python-3.0.12"  # consumers left at their default id share one bucket


class _Net:
    """A proxy on a loop whose clock moves when told, and the broker connections it opens."""

    def __init__(self, config: str, capture: bool = False) -> None:
        self.loop = FuzzLoop()
        self.errors: list[dict[str, object]] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.errors.append(ctx))
        self.server = in_memory_server(parse_config(config), self.loop, capture)
        self.upstreams: list[FakeTransport] = []
        self.loop.on_connection = self.upstreams.append

    def connect(self) -> tuple[Pipeline, FakeTransport]:
        listener = next(iter(self.server.listeners.values()), None) or _listener(self.server)
        protocol = ClientProtocol(lambda transport: Pipeline(self.server, listener, transport))
        client = FakeTransport(self.loop, protocol, ("127.0.0.1", 40000 + len(self.upstreams)))

        async def accept() -> None:
            protocol.connection_made(client)

        self.loop.run_until_complete(accept())
        assert protocol.pipeline is not None
        return protocol.pipeline, client


def _frame(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    payload = encode_request_header(RequestHeader(api_key, version, correlation_id, CLIENT_ID, 0))
    payload += messages.encode(api_key, version, body, response=False)
    return struct.pack(">i", len(payload)) + bytes(payload)


def _join(correlation_id: int) -> bytes:
    """A new member's JoinGroup v5."""
    return _frame(11, 5, correlation_id, _join_body(""))


def _correlation_ids(written: bytes | bytearray) -> list[int]:
    return [struct.unpack_from(">i", f, 4)[0] for f in FrameDecoder(2**31 - 1).feed(written)]


@pytest.fixture
def proxy_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="proxy")
    yield caplog


def test_a_held_request_whose_replay_fails_closes_its_connection(
    monkeypatch: pytest.MonkeyPatch, proxy_log: pytest.LogCaptureFixture
) -> None:
    """The second consumer's JoinGroup waits in the proxy for the shared join bucket; when the
    wait ends it is replayed from a timer, where a failure would otherwise close nothing and
    leave the client waiting, its reads paused, for good."""
    net = _Net(SIDECAR + JOIN_RATE)
    first, first_client = net.connect()
    first_client.send(_join(1) + _join(2))  # the bucket's burst, and some owed
    net.loop.settle()
    second, second_client = net.connect()
    second_client.send(_join(7))
    net.loop.settle()
    assert second.held and second.pause_reasons == ["throttle"], "the JoinGroup waits in the proxy"

    def failing(self: GroupRequestStage, req: object) -> bool:
        raise KeyError("a bug in a stage")

    monkeypatch.setattr(GroupRequestStage, "on_request", failing)
    net.loop.advance(30)
    net.loop.settle()

    assert second.closed and second_client.closed and second_client.lost
    assert second not in net.server.pipelines
    assert not first.closed, "only the connection whose request failed"
    failures = [r for r in proxy_log.records if "replaying a held request failed" in r.getMessage()]
    assert failures and failures[0].levelno == logging.ERROR and failures[0].exc_info is not None


def test_bytes_handed_over_while_the_upstream_connects_all_reach_it_in_order() -> None:
    """What TLS decrypted before the pipeline existed is handed over in one piece; past the
    decoder's first read it waits until the upstream is up, then every request goes, in order
    (it used to be written over the first bytes in the decoder's buffer and never sent)."""
    net = _Net(SIDECAR)
    pipeline, _client = net.connect()
    heartbeat = {"group_id": "g", "generation_id": 1, "member_id": "m-1"}
    data = b"".join(_frame(12, 3, i, heartbeat) for i in range(1, 2001))
    assert len(data) > 2 * 32 * 1024  # more than the decoder's 32 KiB scratch buffer takes at once

    async def hand_over() -> None:
        pipeline.feed(data)

    net.loop.run_until_complete(hand_over())
    net.loop.settle()
    (upstream,) = net.upstreams
    assert _correlation_ids(upstream.written) == list(range(1, 2001))
    assert not pipeline.closed and not net.errors


def test_bytes_handed_over_for_a_connection_over_its_rate_are_not_used() -> None:
    """KIP-612: a connection over its IP's connection rate is accepted and never read from;
    what TLS decrypted for it before the pipeline existed opens no upstream either."""
    net = _Net(SIDECAR + "quotas:\n  ips:\n    <default>: {connection_creation_rate: 0.1}\n")
    net.connect()  # within the rate
    held, _client = net.connect()
    assert held.pause_reasons == ["connection-rate"]

    async def hand_over() -> None:
        held.feed(_frame(12, 3, 1, {"group_id": "g", "generation_id": 1, "member_id": "m-1"}))

    net.loop.run_until_complete(hand_over())
    net.loop.settle()
    assert net.upstreams == [] and held.requests_in == 0


def test_a_failure_decoding_the_first_requests_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch, proxy_log: pytest.LogCaptureFixture
) -> None:
    """The first requests are decoded in the upstream connect's task once it is up: a failure
    there closes the connection instead of leaving its reads paused as "connecting"."""
    net = _Net(SIDECAR)
    pipeline, client = net.connect()

    def failing(self: VersionGate) -> None:
        raise RuntimeError("a bug in the request path")

    # The first stage, asked which API keys it reads for each new key and version (the compiled
    # pipeline's own methods cannot be patched).
    monkeypatch.setattr(VersionGate, "request_keys", failing)
    client.send(_frame(12, 3, 1, {"group_id": "g", "generation_id": 1, "member_id": "m-1"}))
    net.loop.settle()
    assert pipeline.closed and client.closed
    assert any("reading the first requests failed" in r.getMessage() for r in proxy_log.records)
    assert not any(isinstance(ctx.get("exception"), RuntimeError) for ctx in net.errors)


def test_a_closed_connection_is_freed_whole() -> None:
    """A connection is a web of cycles (transports and protocols, stages, the connect task):
    once it is closed, with a request still in flight or answered, by the proxy or by the
    client, the garbage collector must free all of it. A compiled class or coroutine that hides
    a reference from the collector, or shows it one twice, keeps every connection in memory for
    good (docs/architecture.md, "The compiled hot path")."""
    net = _Net(SIDECAR)
    heartbeat = {"group_id": "g", "generation_id": 1, "member_id": "m-1"}
    closed: set[int] = set()
    for n in range(4):
        pipeline, client = net.connect()
        client.send(_frame(12, 3, 1, heartbeat))
        net.loop.settle()
        assert pipeline.upstream is not None and len(pipeline.in_flight) == 1
        if n % 2:  # answered, then the client leaves
            net.upstreams[-1].send(struct.pack(">iii", 10, 1, 0) + b"\x00\x00")
            net.loop.settle()
            assert not pipeline.in_flight
            client.hang_up()
        else:  # closed by the proxy with the request in flight
            pipeline.close("test")
        net.loop.settle()
        assert pipeline.closed
        closed.add(id(pipeline))
    del pipeline, client
    net.upstreams.clear()  # the broker's ends, kept by the test
    gc.collect()
    assert [o for o in gc.get_objects() if type(o) is Pipeline and id(o) in closed] == []


# --- the property: random consumer traffic, every request answered in order -----------------

QUOTAS = """
quotas:
  window: {{num: 2, size_seconds: 1}}
  fetch_shaping: {shaping}
  max_throttle_ms: {bound}
  clients:
    <default>: {{consumer_byte_rate: 30000, request_percentage: 20, join_group_rate: 0.5,
                rejoin_group_rate: 0.5, sync_group_rate: 1, offset_commit_rate: 1}}
"""
# (config, capture attached): no quotas; fetch shaping bounded, unbounded; Kafka's shaping.
SETUPS = [
    (SIDECAR, False),
    (SIDECAR + QUOTAS.format(shaping="steady", bound=5000), True),
    (SIDECAR + QUOTAS.format(shaping="steady", bound="null"), False),
    (SIDECAR + QUOTAS.format(shaping="kafka", bound="null"), True),
]


def _fetch() -> dict[str, Any]:
    partition = {
        "partition": 0,
        "current_leader_epoch": -1,
        "fetch_offset": 0,
        "log_start_offset": -1,
        "partition_max_bytes": 1048576,
    }
    return {
        "replica_id": -1,
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 52428800,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [partition]}],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def _join_body(member: str) -> dict[str, Any]:
    return {
        "group_id": "g",
        "session_timeout_ms": 10000,
        "rebalance_timeout_ms": 300000,
        "member_id": member,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }


# (api key, version, body, weight)
Request = tuple[int, int, Callable[[], dict[str, Any]], int]
# What a consumer sends, by weight.
CONSUMER_REQUESTS: list[Request] = [
    (1, 11, _fetch, 10),
    (3, 8, lambda: {"topics": None}, 2),
    (10, 2, lambda: {"key": "g", "key_type": 0}, 1),
    (11, 5, lambda: _join_body(""), 1),
    (11, 5, lambda: _join_body("m-1"), 1),
    (14, 3, lambda: {"group_id": "g", "generation_id": 1, "member_id": "m-1", "assignments": []}, 1),
    (12, 3, lambda: {"group_id": "g", "generation_id": 1, "member_id": "m-1"}, 3),
    (8, 7, lambda: {"group_id": "g", "topics": []}, 2),
    (9, 5, lambda: {"group_id": "g", "topics": None}, 1),
    (2, 5, lambda: {"replica_id": -1, "topics": []}, 1),
]
FETCH_SIZES = [0, 0, 100, 5000, 40000, 70000, 200000]  # 64 KiB and up are streamed


_BATCHES: dict[int, bytes] = {}


def _batch(size: int) -> bytes:
    """A record batch of about ``size`` bytes (built once per size: the builder is slow)."""
    if size not in _BATCHES:
        _BATCHES[size] = record_batch(bytes(size), timestamp_ms=1_700_000_000_000)
    return _BATCHES[size]


def _produce(acks: int) -> Callable[[], dict[str, Any]]:
    def body() -> dict[str, Any]:
        size = random.choice([100, 5000, 40000, 70000, 200000])  # 64 KiB and up may be streamed
        partitions = [{"index": 0, "records": _batch(size)}]
        return {
            "transactional_id": None,
            "acks": acks,
            "timeout_ms": 30000,
            "topic_data": [{"name": "t", "partition_data": partitions}],
        }

    return body


def _new_name() -> str:
    return f"n{random.getrandbits(40)}"  # random.seed per scenario: the same names each run


def _create() -> dict[str, Any]:
    topic = {"name": _new_name(), "num_partitions": 3, "replication_factor": 1}
    return {
        "topics": [topic | {"assignments": [], "configs": []}],
        "timeout_ms": 1000,
        "validate_only": False,
    }


# What a producer and an admin client send, by weight.
PRODUCER_REQUESTS: list[Request] = [
    (0, 9, _produce(1), 10),
    (0, 9, _produce(0), 2),
    (0, 3, _produce(1), 2),
    (3, 12, lambda: {"topics": None, "allow_auto_topic_creation": False}, 1),
    (22, 4, lambda: {"transactional_id": None, "transaction_timeout_ms": 60000}, 2),
    (19, 7, _create, 1),
    (37, 3, lambda: {"topics": [{"name": "t", "count": 6, "assignments": None}], "timeout_ms": 1000}, 1),
    (20, 6, lambda: {"topics": [{"name": _new_name(), "topic_id": bytes(16)}], "timeout_ms": 1000}, 1),
]


def _split_sends(rng: random.Random, transport: FakeTransport, data: bytearray) -> None:
    """Sent as a socket may deliver it: whole, or cut anywhere."""
    while data:
        cut = len(data) if rng.random() < 0.7 else rng.randint(1, len(data))
        transport.send(bytes(data[:cut]))
        del data[:cut]


class _Client:
    """Up to five requests in flight, as kafka-python and librdkafka pipeline them, drawn from
    ``workload``; checks that the answers come in order (acks=0 Produce has none)."""

    def __init__(self, net: _Net, rng: random.Random, workload: list[Request]) -> None:
        self.rng, self.workload = rng, workload
        self.weights = [r[3] for r in workload]
        self.pipeline, self.transport = net.connect()
        self.correlation = 0
        self.waiting: list[int] = []
        self.decoder = FrameDecoder(2**31 - 1)
        self.read_to = 0
        self.errors: list[str] = []
        self.gone = False  # hung up, or its broker connection did

    def send_some(self) -> None:
        out = bytearray()
        for _ in range(self.rng.randint(1, 3)):
            if len(self.waiting) >= 5:
                break
            key, version, body, _weight = self.rng.choices(self.workload, self.weights)[0]
            self.correlation += 1
            request = body()
            out += _frame(key, version, self.correlation, request)
            if not (key == 0 and request["acks"] == 0):
                self.waiting.append(self.correlation)
        _split_sends(self.rng, self.transport, out)

    def read(self) -> None:
        data, self.read_to = self.transport.written[self.read_to :], len(self.transport.written)
        for frame in self.decoder.feed(data):
            got = struct.unpack_from(">i", frame, 0)[0]
            want = self.waiting.pop(0) if self.waiting else None
            if got != want:
                self.errors.append(f"answer {got} while waiting for {want}")
            self.answered(got, frame)

    def answered(self, correlation: int, frame: bytearray) -> None:
        """What the client does with an answer, past checking its order: nothing here."""


USERS = ["alice", "bob", "carol"]  # carol has no quota of her own: the <default> user's
MECHANISMS = ["PLAIN", "SCRAM-SHA-256"]
_SCRAM_NONCE = b"fyko+d2lbbFgONRv9qkxdawL"
# What the fake broker advertises in ApiVersions: (api key, min, max).
_BROKER_APIS = [(0, 3, 11), (1, 4, 17), (3, 0, 12), (17, 0, 1), (18, 0, 4), (36, 0, 2)]
# Login requests: (api key, version, body).
Step = tuple[int, int, dict[str, Any]]


class _SaslClient(_Client):
    """A client of a SASL listener: ApiVersions, SaslHandshake, then SaslAuthenticate (one round
    for PLAIN, two for SCRAM), each sent only once the one before is answered, as Kafka clients
    do; its workload only after. Late in the session the broker granted it logs in again
    (KIP-368): behind its requests in flight, as the Java client does, then nothing else until
    that login is answered. The proxy must have named the connection after each login."""

    def __init__(self, net: _Net, rng: random.Random, workload: list[Request], user: str) -> None:
        super().__init__(net, rng, workload)
        self.loop, self.user, self.mechanism = net.loop, user, rng.choice(MECHANISMS)
        self.steps: list[Step] = []  # the login's requests not sent yet
        self.step: tuple[int, int, int] | None = None  # (correlation, key, version) answer awaited
        self.logins = 0
        self.reauth_at = 0.0  # when the session runs out (inf: it never does)

    def _login(self, first: bool) -> None:
        if self.mechanism == "PLAIN":
            rounds = [b"\x00" + self.user.encode() + b"\x00secret"]
        else:
            nonce = _SCRAM_NONCE
            rounds = [
                b"n,,n=" + self.user.encode() + b",r=" + nonce,
                b"c=biws,r=" + nonce + b"srv,p=cHJvb2Y=",
            ]
        versions = {"client_software_name": "kafka-python", "client_software_version": "3.0"}
        self.steps = [(18, 3, versions)] if first else []
        self.steps += [(17, 1, {"mechanism": self.mechanism})] + [(36, 2, {"auth_bytes": b}) for b in rounds]
        self._next_step()

    def _next_step(self) -> None:
        key, version, body = self.steps.pop(0)
        self.correlation += 1
        self.step = (self.correlation, key, version)
        self.waiting.append(self.correlation)
        _split_sends(self.rng, self.transport, bytearray(_frame(key, version, self.correlation, body)))

    def send_some(self) -> None:
        if self.step is not None:
            return  # logging in
        if not self.logins:
            self._login(first=True)
        elif self.loop.time() >= self.reauth_at:
            self._login(first=False)
        else:
            super().send_some()

    def answered(self, correlation: int, frame: bytearray) -> None:
        if self.step is None or correlation != self.step[0]:
            return
        _correlation, key, version = self.step
        body = messages.decode_response(
            key, version, memoryview(frame)[response_header_size(key, version, frame) :]
        )
        if body["error_code"]:
            self.errors.append(f"login answered with error {body['error_code']}")
        if self.steps:
            self._next_step()
            return
        self.step = None
        self.logins += 1
        lifetime = body["session_lifetime_ms"] / 1000
        self.reauth_at = (
            self.loop.time() + lifetime * self.rng.uniform(0.85, 0.95) if lifetime else float("inf")
        )
        if self.pipeline.user != self.user:
            self.errors.append(f"logged in as {self.user}, the proxy says {self.pipeline.user}")


class _Broker:
    """Answers what reached it, in order, a few at a time; Fetch answers of random sizes; every
    login succeeds, its session lasting a random time (none, or a few seconds: KIP-368)."""

    def __init__(self, transport: FakeTransport, rng: random.Random) -> None:
        self.transport, self.rng = transport, rng
        self.decoder = FrameDecoder(2**31 - 1)
        self.read_to = 0
        self.todo: list[tuple[int, int, int, int]] = []  # key, version, correlation, SASL round
        self.mechanism, self.rounds = "", 0

    def answer(self, count: int) -> None:
        data, self.read_to = self.transport.written[self.read_to :], len(self.transport.written)
        for frame in self.decoder.feed(data):
            key, version, correlation = struct.unpack_from(">hhi", frame, 0)
            request = memoryview(frame)[parse_request_header(frame).size :]
            if key == 17:
                self.mechanism, self.rounds = messages.decode_request(key, version, request)["mechanism"], 0
            self.rounds += key == 36
            if key != 0 or read_produce_acks(version, request) != 0:  # acks=0: no answer
                self.todo.append((key, version, correlation, self.rounds))
        out = bytearray()
        for key, version, correlation, sasl_round in self.todo[:count]:
            body: dict[str, Any] = {}
            if key in (17, 18, 36):
                body = self._login_answer(key, sasl_round)
            elif key == 1:
                size = self.rng.choice(FETCH_SIZES)
                batch = struct.pack(">qi", 0, max(size, 61) - 12) + bytes(max(size, 61) - 12)
                partition = {
                    "partition_index": 0,
                    "high_watermark": 10,
                    "last_stable_offset": 10,
                    "log_start_offset": 0,
                    "aborted_transactions": [],
                    "preferred_read_replica": -1,
                    "records": batch if size else None,
                }
                body = {"responses": [{"topic": "t", "partitions": [partition]}]}
            payload = encode_response_header(key, version, correlation)
            payload += messages.encode_response(key, version, body)
            out += struct.pack(">i", len(payload)) + payload
        del self.todo[:count]
        _split_sends(self.rng, self.transport, out)

    def _login_answer(self, key: int, sasl_round: int) -> dict[str, Any]:
        if key == 18:
            apis = [{"api_key": k, "min_version": lo, "max_version": hi} for k, lo, hi in _BROKER_APIS]
            return {"error_code": 0, "api_keys": apis, "throttle_time_ms": 0}
        if key == 17:
            return {"error_code": 0, "mechanisms": MECHANISMS}
        last = self.mechanism == "PLAIN" or sasl_round >= 2
        if self.mechanism == "PLAIN":
            auth = b""
        elif sasl_round == 1:  # SCRAM's server-first message, then its server-final one
            auth = b"r=" + _SCRAM_NONCE + b"srv,s=c2FsdA==,i=4096"
        else:
            auth = b"v=c2lnbmF0dXJl"
        lifetime = self.rng.choice([0, 2000, 10000]) if last else 0
        return {"error_code": 0, "error_message": None, "auth_bytes": auth, "session_lifetime_ms": lifetime}


def _random_traffic(
    seed: int, config: str, capture: bool, workload: list[Request], sasl: bool = False, hangups: bool = False
) -> str | None:
    """One scenario (``seed`` alone decides it); what went wrong, or None. With ``sasl`` each
    client logs in first, as a user of its own; with ``hangups`` a client or its broker may hang
    up at any point."""
    rng = random.Random(seed)
    random.seed(seed)  # the request bodies' own choices
    net = _Net(config, capture)
    try:
        count = rng.randint(1, 3)
        clients: list[_Client]
        if sasl:
            clients = [_SaslClient(net, rng, workload, USERS[i]) for i in range(count)]
        else:
            clients = [_Client(net, rng, workload) for _ in range(count)]
        return _play(seed, net, rng, clients, hangups)
    finally:
        net.loop.close()


def _play(
    seed: int, net: _Net, rng: random.Random, clients: list[_Client], hangups: bool = False
) -> str | None:
    brokers: dict[int, _Broker] = {}

    def settle() -> None:
        net.loop.settle(2000)
        for transport in net.upstreams:
            pipeline = cast(UpstreamReads, transport.protocol).pipeline
            brokers.setdefault(id(pipeline), _Broker(transport, rng))
        for client in clients:
            client.read()

    settle()
    for _step in range(rng.randint(20, 200)):
        client, r = rng.choice(clients), rng.random()
        if client.gone:
            net.loop.advance(rng.choice([0.001, 0.05, 0.3, 1.0, 3.0]))
        elif hangups and r < 0.03:
            client.gone = True
            broker = brokers.get(id(client.pipeline))
            if broker is not None and rng.random() < 0.5:
                broker.transport.hang_up()  # the broker's side: a restart, an idle timeout
            else:
                client.transport.hang_up()
        elif r < 0.4:
            client.send_some()
        elif r < 0.8 and id(client.pipeline) in brokers:
            brokers[id(client.pipeline)].answer(rng.randint(1, 3))
        else:
            net.loop.advance(rng.choice([0.001, 0.05, 0.3, 1.0, 3.0]))
        settle()
    # The clients stop; the broker answers everything; the clock runs on (throttles, waits end).
    for _ in range(3000):
        if not any(c.waiting for c in clients if not c.gone):
            break
        for client in clients:
            if id(client.pipeline) in brokers and not client.gone:
                brokers[id(client.pipeline)].answer(100)
        net.loop.advance(0.5)
        settle()
    # The timers of connections gone (mutes, waits, held requests) run out too.
    net.loop.advance(60.0)
    settle()
    if net.errors:
        return f"seed {seed}: {net.errors[0].get('message')} {net.errors[0].get('exception')!r}"
    for client in clients:
        p = client.pipeline
        if client.errors:
            return f"seed {seed}: answers {client.errors[:3]}"
        if client.gone:
            # Either side's hang-up closes both, and the proxy lets the connection go.
            broker = brokers.get(id(p))
            if not (p.closed and client.transport.closed) or (broker and not broker.transport.closed):
                return f"seed {seed}: a hang-up left closed={p.closed} client={client.transport.closed}"
            if p in net.server.pipelines:
                return f"seed {seed}: a connection hung up is still among the server's pipelines"
            continue
        if client.waiting or p.closed:
            return (
                f"seed {seed}: unanswered {client.waiting[:5]}, "
                f"closed={p.closed} pauses={p.pause_reasons} held={len(p.held)} in_flight={len(p.in_flight)}"
            )
    return None


def _assert_every_seed(
    seeds: int, config: str, capture: bool, workload: list[Request], sasl: bool = False, hangups: bool = False
) -> None:
    runs = [_random_traffic(seed, config, capture, workload, sasl, hangups) for seed in range(seeds)]
    failures = [f for f in runs if f is not None]
    assert not failures, failures[:3]


@pytest.mark.parametrize("setup", range(len(SETUPS)), ids=["plain", "bounded", "unbounded", "kafka"])
def test_random_consumer_traffic_gets_every_answer_in_order(setup: int) -> None:
    _assert_every_seed(60, *SETUPS[setup], CONSUMER_REQUESTS)


PRODUCER_QUOTAS = """
quotas:
  window: {{num: 2, size_seconds: 1}}
  produce_shaping: {shaping}
  max_throttle_ms: {bound}
  users:
    <default>: {{producer_ids_rate: 1}}
  clients:
    <default>: {{producer_byte_rate: 30000, controller_mutation_rate: 2, request_percentage: 20}}
  topics:
    t: {{producer.byte.rate: 50000}}
"""
PRODUCER_SETUPS = [
    (SIDECAR, False),
    (SIDECAR + PRODUCER_QUOTAS.format(shaping="steady", bound=5000), True),
    (SIDECAR + PRODUCER_QUOTAS.format(shaping="kafka", bound="null"), False),
]


@pytest.mark.parametrize("setup", range(len(PRODUCER_SETUPS)), ids=["plain", "steady", "kafka"])
def test_random_producer_and_admin_traffic_gets_every_answer_in_order(setup: int) -> None:
    _assert_every_seed(40, *PRODUCER_SETUPS[setup], PRODUCER_REQUESTS)


# --- SASL: clients log in (PLAIN or SCRAM-SHA-256), then produce and fetch under user quotas --

SASL_QUOTAS = """
quotas:
  window: {{num: 2, size_seconds: 1}}
  fetch_shaping: {shaping}
  produce_shaping: {shaping}
  max_throttle_ms: {bound}
  users:
    alice: {{producer_byte_rate: 20000, consumer_byte_rate: 20000}}
    bob: {{producer_byte_rate: 40000, consumer_byte_rate: 30000, request_percentage: 20}}
    <default>: {{producer_byte_rate: 30000, consumer_byte_rate: 40000, request_percentage: 20}}
"""
SASL_SETUPS = [
    (SIDECAR, False),
    (SIDECAR + SASL_QUOTAS.format(shaping="steady", bound=5000), True),
    (SIDECAR + SASL_QUOTAS.format(shaping="steady", bound="null"), False),
    (SIDECAR + SASL_QUOTAS.format(shaping="kafka", bound="null"), True),
]
SASL_IDS = ["no-quotas", "bounded", "unbounded", "kafka"]
# What a logged-in producer and consumer send, by weight.
SASL_REQUESTS: list[Request] = [
    (0, 9, _produce(1), 6),
    (0, 9, _produce(0), 1),
    (1, 11, _fetch, 6),
    (3, 12, lambda: {"topics": None, "allow_auto_topic_creation": False}, 1),
]


@pytest.mark.parametrize("setup", range(len(SASL_SETUPS)), ids=SASL_IDS)
def test_random_sasl_traffic_gets_every_answer_in_order(setup: int) -> None:
    """The user a login names is known only once the broker accepts it, and re-logins come
    between throttled requests: no login, nor what follows it, may be left waiting."""
    _assert_every_seed(40, *SASL_SETUPS[setup], SASL_REQUESTS, sasl=True)


# --- hang-ups: a client, or its broker connection, gone at any point -------------------------


@pytest.mark.parametrize(
    ("workload", "setup"),
    [("consumer", 1), ("consumer", 3), ("producer", 1), ("sasl", 1)],
    ids=["consumer-bounded", "consumer-kafka", "producer-steady", "sasl-bounded"],
)
def test_a_hang_up_closes_its_connection_and_leaves_the_others_answered(workload: str, setup: int) -> None:
    """A connection whose client or broker hangs up, with requests held, muted, in flight or
    half read, is closed on both sides and let go; the other connections of the same client id
    (sharing its buckets, its holds) still get every answer, in order."""
    if workload == "consumer":
        _assert_every_seed(40, *SETUPS[setup], CONSUMER_REQUESTS, hangups=True)
    elif workload == "producer":
        _assert_every_seed(40, *PRODUCER_SETUPS[setup], PRODUCER_REQUESTS, hangups=True)
    else:
        _assert_every_seed(40, *SASL_SETUPS[setup], SASL_REQUESTS, sasl=True, hangups=True)
