"""Real-broker harness: Apache Kafka in KRaft combined mode on free loopback ports.

Integration tests, benches and manual demos need real brokers, started the way Kafka's own ``bin/``
scripts start them, from the jars that ``dev/setup.sh`` resolves (``$KTHROTTLE_KAFKA_LIBS``).

    python -m dev.harness start --brokers 3       # run a cluster until Ctrl-C / SIGTERM
    python -m dev.harness tool TopicCommand --bootstrap-server 127.0.0.1:9092 --list
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from dev.waiting import wait_until

if TYPE_CHECKING:
    from dev.netns import NetworkNamespace

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
LOG4J_STDERR = _HERE / "log4j2-stderr.properties"
LOG4J_FILE = _HERE / "log4j2-file.properties"

#: Short names accepted wherever a main class is expected (CLI ``tool``, ``run_tool``, ``java_command``).
TOOL_ALIASES: dict[str, str] = {
    "ProducerPerformance": "org.apache.kafka.tools.ProducerPerformance",
    "ConsumerPerformance": "org.apache.kafka.tools.ConsumerPerformance",
    "TopicCommand": "org.apache.kafka.tools.TopicCommand",
    "ConfigCommand": "kafka.admin.ConfigCommand",
    "StorageTool": "kafka.tools.StorageTool",
    "MetadataQuorumCommand": "org.apache.kafka.tools.MetadataQuorumCommand",
    "ConsumerGroupCommand": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
}

#: How long a SIGTERMed broker gets for its controlled shutdown before SIGKILL.
STOP_GRACE_SECONDS = 30.0


class KafkaHarnessError(RuntimeError):
    """The jars are missing, a tool failed, or a broker did not come up (message carries its log tail)."""


# --- small helpers -----------------------------------------------------------------------------------------

_ports_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A loopback port nobody listens on now; never the same one twice per process, so nodes don't
    collide, nor across the processes that share a ``KTHROTTLE_PORT_REGISTRY`` directory (the two
    pytest runs side by side of dev/test.sh). Without it a port one run keeps unbound on purpose
    (an unreachable broker) can be handed to the other run's proxy, and the first run's clients
    then connect to that proxy."""
    registry = os.environ.get("KTHROTTLE_PORT_REGISTRY")
    with _ports_lock:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port in _ports_handed_out:
                continue
            _ports_handed_out.add(port)
            if registry and not _claim(Path(registry), port):
                continue  # another process of this run has it
            return port
    raise KafkaHarnessError("could not find a free loopback port")


def _claim(registry: Path, port: int) -> bool:
    """Record ``port`` as handed out in ``registry``; False when another process did first."""
    registry.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(registry / str(port), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def kafka_libs() -> Path:
    """The directory of Kafka jars resolved by dev/setup.sh; fail early with the fix if it is not there."""
    value = os.environ.get("KTHROTTLE_KAFKA_LIBS")
    if not value:
        raise KafkaHarnessError(
            "KTHROTTLE_KAFKA_LIBS is not set: run `source dev/setup.sh` from the repository root first"
        )
    libs = Path(value)
    if not libs.is_dir() or not any(libs.glob("kafka_2.13-*.jar")):
        raise KafkaHarnessError(
            f"KTHROTTLE_KAFKA_LIBS={libs} holds no kafka_2.13 jar: run `source dev/setup.sh` again"
        )
    return libs


def _java() -> str:
    """JAVA_HOME's java if set (as Kafka's scripts do), else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java") or "java"


def _javac() -> str:
    """The javac beside the java that runs the tools, so classes and runtime agree."""
    beside = Path(_java()).resolve().parent / "javac"
    return str(beside) if beside.exists() else shutil.which("javac") or "javac"


def compiled_java_source(source: Path) -> tuple[Path, str]:
    """Compile a single-file Java program against the Kafka jars once, and reuse the classes.

    ``java File.java`` compiles in memory at every launch (about a CPU-second each on a 2-core box);
    the classes are kept under the cache, keyed by the source and the jar directory, so a test that
    runs a small admin program twenty times compiles it once. Returns (class directory, main class).
    """
    libs = kafka_libs()
    key = hashlib.sha256(source.read_bytes() + str(libs).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("KTHROTTLE_CACHE", Path.home() / ".cache" / "kthrottle"))
    classes = cache / "java-classes" / f"{source.stem}-{key}"
    done = classes / ".complete"
    if not done.exists():
        classes.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{source.stem}-", dir=classes.parent))
        proc = subprocess.run(
            [_javac(), "-nowarn", "-d", str(building), "-cp", f"{libs}/*", str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            raise KafkaHarnessError(f"javac {source} failed:\n{proc.stdout}{proc.stderr}")
        (building / ".complete").touch()
        try:
            building.rename(classes)  # atomic: a parallel compile of the same key simply loses
        except OSError:
            shutil.rmtree(building, ignore_errors=True)
    return classes, source.stem


def java_command(main_class: str, *args: str, heap: str = "512m", log_dir: Path | None = None) -> list[str]:
    """The java command line Kafka's bin/ scripts would build, with a small heap for a 2-core test box.

    Logging goes to ``<log_dir>/server.log`` at INFO when ``log_dir`` is given (brokers), else to stderr at
    WARN (tools), so tool stdout stays parseable. A ``.java`` path runs that single-file program, compiled
    once (``compiled_java_source``).
    """
    cmd = [_java(), f"-Xmx{heap}"]
    if log_dir is None and os.environ.get("KTHROTTLE_QUICK_TOOLS") == "1":
        # Short-lived tools in the test suite: the C1 compiler only and the serial collector save
        # about a CPU-second per launch on a 2-core machine; benchmarks keep the full JIT.
        cmd += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    else:
        cmd += [
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExplicitGCInvokesConcurrent",
        ]
    cmd.append("-Djava.awt.headless=true")
    if log_dir is None:
        cmd.append(f"-Dlog4j2.configurationFile={LOG4J_STDERR}")
    else:
        cmd += [
            f"-Dlog4j2.configurationFile={LOG4J_FILE}",
            f"-Dkthrottle.log.dir={log_dir}",
            f"-Dkafka.logs.dir={log_dir}",
        ]
    classpath = f"{kafka_libs()}/*"
    if main_class.endswith(".java"):
        classes, main_class = compiled_java_source(Path(main_class))
        classpath = f"{classes}{os.pathsep}{classpath}"
    cmd += ["-cp", classpath, TOOL_ALIASES.get(main_class, main_class), *args]
    return cmd


def run_tool(main_class: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's Java tools from the same jars as the broker and capture its output (no check)."""
    return subprocess.run(
        java_command(main_class, *args),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def new_cluster_id() -> str:
    """A cluster id as Kafka's Uuid.randomUuid() makes one: base64url of 16 random bytes, no padding."""
    while True:
        cluster_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode("ascii").rstrip("=")
        # Kafka rejects ids starting with '-' (they read as CLI flags) and the all-zero / metadata ids.
        if not cluster_id.startswith("-") and cluster_id not in (
            "AAAAAAAAAAAAAAAAAAAAAA",
            "AAAAAAAAAAAAAAAAAAAAAQ",
        ):
            return cluster_id


def _tail(path: Path, lines: int = 40) -> str:
    """Last lines of a log file, for error messages that explain themselves."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"({path} not readable)"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


def _first_errors(path: Path, count: int = 8) -> str:
    """The first ERROR/FATAL lines of a log4j log, each with the line after it (often the exception)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not readable)"
    picked: list[str] = []
    for i, line in enumerate(lines):
        if " ERROR " in line or " FATAL " in line:
            picked += lines[i : i + 2]
            if len(picked) >= 2 * count:
                break
    return "\n".join(picked) or "(no ERROR lines)"


def _port_open(host: str, port: int) -> bool:
    """Cheap check before a Kafka client is built: is anything accepting on this port?"""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def _death_signal_prefix() -> list[str]:
    """Make the JVM die with us if we are killed outright (no atexit), so no broker outlives a test run.

    PR_SET_PDEATHSIG fires when the spawning *thread* exits, so it is only used from the main thread.
    """
    if threading.current_thread() is threading.main_thread() and sys.platform.startswith("linux"):
        setpriv = shutil.which("setpriv")
        if setpriv:
            return [setpriv, "--pdeathsig", "TERM", "--"]
    return []


def _kill_and_wait(proc: subprocess.Popen[bytes]) -> None:
    """Never leave a helper JVM behind when we give up on it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _write_properties(path: Path, props: dict[str, str]) -> None:
    """Write a java.util.Properties file (backslashes are the only escape our values can need)."""
    body = "".join(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in props.items())
    path.write_text("# written by dev/harness.py\n" + body)


def _read_properties(path: Path) -> dict[str, str]:
    """Enough of java.util.Properties to read Kafka's meta.properties."""
    props: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


@contextlib.contextmanager
def _admin_client(address: str, timeout_ms: int) -> Iterator[Any]:
    """A kafka-python admin client bootstrapped from one node, always closed, even if bootstrap fails."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient.__new__(KafkaAdminClient)
    try:
        admin.__init__(
            bootstrap_servers=address,
            client_id="kthrottle-harness",
            bootstrap_timeout_ms=timeout_ms,
            request_timeout_ms=timeout_ms,
            reconnect_backoff_max_ms=1000,
        )
        yield admin
    finally:
        if getattr(admin, "_closed", True) is False:
            admin.close()
        elif getattr(admin, "_net", None) is not None:  # bootstrap failed: stop its IO thread anyway
            with contextlib.suppress(Exception):
                admin._net.stop()


def _topic_readiness(node: KafkaNode, topic: str, partitions: int) -> str:
    """Gives "ready" when ``node``'s own metadata lists ``topic`` with ``partitions`` partitions, each with
    a leader; otherwise what it shows instead. One Metadata request to that node alone (a client library
    would ask whichever node it likes, which is not the question)."""
    from protocol import messages
    from protocol.api_keys import ApiKey
    from protocol.frames import SIZE, RequestHeader, encode_request_header, response_header_size

    version = 12
    header = RequestHeader(ApiKey.METADATA, version, 1, "kthrottle-harness", 0)
    body = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    payload = encode_request_header(header) + messages.encode(ApiKey.METADATA, version, body, response=False)
    try:
        with socket.create_connection((node.host, node.port), timeout=5) as sock:
            sock.sendall(SIZE.pack(len(payload)) + payload)
            stream = sock.makefile("rb")
            (size,) = SIZE.unpack(stream.read(4))
            frame = stream.read(size)
    except (OSError, struct.error) as exc:
        return f"no answer: {exc!r}"
    if len(frame) < size:
        return f"connection closed after {len(frame)} of {size} bytes"
    resp = messages.decode_response(
        ApiKey.METADATA, version, memoryview(frame)[response_header_size(ApiKey.METADATA, version, frame) :]
    )
    [entry] = resp["topics"]
    if entry["error_code"] != 0:
        return f"topic error {entry['error_code']}"
    parts = entry["partitions"]
    leaderless = sorted(p["partition_index"] for p in parts if p["leader_id"] < 0 or p["error_code"] != 0)
    if len(parts) != partitions or leaderless:
        return f"{len(parts)} partitions, without a leader: {leaderless}"
    return "ready"


# --- cluster -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerTls:
    """An SSL listener on every node, from PEM files: ``keystore`` holds the private key and the
    certificate chain, ``truststore`` the CA certificates of clients (for ``client_auth``)."""

    keystore: Path
    truststore: Path
    client_auth: str = "required"  # Kafka's ssl.client.auth: required, requested or none


@dataclass
class KafkaNode:
    """One KRaft combined-mode process (broker + controller). ``data_dir`` is the node's own directory."""

    node_id: int
    port: int
    controller_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    sasl_port: int = 0  # the SASL_PLAINTEXT listener, when the cluster has SASL users
    ssl_port: int = 0  # the SSL listener, when the cluster has TLS
    host: str = "127.0.0.1"  # where its listeners bind (another address inside a network namespace)
    # More PLAINTEXT listeners, by name: (the port it binds, the port it advertises). A test puts a
    # relay of its own (HAProxy) from the advertised port to the bound one, to cut one client
    # off from the brokers (and heal it) while every other client goes on.
    relayed: dict[str, tuple[int, int]] = field(default_factory=dict)

    def relayed_address(self, name: str) -> str:
        """host:port clients of the relayed listener ``name`` are told (the relay's port)."""
        return f"{self.host}:{self.relayed[name][1]}"

    @property
    def ssl_address(self) -> str:
        """host:port of the SSL listener."""
        return f"{self.host}:{self.ssl_port}"

    @property
    def address(self) -> str:
        """host:port of the PLAINTEXT (client) listener."""
        return f"{self.host}:{self.port}"

    @property
    def sasl_address(self) -> str:
        """host:port of the SASL_PLAINTEXT listener (PLAIN and SCRAM-SHA-256)."""
        return f"{self.host}:{self.sasl_port}"

    @property
    def log_dir(self) -> Path:
        """server.log (log4j), stdout.log (JVM stdout/stderr) and format.log live here."""
        return self.data_dir / "logs"

    @property
    def kafka_data_dir(self) -> Path:
        """The broker's log.dirs (partitions and the __cluster_metadata log)."""
        return self.data_dir / "kafka-data"

    @property
    def properties_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        """This node's first errors and the end of its logs, for error messages (the cause of a failed
        start is an early ERROR line, followed by pages of orderly shutdown)."""
        server_log = self.log_dir / "server.log"
        return (
            f"--- {server_log} (first errors) ---\n{_first_errors(server_log)}\n"
            f"--- {server_log} (tail) ---\n{_tail(server_log, lines)}\n"
            f"--- {self.log_dir / 'stdout.log'} (tail) ---\n{_tail(self.log_dir / 'stdout.log', 15)}"
        )


_live_clusters: set[KafkaCluster] = set()


@atexit.register
def _stop_all_clusters() -> None:
    """Interpreter exit (also after an uncaught error) must not leave brokers behind."""
    for cluster in list(_live_clusters):
        with contextlib.suppress(Exception):
            cluster.stop()


class KafkaCluster:
    """N KRaft combined-mode nodes (ids 1..N) with a static controller quorum, on free loopback ports.

    Use as a context manager, or call ``start()`` / ``stop()``. A workdir the harness created is removed by
    ``stop()``; one passed in is kept (and can be started again: it is not re-formatted).
    """

    def __init__(
        self,
        brokers: int = 1,
        workdir: Path | None = None,
        config: dict[str, str] | None = None,
        sasl_users: dict[str, str] | None = None,
        tls: BrokerTls | None = None,
        netns: NetworkNamespace | None = None,
        relayed_listeners: tuple[str, ...] = (),
    ) -> None:
        """``sasl_users`` (name -> password) adds a SASL_PLAINTEXT listener where each user can
        log in with PLAIN or SCRAM-SHA-256; the PLAINTEXT listener stays for tools and checks.
        ``netns`` runs the nodes inside that network namespace, on its inner address, so a test
        can cut the network between them and everything outside (``dev/netns.py``).
        ``relayed_listeners`` adds PLAINTEXT listeners (upper-case names) advertised at ports where
        nothing listens until the test puts a relay there (``KafkaNode.relayed``); a name ending
        in ``_SSL`` makes it an SSL listener with ``tls``'s stores."""
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self._own_workdir = workdir is None
        self.workdir = Path(tempfile.mkdtemp(prefix="kthrottle-kafka-")) if workdir is None else Path(workdir)
        self.config: dict[str, str] = dict(config or {})
        self.cluster_id = new_cluster_id()
        self.netns = netns
        host = netns.inner_address if netns is not None else "127.0.0.1"
        self.nodes: list[KafkaNode] = [
            KafkaNode(node_id, free_port(), free_port(), self.workdir / f"node-{node_id}", host=host)
            for node_id in range(1, brokers + 1)
        ]
        self.bootstrap_servers = ",".join(node.address for node in self.nodes)
        self.sasl_users = dict(sasl_users or {})
        if self.sasl_users:
            for node in self.nodes:
                node.sasl_port = free_port()
        self.sasl_bootstrap_servers = ",".join(n.sasl_address for n in self.nodes) if self.sasl_users else ""
        self.tls = tls
        if tls is not None:
            for node in self.nodes:
                node.ssl_port = free_port()
        self.ssl_bootstrap_servers = ",".join(n.ssl_address for n in self.nodes) if tls else ""
        for name in relayed_listeners:
            if not name.isidentifier() or not name.isupper():
                raise ValueError(f"relayed listener names are upper-case identifiers: {name!r}")
            if name.endswith("_SSL") and tls is None:
                raise ValueError(f"relayed listener {name} is SSL: the cluster needs tls")
            for node in self.nodes:
                node.relayed[name] = (free_port(), free_port())
        _live_clusters.add(self)

    # context manager -------------------------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KafkaCluster(brokers={len(self.nodes)}, bootstrap_servers={self.bootstrap_servers!r})"

    # public API ------------------------------------------------------------------------------------------

    def node(self, node_id: int) -> KafkaNode:
        """The node with this id (ids start at 1)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id} in {self!r}")

    def node_properties(self, node: KafkaNode) -> dict[str, str]:
        """server.properties for one node: KRaft combined mode, tuned to start/stop fast, then overrides."""
        replication = str(min(3, len(self.nodes)))
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "listeners": f"PLAINTEXT://{node.address},CONTROLLER://{node.host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.address}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.quorum.voters": voters,
            "log.dirs": str(node.kafka_data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": replication,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Fewer internal partitions: the first consumer group / transaction does not wait for 50 of them.
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.num.partitions": "10",
            # The log cleaner would take 128 MiB of a 512 MiB heap up front.
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            # Faster registration/unfencing at start, and faster fencing of a killed node in fault tests.
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "12000",
            "controlled.shutdown.enable": "true",
            "num.recovery.threads.per.data.dir": "1",
        }
        if self.sasl_users:
            sasl = f"SASL_PLAINTEXT://{node.sasl_address}"
            plain_users = " ".join(f'user_{u}="{pw}"' for u, pw in self.sasl_users.items())
            plain_module = "org.apache.kafka.common.security.plain.PlainLoginModule"
            scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule"
            props["listeners"] += "," + sasl
            props["advertised.listeners"] += "," + sasl
            props["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            # OAUTHBEARER with Kafka's unsecured JWS validator (its default without a handler):
            # clients make their own unsigned tokens, as Kafka's own tests and quick starts do.
            oauth_module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
            props["sasl.enabled.mechanisms"] = "PLAIN,SCRAM-SHA-256,OAUTHBEARER"
            jaas = "listener.name.sasl_plaintext.{}.sasl.jaas.config"
            props[jaas.format("plain")] = f"{plain_module} required {plain_users};"
            props[jaas.format("scram-sha-256")] = f"{scram_module} required;"
            props[jaas.format("oauthbearer")] = f"{oauth_module} required;"
        for name, (bound, advertised) in node.relayed.items():
            props["listeners"] += f",{name}://{node.host}:{bound}"
            props["advertised.listeners"] += f",{name}://{node.host}:{advertised}"
            protocol = "SSL" if name.endswith("_SSL") else "PLAINTEXT"
            props["listener.security.protocol.map"] += f",{name}:{protocol}"
        if self.tls is not None:
            listener = f"SSL://{node.ssl_address}"
            props["listeners"] += "," + listener
            props["advertised.listeners"] += "," + listener
            props["listener.security.protocol.map"] += ",SSL:SSL"
            for name in ("SSL", *(n for n in node.relayed if n.endswith("_SSL"))):
                prefix = f"listener.name.{name.lower()}."
                props[prefix + "ssl.keystore.type"] = "PEM"
                props[prefix + "ssl.keystore.location"] = str(self.tls.keystore)
                props[prefix + "ssl.truststore.type"] = "PEM"
                props[prefix + "ssl.truststore.location"] = str(self.tls.truststore)
                props[prefix + "ssl.client.auth"] = self.tls.client_auth
        props.update(self.config)
        return props

    def start(self, timeout: float = 120.0) -> None:
        """Format every node's storage (one cluster id), start all nodes, wait until every node answers and
        lists all N brokers unfenced. On failure every node is stopped and the error carries the log tail."""
        if any(node.process is not None for node in self.nodes):
            raise KafkaHarnessError(f"{self!r} is already started")
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.log_dir.mkdir(parents=True, exist_ok=True)
                _write_properties(node.properties_file, self.node_properties(node))
            self._format(deadline)
            for node in self.nodes:
                self._spawn(node)
            want = {node.node_id for node in self.nodes}
            self._wait_ready(self.nodes, want, deadline)
        except BaseException:
            self.stop()
            raise
        _live_clusters.add(self)

    def stop(self) -> None:
        """SIGTERM every node at once (a controlled shutdown needs the quorum alive), SIGKILL after a bound,
        then remove the workdir if the harness created it. Idempotent."""
        running = [node for node in self.nodes if node.process is not None]
        for node in running:
            self._signal(node, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for node in running:
            self._reap(node, deadline)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _live_clusters.discard(self)

    def stop_node(self, node_id: int, kill: bool = False) -> None:
        """Stop one node: SIGTERM (controlled shutdown) and wait, or SIGKILL (a crash) with ``kill=True``."""
        node = self.node(node_id)
        if node.process is None:
            return
        self._signal(node, signal.SIGKILL if kill else signal.SIGTERM)
        self._reap(node, time.monotonic() + STOP_GRACE_SECONDS)

    def start_node(self, node_id: int, timeout: float = 60) -> None:
        """Restart one node on its old ports and data, and wait until it and every running node are listed
        unfenced."""
        node = self.node(node_id)
        if node.running:
            return
        if not (node.kafka_data_dir / "meta.properties").exists():
            raise KafkaHarnessError(f"node {node_id} was never formatted: call start() first")
        self._spawn(node)
        want = {n.node_id for n in self.nodes if n.running}
        try:
            self._wait_ready([node], want, time.monotonic() + timeout)
        except BaseException:
            self.stop_node(node_id, kill=True)
            raise

    def create_topic(
        self, name: str, partitions: int = 1, replication: int = 1, timeout: float = 60.0
    ) -> None:
        """Create a topic straight on the brokers, then wait until every running node's metadata lists it
        with a leader for each partition: whatever the caller does next, with any client bootstrapped on
        any node, finds the topic ready. Raises with the broker's error, or with what each node last
        showed if the topic does not become ready within ``timeout``."""
        from kafka.errors import KafkaError

        with _admin_client(self.bootstrap_servers, int(timeout * 1000)) as admin:
            try:
                admin.create_topics(
                    {name: {"num_partitions": partitions, "replication_factor": replication}},
                    timeout_ms=int(timeout * 1000),
                )
            except KafkaError as exc:
                raise KafkaHarnessError(f"creating topic {name} failed: {exc!r}") from exc
        self.wait_for_topic(name, partitions, timeout)

    def wait_for_topic(self, name: str, partitions: int, timeout: float = 60.0) -> None:
        """Wait until every running node's metadata lists ``name`` with ``partitions`` partitions, each
        with a leader (a new topic, or a leader moved: each broker's metadata cache catches up on its own
        schedule, and a client may ask any of them)."""
        seen: dict[int, str] = {}

        def ready_everywhere() -> bool:
            seen.clear()  # only the nodes running now count; one stopped meanwhile is not waited for
            for node in self.nodes:
                if node.running:
                    seen[node.node_id] = _topic_readiness(node, name, partitions)
            return all(state == "ready" for state in seen.values())

        wait_until(
            ready_everywhere,
            timeout,
            lambda: f"topic {name} ({partitions} partitions) not ready on every node: {seen}",
        )

    def fill_topic(
        self,
        name: str,
        records: int,
        record_size: int = 1024,
        timeout: float = 120.0,
        batch_bytes: int = 1048576,
    ) -> None:
        """Write ``records`` records of ``record_size`` random bytes straight to the brokers (librdkafka,
        in-process, acks=all, record batches of up to ``batch_bytes``); raises unless every one was
        acknowledged within ``timeout``."""
        from confluent_kafka import KafkaError, Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "client.id": "kthrottle-harness-fill",
                "acks": "all",
                "linger.ms": 20,
                "batch.size": batch_bytes,
                "queue.buffering.max.kbytes": 262144,
            }
        )
        value = os.urandom(record_size)
        acked = 0
        failures: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            nonlocal acked
            if err is None:
                acked += 1
            else:
                failures.append(err)

        deadline = time.monotonic() + timeout
        for _ in range(records):
            while True:
                try:
                    producer.produce(name, value, on_delivery=delivered)
                    break
                except BufferError as full:  # local queue full: let deliveries drain it
                    producer.poll(0.05)
                    if time.monotonic() > deadline:
                        raise KafkaHarnessError(f"filling {name}: queue full after {timeout}s") from full
            producer.poll(0)
        producer.flush(max(deadline - time.monotonic(), 0))
        if acked != records:
            raise KafkaHarnessError(
                f"filling topic {name}: {acked} of {records} records acknowledged; errors: {failures[:3]}"
            )

    def tool_command(self) -> str:
        """A shell line to run Kafka tools against this cluster (printed by the CLI)."""
        return f"{shlex.join(java_command('<MainClass>'))} --bootstrap-server {self.bootstrap_servers}"

    # internals -------------------------------------------------------------------------------------------

    def _existing_cluster_id(self) -> str | None:
        """The cluster id already in a reused workdir, so a restart does not fight the formatted storage."""
        ids = set()
        for node in self.nodes:
            meta = node.kafka_data_dir / "meta.properties"
            if meta.exists():
                ids.add(_read_properties(meta).get("cluster.id"))
        ids.discard(None)
        if len(ids) > 1:
            raise KafkaHarnessError(
                f"{self.workdir} holds nodes of different clusters: {sorted(map(str, ids))}"
            )
        return ids.pop() if ids else None

    def _format(self, deadline: float) -> None:
        """kafka-storage format on every node, in parallel (static voters: no --standalone et al.)."""
        self.cluster_id = self._existing_cluster_id() or self.cluster_id
        procs: list[tuple[KafkaNode, subprocess.Popen[bytes]]] = []
        with contextlib.ExitStack() as cleanup:
            for node in self.nodes:
                out = cleanup.enter_context((node.log_dir / "format.log").open("wb"))
                cmd = java_command(
                    "kafka.tools.StorageTool",
                    "format",
                    "--config",
                    str(node.properties_file),
                    "--cluster-id",
                    self.cluster_id,
                    "--ignore-formatted",
                    *[
                        arg
                        for u, pw in self.sasl_users.items()
                        for arg in ("--add-scram", f"SCRAM-SHA-256=[name={u},password={pw}]")
                    ],
                    heap="256m",
                )
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
                cleanup.callback(_kill_and_wait, proc)
                procs.append((node, proc))
            for node, proc in procs:
                try:
                    code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise KafkaHarnessError(f"formatting node {node.node_id} timed out") from None
                if code != 0:
                    raise KafkaHarnessError(
                        f"formatting node {node.node_id} failed (exit {code}):\n"
                        f"{_tail(node.log_dir / 'format.log')}"
                    )

    def _spawn(self, node: KafkaNode) -> None:
        """Start ``kafka.Kafka server.properties`` with output to files (a pipe nobody reads would fill)."""
        node.log_dir.mkdir(parents=True, exist_ok=True)
        inside = self.netns.exec_prefix() if self.netns is not None else []
        cmd = (
            _death_signal_prefix()
            + inside
            + java_command("kafka.Kafka", str(node.properties_file), log_dir=node.log_dir)
        )
        with (node.log_dir / "stdout.log").open("ab") as out:
            node.process = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=node.data_dir,
                # Own process group: a terminal Ctrl-C reaches only us, and we stop the nodes in order.
                start_new_session=True,
            )
        log.info("started kafka node %d (pid %d) on %s", node.node_id, node.process.pid, node.address)

    @staticmethod
    def _signal(node: KafkaNode, sig: signal.Signals) -> None:
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                node.process.send_signal(sig)

    @staticmethod
    def _reap(node: KafkaNode, deadline: float) -> None:
        """Wait for a signalled node until the deadline, then SIGKILL it; always leaves ``process`` None."""
        proc = node.process
        if proc is None:
            return
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("kafka node %d did not stop in time; killing it", node.node_id)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        node.process = None

    def _wait_ready(self, nodes: Sequence[KafkaNode], want: set[int], deadline: float) -> None:
        """Poll until each node answers DescribeCluster listing every id in ``want`` unfenced; bounded."""
        pending = list(nodes)
        last_seen: dict[int, str] = {}
        while pending:
            for node in list(pending):
                if node.process is None or node.process.poll() is not None:
                    code = None if node.process is None else node.process.returncode
                    raise KafkaHarnessError(
                        f"kafka node {node.node_id} exited (code {code}) during startup\n{node.log_tail()}"
                    )
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    break
                if not _port_open(node.host, node.port):
                    last_seen[node.node_id] = "port not open"
                    continue
                try:
                    with _admin_client(node.address, min(5000, max(remaining_ms, 500))) as admin:
                        brokers = admin.describe_cluster()["brokers"]
                except Exception as exc:
                    last_seen[node.node_id] = f"{type(exc).__name__}: {exc}"
                    continue
                unfenced = {int(b["broker_id"]) for b in brokers if not b.get("is_fenced", False)}
                last_seen[node.node_id] = f"unfenced brokers {sorted(unfenced)}"
                if want <= unfenced:
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() >= deadline:
                details = "\n".join(
                    f"node {n.node_id} ({n.address}): last seen {last_seen.get(n.node_id, 'nothing')}\n"
                    f"{n.log_tail()}"
                    for n in pending
                )
                raise KafkaHarnessError(
                    f"kafka nodes {[n.node_id for n in pending]} not ready (want brokers {sorted(want)}) "
                    f"before the timeout\n{details}"
                )
            time.sleep(0.25)


# --- CLI ---------------------------------------------------------------------------------------------------


def _parse_config(items: Sequence[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config expects KEY=VALUE, got {item!r}")
        config[key] = value
    return config


def _cmd_start(args: argparse.Namespace) -> int:
    """Run a cluster in the foreground until Ctrl-C or SIGTERM, then stop it cleanly."""

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    workdir = Path(args.workdir) if args.workdir else None
    cluster = KafkaCluster(brokers=args.brokers, workdir=workdir, config=_parse_config(args.config))
    began = time.monotonic()
    try:
        cluster.start(timeout=args.timeout)
        print(f"bootstrap servers: {cluster.bootstrap_servers}", flush=True)
        print(
            f"started {len(cluster.nodes)} node(s) in {time.monotonic() - began:.1f}s; "
            f"workdir {cluster.workdir}"
        )
        print(f"tools: {cluster.tool_command()}")
        print(f"   or: python -m dev.harness tool <MainClass> --bootstrap-server {cluster.bootstrap_servers}")
        print("Ctrl-C or SIGTERM stops the cluster.", flush=True)
        while True:
            time.sleep(1.0)
            for node in cluster.nodes:
                if not node.running:
                    print(f"node {node.node_id} exited\n{node.log_tail()}", file=sys.stderr)
                    return 1
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C must not cut the orderly stop short (stop() is bounded anyway).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("stopping...", file=sys.stderr, flush=True)
        cluster.stop()


def _cmd_tool(args: argparse.Namespace) -> int:
    """Run a Kafka Java tool in the foreground with the broker's classpath."""
    return subprocess.run(java_command(args.main_class, *args.args), check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a KRaft cluster and run until Ctrl-C / SIGTERM")
    start.add_argument("--brokers", type=int, default=1, help="number of combined broker+controller nodes")
    start.add_argument("--workdir", help="keep data and logs here (default: a temp dir removed at stop)")
    start.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="broker override")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the cluster")
    start.set_defaults(func=_cmd_start)
    tool = sub.add_parser(
        "tool", help="run a Kafka Java tool, e.g. TopicCommand or kafka.admin.ConfigCommand"
    )
    tool.add_argument("main_class", help=f"main class or one of: {', '.join(TOOL_ALIASES)}")
    tool.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the tool")
    tool.set_defaults(func=_cmd_tool)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except KafkaHarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
