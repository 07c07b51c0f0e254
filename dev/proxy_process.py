"""Run kthrottle as a real process in front of a harness cluster (tests, demo, benchmarks)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from dev.harness import KafkaCluster, free_port

REPO = Path(__file__).resolve().parent.parent


def gateway_config(cluster: KafkaCluster, **overrides: Any) -> dict[str, Any]:
    """A gateway config with a bootstrap port and one free port per broker node."""
    cfg: dict[str, Any] = {
        "mode": "gateway",
        "bind_host": "127.0.0.1",
        "advertised_host": "127.0.0.1",
        "gateway": {
            "bootstrap_port": free_port(),
            "broker_port_base": None,
            "broker_ports": {node.node_id: free_port() for node in cluster.nodes},
            "upstream_bootstrap": cluster.bootstrap_servers.split(","),
        },
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "drain_seconds": 5,
    }
    cfg.update(overrides)
    return cfg


def sidecar_config(cluster: KafkaCluster, node_id: int = 1, **overrides: Any) -> dict[str, Any]:
    node = next(n for n in cluster.nodes if n.node_id == node_id)
    cfg: dict[str, Any] = {
        "mode": "sidecar",
        "sidecar": {"listen_port": free_port(), "upstream": node.address},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "drain_seconds": 5,
    }
    cfg.update(overrides)
    return cfg


def _connect_host(host: str) -> str:
    """Where to connect to reach a socket bound to ``host``: loopback for a wildcard, IPv6 bracketed."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


class ProxyProcess:
    """``kthrottle run`` in a subprocess; ready once it has written its bound ports."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path | None = None,
        python: str = sys.executable,
        source: Path = REPO,
    ) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="kthrottle-proxy-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = self._with_admin_token(config)
        self.config_path = self.workdir / "kthrottle.yaml"
        self.ready_path = self.workdir / "ready.json"
        self.log_path = self.workdir / "kthrottle.log"
        self.python = python
        self.source = source  # the source tree run (another release's, in an upgrade test)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self.admin_port: int | None = None

    def _with_admin_token(self, config: dict[str, Any]) -> dict[str, Any]:
        """The admin endpoints that name users and client ids need a token (as an operator sets
        one): a config that gives none gets one here, and ``admin_get`` sends it."""
        admin = dict(config.get("admin") or {})
        if (
            admin.get("enabled") is False
            or admin.get("token_file")
            or admin.get("allow_unauthenticated_reads")
        ):
            return config
        token_file = self.workdir / "admin-token"
        token_file.write_text(secrets.token_hex(16) + "\n")
        return {**config, "admin": {**admin, "token_file": str(token_file)}}

    @property
    def admin_token(self) -> str | None:
        """The admin token from the config's ``admin.token_file``, if it has one."""
        path = (self.config.get("admin") or {}).get("token_file")
        try:
            return Path(path).read_text().strip() if path else None
        except OSError:
            return None

    def start(self, timeout: float = 60.0) -> ProxyProcess:
        self.config_path.write_text(yaml.safe_dump(self.config))
        self.ready_path.unlink(missing_ok=True)
        env = dict(os.environ)
        # Only this source tree's modules: another release must not pick up this one's.
        others = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
        env["PYTHONPATH"] = os.pathsep.join([str(self.source), *others])
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.python,
                    "-m",
                    "proxy.cli",
                    "run",
                    "--config",
                    str(self.config_path),
                    "--ready-file",
                    str(self.ready_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.source,
            )
        deadline = time.monotonic() + timeout
        while not self.ready_path.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"kthrottle exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"kthrottle not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)
        info = json.loads(self.ready_path.read_text())
        self.ports = info["listeners"]
        self.admin_port = info["admin_port"]
        return self

    @property
    def bootstrap(self) -> str:
        """This process's own bootstrap (or sidecar) listener, at its ``bind_host``."""
        port = self.ports.get("bootstrap") or self.ports.get("sidecar")
        return f"{_connect_host(self.config.get('bind_host', '127.0.0.1'))}:{port}"

    @property
    def admin_url(self) -> str:
        """The admin HTTP server, at the config's ``admin.host`` (127.0.0.1 by default)."""
        host = _connect_host(self.config.get("admin", {}).get("host", "127.0.0.1"))
        return f"http://{host}:{self.admin_port}"

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (drain), then SIGKILL after ``timeout``; returns the exit code."""
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

    def kill(self) -> int | None:
        """SIGKILL, no drain (a crash, an OOM kill); ``start`` runs it again with the same config."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        code = self.proc.returncode
        self.proc = None
        return code

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def admin_get(self, path: str) -> tuple[int, str]:
        return admin_get(f"{self.admin_url}{path}", self.admin_token)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Sum of a metric's samples whose labels include ``labels`` (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        _status, text = self.admin_get("/metrics")
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != name:
                    continue
                if labels and any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                total += sample.value
        return total

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


def admin_get(url: str, token: str | None) -> tuple[int, str]:
    """GET an admin endpoint of a proxy (the bearer token sent when given): (status, body)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


_DRAIN = re.compile(
    r"drain: (\d+) of (\d+) connections closed after their last answer in [\d.]+s; "
    r"(\d+) cut with (\d+) requests unanswered"
)


@dataclass(frozen=True)
class DrainSummary:
    """A proxy's own account of its drain at shutdown (its last ``drain:`` log line): a client's
    retries hide a request cut by the proxy, so the proxy's count is what a test judges by."""

    answered: int  # connections closed after their last answer
    connections: int  # open when the drain began
    cut: int  # closed with requests in flight (by the grace, or a broker or client that went)
    unanswered: int  # requests read from clients and never answered

    @classmethod
    def from_log(cls, log: str) -> DrainSummary:
        found = _DRAIN.findall(log)
        if not found:
            raise AssertionError(f"no drain summary in the proxy's log:\n{log[-3000:]}")
        answered, connections, cut, unanswered = (int(n) for n in found[-1])
        return cls(answered, connections, cut, unanswered)
