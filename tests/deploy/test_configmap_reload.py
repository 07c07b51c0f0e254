"""Quotas from the chart's ConfigMap reload in a running proxy, with no restart, when the files
change the way the kubelet changes a mounted ConfigMap: a new timestamped directory, then an
atomic swap of the ``..data`` symlink that the visible file names point through.

The proxy runs the config the chart rendered (gateway values), with its listeners moved to free
loopback ports for the test and its brokers unreachable (it starts without them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from dev.harness import free_port
from tests.deploy.conftest import REPO
from tests.deploy.test_helm_chart import GATEWAY, docs_of, find, render


class MountedConfigMap:
    """A directory laid out as the kubelet lays out a ConfigMap volume."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0

    def write(self, files: dict[str, str]) -> None:
        self.generation += 1
        version = self.root / f"..2026_11_22_00_00_00.{self.generation}"
        version.mkdir()
        for name, text in files.items():
            (version / name).write_text(text)
        old = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        tmp.rename(self.root / "..data")  # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")
        if old is not None:
            for f in old.iterdir():
                f.unlink()
            old.rmdir()


TOKEN = "configmap-reload-token"


def _get(port: int, path: str) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", f"Bearer {TOKEN}")  # /quotas names users: the admin token
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def _wait_for(condition: str, check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):  # bounded: 30 s
        assert proc.poll() is None, f"the proxy exited: {log.read_text()}"
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{condition} did not happen: {log.read_text()}")


def test_quota_change_in_the_configmap_applies_without_restart(helm: str, tmp_path: Path) -> None:
    bootstrap, admin = free_port(), free_port()
    sets = (
        f"gateway.bootstrapPort={bootstrap}",
        f"admin.port={admin}",
        "gateway.upstreamBootstrap={127.0.0.1:1}",
    )
    docs = docs_of(render(helm, GATEWAY, *sets))
    data = dict(find(docs, "ConfigMap", "rel-kthrottle-config")["data"])
    config = yaml.safe_load(data["kthrottle.yaml"])
    config["bind_host"] = "127.0.0.1"  # the pod's 0.0.0.0, kept to loopback here
    config["admin"]["host"] = "127.0.0.1"
    token_file = tmp_path / "admin-token"  # the chart's admin.token Secret, mounted
    token_file.write_text(TOKEN + "\n")
    config["admin"]["token_file"] = str(token_file)
    config["capture"]["enabled"] = False
    config.pop("upstream_sasl")  # its password Secret is not mounted here
    data["kthrottle.yaml"] = yaml.safe_dump(config)
    mount = tmp_path / "etc-kthrottle"
    mount.mkdir()
    volume = MountedConfigMap(mount)
    volume.write(data)

    log = tmp_path / "proxy.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "run", "--config", str(mount / "kthrottle.yaml")],
            env=dict(os.environ, PYTHONPATH=str(REPO)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def admin_up() -> bool:
            try:
                return bool(json.loads(_get(admin, "/healthz"))["status"] == "ok")
            except OSError:
                return False

        _wait_for("the admin server coming up", admin_up, proc, log)
        quotas = json.loads(_get(admin, "/quotas"))
        assert quotas["users"]["alice"]["producer_byte_rate"] == 1048576
        assert "bob" not in quotas["users"]

        # helm upgrade with one more quota: only quotas.yaml differs in the new ConfigMap.
        new = docs_of(render(helm, GATEWAY, *sets, "quotas.users.bob.producer_byte_rate=2048"))
        data["quotas.yaml"] = find(new, "ConfigMap", "rel-kthrottle-config")["data"]["quotas.yaml"]
        volume.write(data)

        def bob_applied() -> bool:
            users = json.loads(_get(admin, "/quotas"))["users"]
            return "bob" in users

        _wait_for("the new quotas being applied", bob_applied, proc, log)
        assert json.loads(_get(admin, "/quotas"))["users"]["bob"]["producer_byte_rate"] == 2048
        metrics = _get(admin, "/metrics")
        assert 'kthrottle_config_reloads_total{result="applied"} 1.0' in metrics
        assert "kthrottle_config_last_reload_ok 1.0" in metrics
        assert "kthrottle_config_restart_pending 0.0" in metrics  # quotas apply live
        assert proc.poll() is None  # the same process: no restart

        # A bad file is refused and the last good quotas stay.
        data["quotas.yaml"] = "quotas:\n  users:\n    bob: {producer_byte_rate: -1}\n"
        volume.write(data)
        _wait_for(
            "the bad file being refused",
            lambda: 'kthrottle_config_reloads_total{result="rejected"} 1.0' in _get(admin, "/metrics"),
            proc,
            log,
        )
        assert json.loads(_get(admin, "/quotas"))["users"]["bob"]["producer_byte_rate"] == 2048
        assert "kthrottle_config_last_reload_ok 0.0" in _get(admin, "/metrics")  # an alert can say so

        # A good file again, with a setting that needs a restart: applied, and the restart pending.
        data["quotas.yaml"] = "quotas:\n  users:\n    bob: {producer_byte_rate: 4096}\n"
        data["kthrottle.yaml"] = yaml.safe_dump({**config, "max_frame_bytes": 2 * 1024 * 1024})
        volume.write(data)
        _wait_for(
            "the restart-only change being noticed",
            lambda: "kthrottle_config_restart_pending 1.0" in _get(admin, "/metrics"),
            proc,
            log,
        )
        assert "kthrottle_config_last_reload_ok 1.0" in _get(admin, "/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
