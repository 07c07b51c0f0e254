"""Faults against the real broker and cluster (issue 8): a broker killed and restarted, a leader
moved, the proxy itself killed and restarted, a broker paused (SIGSTOP, as a network cut would
look to its peers), each under produce and consume load through the proxy; and an upstream that
accepts and never answers (the one fake here: a listener in the test).

What each test asserts is what a user would see: every message the producer was told was acked
is in the log exactly once and was consumed, clients got their own timeout errors, and the
proxy holds no connection once the client has gone. No timing is a pass/fail criterion.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dev.harness import KafkaCluster, free_port, run_tool
from dev.netns import NetnsUnavailable, NetworkNamespace
from dev.proc import open_fds
from dev.proxy_process import ProxyProcess, gateway_config
from dev.waiting import wait_until
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import SIZE, RequestHeader, encode_request_header, encode_response_header
from tests.tools import unavailable

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


# --- an upstream that accepts and never answers --------------------------------------------------


@dataclass
class _HoleConn:
    sock: socket.socket
    client_id: str | None = None  # from the first request's header
    eof: threading.Event = field(default_factory=threading.Event)


class BlackHole:
    """Accepts connections and answers nothing, except the proxy's own broker discovery (a
    Metadata request from client id ``kthrottle``), which it answers naming itself node 1, so
    the proxy is ready and does not keep probing. Reads each client connection to its end
    (``reads=True``, recording the EOF), or stops reading after its first request."""

    def __init__(self, reads: bool = True) -> None:
        self.reads = reads
        self.listener = socket.create_server(("127.0.0.1", 0))
        if not reads:  # small buffers: a few MiB the proxy sends stay in the proxy
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self.port: int = self.listener.getsockname()[1]
        self.conns: list[_HoleConn] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = _HoleConn(sock)
            with self._lock:
                self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def _serve(self, conn: _HoleConn) -> None:
        sock = conn.sock
        try:
            head = self._read_exactly(sock, 4)
            frame = self._read_exactly(sock, SIZE.unpack(head)[0]) if head else None
            if frame is None:
                conn.eof.set()
                return
            api_key, version, correlation_id, id_len = struct.unpack_from(">hhih", frame)
            conn.client_id = frame[10 : 10 + id_len].decode() if id_len >= 0 else ""
            if conn.client_id == "kthrottle" and api_key == ApiKey.METADATA:
                body = {
                    "throttle_time_ms": 0,
                    "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": self.port, "rack": None}],
                    "cluster_id": "black-hole",
                    "controller_id": 1,
                    "topics": [],
                }
                payload = encode_response_header(api_key, version, correlation_id)
                payload += messages.encode_response(api_key, version, body)
                sock.sendall(SIZE.pack(len(payload)) + payload)
            if not self.reads:
                return  # never read again (the socket stays open: closed at stop())
            while sock.recv(65536):
                pass
            conn.eof.set()
        except OSError:
            conn.eof.set()  # a reset is the end of the connection too

    def of(self, client_id: str) -> list[_HoleConn]:
        with self._lock:
            return [c for c in self.conns if c.client_id == client_id]

    def drain(self, conn: _HoleConn, timeout: float) -> bool:
        """Read a connection that was never read to its end; True if it ended (EOF or reset)."""
        conn.sock.settimeout(timeout)
        try:
            while conn.sock.recv(1 << 20):
                pass
        except TimeoutError:
            return False
        except OSError:
            pass
        return True

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        with self._lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.sock.close()


@pytest.fixture
def black_hole_proxy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[BlackHole, ProxyProcess]]:
    hole = BlackHole(reads=getattr(request, "param", True))
    cfg = {
        "mode": "sidecar",
        "bind_host": "127.0.0.1",
        "sidecar": {"listen_port": free_port(), "upstream": f"127.0.0.1:{hole.port}"},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "connect_timeout_seconds": 5,
        "metadata_refresh_seconds": 3600,
        "drain_seconds": 1,
    }
    try:
        with ProxyProcess(cfg, workdir=tmp_path) as proxy:
            status, body = proxy.admin_get("/readyz")
            assert status == 200, f"the black hole's discovery answer did not make the proxy ready: {body}"
            yield hole, proxy
    finally:
        hole.close()


def _assert_nothing_held(proxy: ProxyProcess, baseline_fds: int | None, what: str) -> None:
    """The connection gauge back to 0 and (given a baseline) the proxy's fds back to it."""
    assert proxy.proc is not None
    pid = proxy.proc.pid
    wait_until(
        lambda: proxy.metric("kthrottle_connections_active") == 0,
        30,
        lambda: f"{what}: connection gauge stays at {proxy.metric('kthrottle_connections_active')}",
    )
    wait_until(
        lambda: baseline_fds is None or open_fds(pid) <= baseline_fds,
        30,
        lambda: f"{what}: proxy holds {open_fds(pid)} fds, {baseline_fds} before the client came",
    )
    assert proxy.proc.poll() is None, f"the proxy died:\n{proxy.log_tail()}"


@pytest.mark.timeout(150)
def test_upstream_that_never_answers_times_out_on_the_clients_own_timeout(
    black_hole_proxy: tuple[BlackHole, ProxyProcess],
) -> None:
    """librdkafka and kafka-python each get their own timeout error through the proxy; once they
    have gone, every upstream connection the proxy opened for them is closed (the black hole sees
    EOF), the connection gauge is back to 0 and the proxy's fd count back to where it was."""
    from confluent_kafka import KafkaError, Producer
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    hole, proxy = black_hole_proxy
    assert proxy.proc is not None
    baseline_fds = open_fds(proxy.proc.pid)

    def librdkafka() -> None:
        errors: list[KafkaError | None] = []
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "client.id": "hole-librdkafka",
                "message.timeout.ms": 6000,
                "socket.timeout.ms": 3000,
                "api.version.request.timeout.ms": 3000,
            }
        )
        producer.produce("t", b"into the void", on_delivery=lambda err, _msg: errors.append(err))
        assert producer.flush(60) == 0, "librdkafka never reported the message's fate"
        assert [e and e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT], f"librdkafka got {errors}"
        assert hole.of("hole-librdkafka"), "librdkafka's requests never reached the upstream"
        producer.close()

    # The two clients side by side: each waits out its own timeouts.
    with ThreadPoolExecutor(1) as pool:
        librdkafka_done = pool.submit(librdkafka)
        kp = KafkaProducer(
            bootstrap_servers=proxy.bootstrap,
            client_id="hole-kafka-python",
            api_version=(3, 0, 0),  # no probe: the first request is the Metadata the send waits for
            max_block_ms=4000,
            request_timeout_ms=3000,
        )
        try:
            with pytest.raises(KafkaTimeoutError):
                kp.send("t", b"into the void").get(timeout=30)
        finally:
            # Nothing to flush; its sender waits on the Metadata in flight until forced closed.
            kp.close(timeout=1)
        assert hole.of("hole-kafka-python"), "kafka-python's requests never reached the upstream"
        librdkafka_done.result()

    for client_id in ("hole-librdkafka", "hole-kafka-python"):
        wait_until(
            lambda cid=client_id: all(c.eof.is_set() for c in hole.of(cid)),  # type: ignore[misc]
            30,
            lambda cid=client_id: (  # type: ignore[misc]
                f"{sum(not c.eof.is_set() for c in hole.of(cid))} of {len(hole.of(cid))} upstream "
                f"connections for {cid} still open after the client left"
            ),
        )
    _assert_nothing_held(proxy, baseline_fds, "after the clients left")


def _request_frame(api_key: int, version: int, correlation_id: int, client_id: str, body: bytes) -> bytes:
    payload = encode_request_header(RequestHeader(api_key, version, correlation_id, client_id, 0)) + body
    return SIZE.pack(len(payload)) + bytes(payload)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("black_hole_proxy", [False], indirect=True)
def test_upstream_that_stops_reading_is_released_when_the_client_leaves(
    black_hole_proxy: tuple[BlackHole, ProxyProcess],
) -> None:
    """The upstream stops reading (a hung broker), a client sends MiBs of requests until the
    proxy stops reading it (backpressure), then gives up and resets its connection: the proxy
    notices although it is not reading that client, and drops the upstream connection with its
    unsendable bytes instead of waiting forever for them to drain.

    (A client that closes gently with bytes still unsent is seen the same way once its kernel
    gives up on the orphaned socket and resets it; the reset here makes that immediate.)"""
    hole, proxy = black_hole_proxy
    assert proxy.proc is not None
    baseline_fds = open_fds(proxy.proc.pid)
    client = socket.create_connection(("127.0.0.1", proxy.ports["sidecar"]), timeout=10)
    client.sendall(_request_frame(ApiKey.API_VERSIONS, 0, 0, "hole-raw", b""))
    wait_until(lambda: bool(hole.of("hole-raw")), 30, "the client's first request never reached the upstream")
    # Metadata requests the proxy forwards byte for byte, 1 MiB each: the upstream reads none.
    frame = _request_frame(ApiKey.METADATA, 12, 1, "hole-raw", b"\x00" * MiB)
    client.settimeout(3)
    sent = 0
    with contextlib.suppress(TimeoutError):
        for _ in range(24):
            client.sendall(frame)
            sent += len(frame)
    assert sent >= 4 * MiB, f"only {sent} bytes went into the proxy"
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset
    _assert_nothing_held(proxy, baseline_fds, "after the client left a hung upstream")
    (conn,) = hole.of("hole-raw")
    assert hole.drain(conn, 30), "the proxy's upstream connection never ended"


# --- faults of a real cluster under load ----------------------------------------------------------


@pytest.fixture
def cluster(kafka_cluster3: KafkaCluster) -> Iterator[KafkaCluster]:
    """The session's 3-node cluster: these tests kill, pause and restart its nodes, so this module
    runs last of its users (conftest), and each test hands all three back running and ready."""
    down = [n.node_id for n in kafka_cluster3.nodes if not n.running]
    assert not down, f"nodes {down} of the shared cluster are down before the test"
    yield kafka_cluster3
    for node in kafka_cluster3.nodes:
        if not node.running:
            kafka_cluster3.start_node(node.node_id)
    _wait_all_nodes_ready(kafka_cluster3)


def _leaders(bootstrap: str, topic: str) -> tuple[dict[int, int], Any]:
    """partition -> leader node (-1 while there is none), and the whole Metadata answer."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    partitions = md.topics[topic].partitions if topic in md.topics else {}
    return {p: meta.leader for p, meta in partitions.items()}, md


def _direct_leaders(
    cluster: KafkaCluster, topic: str, want: Callable[[dict[int, int]], bool] | None = None
) -> dict[int, int]:
    """partition -> leader node, asked of the brokers directly (not through the proxy), once
    every partition has a leader (and ``want`` holds); a new topic's leaders take a moment."""
    running = ",".join(n.address for n in cluster.nodes if n.running)
    seen: dict[int, int] = {}

    def settled() -> bool:
        nonlocal seen
        seen = _leaders(running, topic)[0]
        return bool(seen) and all(leader >= 0 for leader in seen.values()) and (want is None or want(seen))

    wait_until(settled, 60, lambda: f"leaders of {topic}: {seen}")
    return seen


def _wait_all_nodes_ready(cluster: KafkaCluster, timeout: float = 90) -> None:
    cluster._wait_ready(cluster.nodes, {n.node_id for n in cluster.nodes}, time.monotonic() + timeout)


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Load:
    """An idempotent acks=all librdkafka producer and a consumer in a group, both through the proxy,
    running in threads. Each value is a unique id; what was acked and consumed is recorded."""

    bootstrap: str
    topic: str
    timeout_ms: int = 10000  # the clients' request and socket timeouts
    acked: dict[int, tuple[int, float]] = field(default_factory=dict)  # id -> (partition, when)
    failed: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    client_logs: list[str] = field(default_factory=list)  # librdkafka's log lines
    consumed: list[int] = field(default_factory=list)
    sent: int = 0
    _stop_producing: threading.Event = field(default_factory=threading.Event)
    _stop_consuming: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _crashes: list[BaseException] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.logger = logging.getLogger(f"faults.librdkafka.{self.topic}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(_ListHandler(self.client_logs))

    def __enter__(self) -> Load:
        for target in (self._produce, self._consume):
            thread = threading.Thread(target=self._guard, args=(target,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for thread in self._threads:
            thread.join(60)

    def _guard(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # surfaced by finish()
            self._crashes.append(exc)

    def _error(self, err: Any) -> None:
        with self._lock:
            self.client_errors.append(str(err))

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": "faults-producer",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "request.timeout.ms": self.timeout_ms,
                "message.timeout.ms": 180000,  # spans any outage here: nothing is given up on
                "socket.timeout.ms": self.timeout_ms,  # a request to a hung broker times out after this
                "error_cb": self._error,
                "logger": self.logger,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            ident = int(msg.value())
            if err is None:
                self.acked[ident] = (msg.partition(), time.monotonic())
            else:
                self.failed.append(f"{ident}: {err}")

        i = 0
        while not self._stop_producing.is_set():
            try:
                producer.produce(self.topic, str(i).encode(), on_delivery=delivered)
                i += 1
                self.sent = i
            except BufferError:
                producer.poll(0.1)
            producer.poll(0)
            time.sleep(0.005)
        remaining = producer.flush(240)
        if remaining:
            self.failed.append(f"{remaining} messages never delivered nor failed")

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": "faults-consumer",
                "group.id": f"faults-{self.topic}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 500,
                "socket.timeout.ms": self.timeout_ms,  # a request to a hung broker times out after this
                "error_cb": self._error,
                "logger": self.logger,
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self._stop_consuming.is_set():
                for msg in consumer.consume(num_messages=500, timeout=0.5):
                    value = msg.value()
                    if msg.error() is None and value:
                        self.consumed.append(int(value))
        finally:
            consumer.close()

    def run_for(self, seconds: float) -> None:
        """Let the load run; fail early if a client thread died."""
        time.sleep(seconds)
        assert not self._crashes, f"a client thread died: {self._crashes!r}"

    def acked_since(self, when: float, partitions: set[int] | None = None) -> int:
        return sum(
            1 for p, t in list(self.acked.values()) if t > when and (partitions is None or p in partitions)
        )

    def finish(self) -> None:
        """Stop producing (delivering all in flight), then wait until the consumer has every acked id."""
        self._stop_producing.set()
        self._threads[0].join(300)
        assert not self._threads[0].is_alive(), "the producer never finished flushing"
        assert not self._crashes, f"a client thread died: {self._crashes!r}"
        acked = set(self.acked)
        wait_until(
            lambda: acked <= set(self.consumed),
            120,
            lambda: (
                f"the consumer through the proxy never got {len(acked - set(self.consumed))} acked messages"
            ),
        )
        self._stop_consuming.set()
        self._threads[1].join(60)


def _log_counts(bootstrap: str, topic: str) -> Counter[int]:
    """Every id in the topic's log, read from the start of each partition through the proxy."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        counts: Counter[int] = Counter()
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 120
        while len(done) < len(ends):
            assert time.monotonic() < deadline, (
                f"reading {topic} back: partitions {set(ends) - done} unfinished"
            )
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                if msg.error() is None and partition is not None and offset is not None and value:
                    counts[int(value)] += 1
                    if offset + 1 >= ends[partition]:
                        done.add(partition)
        return counts
    finally:
        consumer.close()


def _assert_exactly_once(load: Load, proxy: ProxyProcess) -> None:
    """Every acked id is in the log exactly once and was consumed; no id is in the log twice."""
    counts = _log_counts(proxy.bootstrap, load.topic)
    missing = sorted(set(load.acked) - set(counts))
    duplicated = sorted(i for i, n in counts.items() if n > 1)
    unconsumed = sorted(set(load.acked) - set(load.consumed))
    print(
        f"{load.topic}: {load.sent} sent, {len(load.acked)} acked, {len(load.failed)} failed, "
        f"{len(counts)} in the log, {len(load.consumed)} consumed (with redeliveries); "
        f"client errors seen: {sorted(set(load.client_errors))[:6]}; "
        f"request timeouts logged: {sum('Timed out' in line for line in load.client_logs)}"
    )
    assert not missing, f"{len(missing)} acked messages are not in the log, e.g. {missing[:10]}"
    assert not duplicated, f"{len(duplicated)} messages are in the log twice, e.g. {duplicated[:10]}"
    assert not unconsumed, f"{len(unconsumed)} acked messages never consumed, e.g. {unconsumed[:10]}"
    assert not load.failed, f"deliveries failed: {load.failed[:5]}"


@contextlib.contextmanager
def _proxied_load(
    cluster: KafkaCluster, topic: str, workdir: Path, timeout_ms: int = 10000
) -> Iterator[tuple[ProxyProcess, Load]]:
    """A gateway proxy in front of the cluster with a Load through it; once the clients have
    closed, the proxy must hold none of their connections (gauge and fds back to the start)."""
    with ProxyProcess(gateway_config(cluster), workdir=workdir) as proxy:
        assert proxy.proc is not None
        baseline_fds = open_fds(proxy.proc.pid)
        with Load(proxy.bootstrap, topic, timeout_ms) as load:
            yield proxy, load
        _assert_nothing_held(proxy, baseline_fds, "after the clients left")


def _new_topic(cluster: KafkaCluster, prefix: str, partitions: int = 3, replication: int = 3) -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.create_topic(topic, partitions=partitions, replication=replication)
    return topic


@pytest.mark.timeout(240)
def test_broker_killed_and_restarted_under_load(cluster: KafkaCluster, tmp_path: Path) -> None:
    """SIGKILL a broker while an idempotent acks=all producer and a group consumer run through
    the proxy, then start it again. The topic has one replica per partition, so the partition on
    that broker has nowhere else to go: its messages wait in the producer (the proxy refuses
    connections for the dead broker's port, the client retries) while the other partitions go
    on, and are delivered once the broker is back, through the proxy. Every acked message is in
    the log and consumed exactly once, none failed, and those produced after the restart too."""
    topic = _new_topic(cluster, "kill", partitions=3, replication=1)
    leaders = _direct_leaders(cluster, topic)
    victim = leaders[0]
    led = {p for p, node in leaders.items() if node == victim}
    others = set(leaders) - led
    with _proxied_load(cluster, topic, tmp_path) as (proxy, load):
        load.run_for(3)
        assert load.acked, f"nothing acked before the fault:\n{proxy.log_tail()}"
        cluster.stop_node(victim, kill=True)
        killed = time.monotonic()
        load.run_for(3)
        cluster.start_node(victim)
        restarted = time.monotonic()
        wait_until(
            lambda: load.acked_since(restarted, led) >= 50 and load.acked_since(restarted) >= 100,
            90,
            lambda: (
                f"{load.acked_since(restarted, led)} acks on the restarted broker's partitions {led}, "
                f"{load.acked_since(restarted)} in all, after the restart:\n{proxy.log_tail()}"
            ),
        )
        if others:
            assert load.acked_since(killed, others), "the other brokers' partitions stalled too"
        load.finish()
        _assert_exactly_once(load, proxy)
        assert proxy.proc is not None and proxy.proc.poll() is None


@pytest.mark.timeout(240)
def test_leader_moves_and_clients_follow_through_the_proxy(cluster: KafkaCluster, tmp_path: Path) -> None:
    """Reorder a partition's replicas with kafka-reassign-partitions and run a preferred leader
    election with kafka-leader-election, under load: Metadata through the proxy names the new
    leader at its proxy port, producing goes on to it, and nothing acked is lost."""
    topic = _new_topic(cluster, "move", partitions=1)
    old = _direct_leaders(cluster, topic)[0]
    new = next(n.node_id for n in cluster.nodes if n.node_id != old)
    with _proxied_load(cluster, topic, tmp_path) as (proxy, load):
        load.run_for(3)
        plan = tmp_path / "reassign.json"
        replicas = [new] + [n.node_id for n in cluster.nodes if n.node_id != new]
        plan.write_text(
            f'{{"version":1,"partitions":[{{"topic":"{topic}","partition":0,"replicas":{replicas}}}]}}'
        )
        for main_class, *args in (
            (
                "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                "--reassignment-json-file",
                str(plan),
                "--execute",
            ),
            (
                "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                "--reassignment-json-file",
                str(plan),
                "--verify",
            ),
            (
                "org.apache.kafka.tools.LeaderElectionCommand",
                "--election-type",
                "PREFERRED",
                "--topic",
                topic,
                "--partition",
                "0",
            ),
        ):
            done = run_tool(main_class, "--bootstrap-server", cluster.bootstrap_servers, *args)
            assert done.returncode == 0, f"{main_class} {args} failed:\n{done.stdout}\n{done.stderr}"
        moved = time.monotonic()
        _direct_leaders(cluster, topic, lambda leaders: leaders[0] == new)
        through_proxy: list[Any] = []

        def proxy_names_new_leader() -> bool:
            leaders, md = _leaders(proxy.bootstrap, topic)
            through_proxy[:] = [leaders, md]
            return leaders.get(0) == new

        wait_until(
            proxy_names_new_leader,
            30,
            lambda: f"Metadata through the proxy names leaders {through_proxy[:1]}, the brokers {new}",
        )
        md = through_proxy[1]
        proxy_ports = {f"broker-{n.node_id}": n.node_id for n in cluster.nodes}
        named = {(str(b.host), b.port) for b in md.brokers.values()}
        assert named == {("127.0.0.1", proxy.ports[name]) for name in proxy_ports}, (
            f"Metadata through the proxy names {named}, not the proxy's broker ports"
        )
        assert md.brokers[new].port == proxy.ports[f"broker-{new}"]
        wait_until(
            lambda: load.acked_since(moved) >= 100,
            90,
            lambda: f"only {load.acked_since(moved)} acks after the move:\n{proxy.log_tail()}",
        )
        load.finish()
        _assert_exactly_once(load, proxy)
        assert proxy.metric("kthrottle_connections_total", {"listener": f"broker-{new}"}) >= 1


@pytest.mark.timeout(240)
def test_proxy_killed_and_restarted_under_load(cluster: KafkaCluster, tmp_path: Path) -> None:
    """SIGKILL the proxy under load and start a new one on the same ports: the clients reconnect
    by themselves, and every acked message is in the log and consumed exactly once."""
    topic = _new_topic(cluster, "restart")
    proxy = ProxyProcess(gateway_config(cluster), workdir=tmp_path).start()
    try:
        with Load(proxy.bootstrap, topic) as load:
            load.run_for(3)
            assert load.acked, f"nothing acked before the fault:\n{proxy.log_tail()}"
            assert proxy.proc is not None
            proxy.proc.kill()
            proxy.proc.wait(30)
            load.run_for(2)
            proxy.start()  # the same config, so the same ports
            restarted = time.monotonic()
            wait_until(
                lambda: load.acked_since(restarted) >= 100,
                90,
                lambda: f"only {load.acked_since(restarted)} acks after the restart:\n{proxy.log_tail()}",
            )
            load.finish()
            _assert_exactly_once(load, proxy)
        _assert_nothing_held(proxy, None, "after the clients left the restarted proxy")
    finally:
        proxy.stop()


@pytest.mark.timeout(240)
def test_broker_paused_under_load(cluster: KafkaCluster, tmp_path: Path) -> None:
    """SIGSTOP the broker leading a partition (to the proxy and the cluster, a cut network: the
    connections stay open and nothing answers): the controller fences it and moves the
    leadership, the producer's requests to it time out and are retried on the new leader through
    the proxy; after SIGCONT the broker rejoins, and nothing acked is lost or doubled."""

    topic = _new_topic(cluster, "pause")
    leaders = _direct_leaders(cluster, topic)
    victim = leaders[0]
    led = {p for p, node in leaders.items() if node == victim}
    node = cluster.node(victim)
    with _proxied_load(cluster, topic, tmp_path) as (proxy, load):
        load.run_for(3)
        assert load.acked, f"nothing acked before the fault:\n{proxy.log_tail()}"
        cluster._signal(node, signal.SIGSTOP)
        try:
            paused = time.monotonic()
            # Held until the partitions it led take writes again: leadership moved, and the
            # producer found the new leader through the proxy while the old one hangs.
            wait_until(
                lambda: load.acked_since(paused, led) >= 20,
                120,
                lambda: f"partitions {led} of the paused broker took no writes:\n{proxy.log_tail()}",
            )
        finally:
            cluster._signal(node, signal.SIGCONT)
        resumed = time.monotonic()
        timeouts = [line for line in load.client_logs if "Timed out" in line]
        assert timeouts, "no client request to the paused broker timed out: " + "\n".join(
            load.client_logs[-20:]
        )
        _wait_all_nodes_ready(cluster)
        wait_until(
            lambda: load.acked_since(resumed) >= 100,
            90,
            lambda: f"only {load.acked_since(resumed)} acks after SIGCONT:\n{proxy.log_tail()}",
        )
        load.finish()
        _assert_exactly_once(load, proxy)


@pytest.fixture
def netns() -> Iterator[NetworkNamespace]:
    try:
        namespace = NetworkNamespace()
        with namespace:
            yield namespace
    except NetnsUnavailable as exc:
        unavailable(f"no network namespace here (needs root): {exc}")


@pytest.mark.timeout(240)
def test_network_to_the_broker_cut_and_healed_under_load(netns: NetworkNamespace, tmp_path: Path) -> None:
    """A broker in a network namespace of its own, the proxy and the clients outside: the link
    between them is cut for 9 s, twice the clients' request timeout (packets dropped, as with a
    pulled cable: no reset, nothing answers) and healed. The clients' own timeouts notice the cut,
    the proxy keeps serving its admin endpoint, writes resume through the proxy after the heal,
    and every acked message is in the log and consumed exactly once."""
    with KafkaCluster(brokers=1, workdir=tmp_path / "kafka", netns=netns) as cluster:
        topic = _new_topic(cluster, "cut", partitions=3, replication=1)
        with _proxied_load(cluster, topic, tmp_path / "proxy", timeout_ms=4000) as (proxy, load):
            load.run_for(3)
            assert load.acked, f"nothing acked before the cut:\n{proxy.log_tail()}"
            netns.cut()
            try:
                cut_at = time.monotonic()
                load.run_for(9)
                assert proxy.admin_get("/healthz")[0] == 200
                acked_while_cut = load.acked_since(cut_at + 3)  # what was on the wire may land first
            finally:
                netns.heal()
            healed = time.monotonic()
            assert acked_while_cut == 0, f"{acked_while_cut} messages acked across a cut network"
            wait_until(
                lambda: load.acked_since(healed) >= 100,
                120,
                lambda: f"only {load.acked_since(healed)} acks after the heal:\n{proxy.log_tail()}",
            )
            noticed = [line for line in load.client_logs if "Timed out" in line] + load.client_errors
            assert noticed, "no client noticed the cut: " + "\n".join(load.client_logs[-20:])
            load.finish()
            _assert_exactly_once(load, proxy)
