"""A real TCP load balancer (HAProxy) in front of several kthrottle replicas, on one machine.

In production a gateway runs as several replicas behind one Kubernetes Service or cloud load
balancer: every pod listens on the same ports at its own IP and advertises the load balancer's
address. ``GatewayReplicas`` builds exactly that for tests and benchmarks: replica ``i`` binds
127.0.0.(11+i) (all of 127/8 is loopback on Linux) with the same bootstrap, broker and admin
ports as the others, advertises 127.0.0.1, and HAProxy listens on 127.0.0.1 at those ports and
sends each new connection to the next replica (``balance roundrobin``).

    with KafkaCluster(brokers=1) as cluster, GatewayReplicas(cluster, replicas=3) as gw:
        producer = Producer({"bootstrap.servers": gw.bootstrap})
        ...
        gw.metric(0, "kthrottle_connections_total")   # what replica 0 carried
        gw.pin(1)                                     # new connections all go to replica 1
        gw.kill(2); gw.restart(2)                     # SIGKILL one pod, start it again

``HAProxy`` alone runs any set of TCP frontends, each over a list of backend servers, with the
PROXY protocol (v1 or v2) and a source address per server when asked. The binary comes from
``dev/haproxy.sh`` (Debian's package, installed when missing).
"""

from __future__ import annotations

import contextlib
import copy
import os
import resource
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from dev.harness import KafkaCluster, free_port
from dev.proxy_process import ProxyProcess, gateway_config

REPO = Path(__file__).resolve().parent.parent
LB_HOST = "127.0.0.1"
REPLICA_BASE = 11  # replica i binds 127.0.0.(REPLICA_BASE + i)

SendProxy = Literal["v1", "v2"] | None
Balance = Literal["roundrobin", "first", "leastconn", "source"]


class HAProxyError(RuntimeError):
    """No haproxy binary, a config haproxy refuses, or a process that did not come up (with its log)."""


@dataclass(frozen=True)
class Server:
    """One backend server of a frontend: where HAProxy connects, and how."""

    host: str
    port: int
    send_proxy: SendProxy = None  # PROXY protocol header before the client's bytes: "v1" text, "v2" binary
    source: str | None = None  # the local address HAProxy connects from (None: the kernel's choice)
    name: str | None = None  # its name in HAProxy (default: s<position>); pin() goes by it

    def line(self, name: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        out = f"server {name} {host}:{self.port}"
        if self.send_proxy == "v1":
            out += " send-proxy"
        elif self.send_proxy == "v2":
            out += " send-proxy-v2"
        if self.source is not None:
            out += f" source {self.source}"
        return out


@dataclass(frozen=True)
class Frontend:
    """A TCP port HAProxy listens on, balanced over ``servers``."""

    name: str
    port: int
    servers: Sequence[Server]
    host: str = LB_HOST


@dataclass
class HAProxy:
    """``haproxy -db -f <cfg>`` in a subprocess, TCP mode, for as long as the ``with`` block runs.

    Each frontend is a ``listen`` section; every new connection goes to the next server
    (``balance``, roundrobin by default). A server that refuses the connection (a killed
    replica) is retried on another (``option redispatch``); there are no health checks, so a
    server with the PROXY protocol never sees a connection without a header. ``pin`` and
    ``unpin`` change where new connections go at run time (HAProxy's runtime API on a UNIX
    socket in the workdir), without a restart and without touching open connections.
    """

    frontends: Sequence[Frontend]
    workdir: Path | None = None
    balance: Balance = "roundrobin"
    timeout_client_seconds: float = 600.0  # Kafka clients keep connections idle up to 9 minutes
    timeout_server_seconds: float = 600.0
    timeout_connect_seconds: float = 3.0
    binary: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        names = [f.name for f in self.frontends]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"frontend names must be given and unique: {names}")
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kthrottle-haproxy-")
            self.workdir = Path(self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)

    # --- files -------------------------------------------------------------------------------

    @property
    def dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir

    @property
    def config_path(self) -> Path:
        return self.dir / "haproxy.cfg"

    @property
    def log_path(self) -> Path:
        return self.dir / "haproxy.log"

    @property
    def socket_path(self) -> Path:
        return self.dir / "admin.sock"

    def config_text(self) -> str:
        lines = [
            "global",
            f"    maxconn {_maxconn()}",
            f"    stats socket {self.socket_path} mode 600 level admin",
            "",
            "defaults",
            "    mode tcp",
            f"    timeout connect {int(self.timeout_connect_seconds * 1000)}ms",
            f"    timeout client {int(self.timeout_client_seconds * 1000)}ms",
            f"    timeout server {int(self.timeout_server_seconds * 1000)}ms",
            "    retries 3",
            "    option redispatch",
            "",
        ]
        for fe in self.frontends:
            host = f"[{fe.host}]" if ":" in fe.host else fe.host
            lines += [f"listen {fe.name}", f"    bind {host}:{fe.port}", f"    balance {self.balance}"]
            lines += [f"    {server.line(server.name or f's{i}')}" for i, server in enumerate(fe.servers)]
            lines.append("")
        return "\n".join(lines)

    # --- the binary --------------------------------------------------------------------------

    @staticmethod
    def find_binary() -> str:
        """haproxy's path: ``$KTHROTTLE_HAPROXY``, PATH, else ``dev/haproxy.sh`` (which installs
        Debian's package when it can). HAProxyError says why when none can be had."""
        for candidate in (os.environ.get("KTHROTTLE_HAPROXY"), "haproxy", "/usr/sbin/haproxy"):
            if candidate and (path := shutil.which(candidate)):
                return path
        try:
            done = subprocess.run(
                ["bash", str(REPO / "dev" / "haproxy.sh")],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise HAProxyError(f"no haproxy on PATH, and dev/haproxy.sh could not run: {exc}") from exc
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return lines[-1]
        raise HAProxyError(
            f"no haproxy on PATH, and dev/haproxy.sh could not install it: {done.stderr.strip()[-400:]}"
        )

    # --- start and stop ----------------------------------------------------------------------

    def start(self, timeout: float = 20.0) -> HAProxy:
        binary = self.binary or self.find_binary()
        self.config_path.write_text(self.config_text())
        check = subprocess.run(
            [binary, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise HAProxyError(f"haproxy refuses {self.config_path}:\n{check.stdout}{check.stderr}")
        self.socket_path.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "-db", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # A probe connection would reach a server (and count there): the listening sockets are
        # looked for in the kernel's table instead.
        wanted = {(fe.host, fe.port) for fe in self.frontends}
        deadline = time.monotonic() + timeout
        while not (wanted <= _listening() and self.socket_path.exists()):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.proc = None
                raise HAProxyError(f"haproxy exited with {code}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                missing = sorted(wanted - _listening())
                raise HAProxyError(f"haproxy not listening on {missing} after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        return self

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM (haproxy closes everything at once), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        code = self.proc.returncode
        self.proc = None
        return code

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> HAProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    # --- runtime changes -----------------------------------------------------------------------

    def command(self, line: str) -> str:
        """One command on HAProxy's runtime API (the admin socket); its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def pin(self, server_index: int) -> None:
        """New connections on every frontend go to server ``server_index`` only (the others are
        put in maintenance); connections already open stay where they are."""
        self.route({fe.name: server_index for fe in self.frontends})

    def route(self, routes: Mapping[str, int]) -> None:
        """New connections on each frontend named in ``routes`` go to its one server there (the
        frontend's others are put in maintenance); other frontends and open connections are left
        as they are. ``unpin`` spreads them again."""
        by_name = {fe.name: fe for fe in self.frontends}
        for name, server_index in routes.items():  # all checked before any is changed
            fe = by_name.get(name)
            if fe is None:
                raise KeyError(f"no frontend {name!r}: there are {sorted(by_name)}")
            if not 0 <= server_index < len(fe.servers):
                raise IndexError(f"frontend {name} has no server {server_index}")
        for name, server_index in routes.items():
            for i in range(len(by_name[name].servers)):
                self._set_state(name, i, "ready" if i == server_index else "maint")

    def unpin(self) -> None:
        """Every server takes new connections again."""
        for fe in self.frontends:
            for i in range(len(fe.servers)):
                self._set_state(fe.name, i, "ready")

    def _set_state(self, frontend: str, index: int, state: str) -> None:
        answer = self.command(f"set server {frontend}/s{index} state {state}").strip()
        if answer:
            raise HAProxyError(f"haproxy: set server {frontend}/s{index} state {state}: {answer}")


def _maxconn() -> int:
    """Connections HAProxy may hold: two descriptors each, within this machine's open-files limit
    (haproxy refuses to start when it cannot raise its own limit that far)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        return 20000
    return max(256, min(20000, (hard - 200) // 2))


def _listening() -> set[tuple[str, int]]:
    """The (IPv4 address, port) pairs in the LISTEN state on this machine (Linux's /proc/net/tcp)."""
    out: set[tuple[str, int]] = set()
    with contextlib.suppress(OSError), open("/proc/net/tcp") as table:
        next(table, None)
        for row in table:
            parts = row.split()
            if len(parts) < 4 or parts[3] != "0A":
                continue
            addr_hex, port_hex = parts[1].split(":")
            addr = socket.inet_ntoa(int(addr_hex, 16).to_bytes(4, "little"))
            out.add((addr, int(port_hex, 16)))
    return out


def free_port_on(hosts: Sequence[str]) -> int:
    """A port free on 127.0.0.1 (``free_port``: never handed out twice) and bindable on every one of
    ``hosts`` too."""
    for _ in range(200):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return port
    raise HAProxyError(f"no port free on all of {list(hosts)}")


def replica_address(index: int) -> str:
    """The loopback address replica ``index`` binds (127.0.0.11, 127.0.0.12, ...)."""
    return f"127.0.0.{REPLICA_BASE + index}"


PerReplica = Callable[[int, dict[str, Any]], dict[str, Any]] | Sequence[dict[str, Any]] | None


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, mappings merged key by key."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class GatewayReplicas:
    """N kthrottle gateway replicas behind HAProxy, as pods behind one Service.

    Every replica binds its own loopback address with the same bootstrap, broker and admin
    ports, and advertises the load balancer (127.0.0.1, the same ports); HAProxy listens there
    and balances each new connection over the replicas. ``overrides`` are ``gateway_config``'s
    (``quotas=``, ``cluster_quotas=``, ...); ``per_replica`` changes one replica's config: a
    list of mappings merged into each (by index), or a function ``(index, config) -> config``.
    ``send_proxy`` makes HAProxy send the PROXY protocol header ("v1" or "v2"), ``lb_source`` the
    address it connects to the replicas from.
    """

    def __init__(
        self,
        cluster: KafkaCluster,
        replicas: int = 3,
        *,
        per_replica: PerReplica = None,
        balance: Balance = "roundrobin",
        send_proxy: SendProxy = None,
        lb_source: str | None = None,
        workdir: Path | None = None,
        source: Path = REPO,
        **overrides: Any,
    ) -> None:
        if replicas < 1:
            raise ValueError("at least one replica")
        self.cluster = cluster
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="kthrottle-replicas-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.addresses = [replica_address(i) for i in range(replicas)]
        hosts = [LB_HOST, *self.addresses]
        base = gateway_config(cluster, **overrides)
        gateway = base["gateway"]
        gateway["bootstrap_port"] = free_port_on(hosts)
        gateway["broker_port_base"] = None
        gateway["broker_ports"] = {node.node_id: free_port_on(hosts) for node in cluster.nodes}
        base["advertised_host"] = LB_HOST
        base.setdefault("admin", {})["port"] = free_port_on(self.addresses)
        self.bootstrap_port: int = gateway["bootstrap_port"]
        self.broker_ports: dict[int, int] = dict(gateway["broker_ports"])
        self.admin_port: int = base["admin"]["port"]
        self.replicas: list[ProxyProcess] = []
        for i, address in enumerate(self.addresses):
            cfg = _merged(base, {"bind_host": address, "admin": {"host": address}})
            if "cluster_quotas" in cfg:  # the others probe this replica at its own address
                cfg["cluster_quotas"] = {
                    "peer_host": address,
                    "instance": f"replica-{i}",
                    **cfg["cluster_quotas"],
                }
            if cfg.get("capture", {}).get("enabled") and not cfg["capture"].get("instance"):
                cfg["capture"]["instance"] = f"replica-{i}"
            if callable(per_replica):
                cfg = per_replica(i, cfg)
            elif per_replica is not None and i < len(per_replica):
                cfg = _merged(cfg, per_replica[i])
            self.replicas.append(ProxyProcess(cfg, workdir=self.workdir / f"replica-{i}", source=source))

        def servers(port: int, first: int) -> list[Server]:
            """The replicas in round-robin order from ``first``: each frontend has its own
            round robin, so the first connection to each port lands on a different replica
            and one client's connections (bootstrap, one per broker) are spread over them."""
            order = [(first + k) % replicas for k in range(replicas)]
            return [Server(self.addresses[i], port, send_proxy, lb_source, name=f"s{i}") for i in order]

        frontends = [Frontend("bootstrap", self.bootstrap_port, servers(self.bootstrap_port, 0))]
        frontends += [
            Frontend(f"broker-{node}", port, servers(port, k + 1))
            for k, (node, port) in enumerate(sorted(self.broker_ports.items()))
        ]
        self.lb = HAProxy(frontends, workdir=self.workdir / "haproxy", balance=balance)

    # --- addresses ---------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The load balancer's bootstrap address: what clients are given."""
        return f"{LB_HOST}:{self.bootstrap_port}"

    def admin_url(self, index: int) -> str:
        """Replica ``index``'s admin HTTP server (its own address, the shared admin port)."""
        return f"http://{self.addresses[index]}:{self.admin_port}"

    def metric(self, index: int, name: str, labels: dict[str, str] | None = None) -> float:
        """A metric of replica ``index`` (``ProxyProcess.metric``: the sum of matching samples)."""
        return self.replicas[index].metric(name, labels)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> GatewayReplicas:
        try:
            for replica in self.replicas:
                replica.start(timeout)
            self.lb.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.lb.stop()
        for replica in self.replicas:
            replica.stop()

    def kill(self, index: int) -> int | None:
        """SIGKILL replica ``index`` (its connections drop; new ones go to the others)."""
        return self.replicas[index].kill()

    def restart(self, index: int, timeout: float = 60.0) -> ProxyProcess:
        """Start replica ``index`` again (after ``kill`` or ``stop``), same config and ports."""
        return self.replicas[index].start(timeout)

    def replace(
        self, index: int, source: Path, change: dict[str, Any] | None = None, timeout: float = 60.0
    ) -> ProxyProcess:
        """Roll replica ``index`` as a Deployment rolls a pod: SIGTERM (it drains), then start it
        from the source tree ``source`` (another release's) with ``change`` merged into its config;
        same address and ports."""
        replica = self.replicas[index]
        replica.stop()
        replica.source = source
        replica.config = _merged(replica.config, change or {})
        return replica.start(timeout)

    def pin(self, index: int) -> None:
        """All new connections go to replica ``index``; ``unpin`` spreads them again."""
        self.lb.pin(index)

    def steer(self, replica_by_broker: Mapping[int, int]) -> None:
        """New connections to broker ``node``'s port go to replica ``replica_by_broker[node]`` only
        (bootstrap and other ports as they were): a test that needs one client's connections on
        given replicas, whatever the round robins' positions; ``unpin`` spreads them again."""
        self.lb.route({f"broker-{node}": index for node, index in replica_by_broker.items()})

    def unpin(self) -> None:
        self.lb.unpin()

    def logs(self) -> str:
        """Every replica's log tail and HAProxy's, for a failure message."""
        parts = [
            f"--- replica {i} ({address}):\n{replica.log_tail()}"
            for i, (address, replica) in enumerate(zip(self.addresses, self.replicas, strict=True))
        ]
        parts.append(f"--- haproxy:\n{self.lb.log_tail()}")
        return "\n".join(parts)

    def __enter__(self) -> GatewayReplicas:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
