"""The Helm chart's manifests run by ``podman kube play``: rendered with ``helm template``, given
what podman 4.3 lacks, played, and taken down.

podman runs a Deployment's pod with the chart's images, commands, security contexts and
emptyDir volumes as they are. Where it has no equivalent, this module stands in for the
kubelet, the way the kubelet does it:

- projected and ConfigMap volumes (the chart's ConfigMaps and Secrets): written to a host
  directory in the kubelet's layout (the keys in a timestamped directory, ``..data`` pointing at
  it, each file a link through ``..data``), with the volume's mode and the pod's fsGroup, and
  updated as the kubelet updates them: a new directory, then ``..data`` swapped in one rename;
- ``status.podIP``: the pod runs on the host's network (podman publishes no container ports
  there, so the pod's ``ports`` are dropped); its address is 127.0.0.1;
- probes: podman turns an httpGet probe into a curl inside the container (the image has neither
  curl nor a shell), so ``probe`` asks them from outside, as the kubelet does;
- a StatefulSet (podman plays Pods and Deployments): its one pod, with its host name, its DNS
  name, its volume claims as host directories, and native sidecars beside the main containers.

What only a real Kubernetes cluster checks: Services and their endpoints, NetworkPolicy, the
PodDisruptionBudget, preStop hooks, the kubelet's own sync period, and scheduling.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "helm" / "kthrottle"


def podman_env() -> dict[str, str]:
    """The environment podman needs on this machine (dev/kube.sh: catatonit, containers.conf)."""
    done = subprocess.run(
        ["bash", str(REPO / "dev" / "kube.sh")], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-500:] or "dev/kube.sh failed")
    key, _, value = done.stdout.strip().splitlines()[-1].partition("=")
    return {**os.environ, key: value}


def render(values: Mapping[str, Any], release: str = "t") -> list[dict[str, Any]]:
    """``helm template`` of the chart with ``values``: every manifest, in order."""
    done = subprocess.run(
        ["helm", "template", release, str(CHART), "-f", "-"],
        input=yaml.safe_dump(dict(values)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()[-2000:]}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def only(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [m for m in manifests if m.get("kind") == kind]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} {kind} manifests rendered, want 1")
    return found[0]


def secret(name: str, data: Mapping[str, bytes]) -> dict[str, Any]:
    """A Secret as ``kubectl create secret generic`` makes it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }


class ProjectedVolume:
    """A projected volume of ConfigMaps and Secrets, kept in a host directory as the kubelet keeps
    it (AtomicWriter): readers never see half an update."""

    def __init__(self, volume: Mapping[str, Any], pod_spec: Mapping[str, Any], directory: Path) -> None:
        if "projected" in volume:
            self.sources = volume["projected"]["sources"]
            self.mode = int(volume["projected"].get("defaultMode", 0o644))
        else:  # a configMap volume: one source
            self.sources = [{"configMap": volume["configMap"]}]
            self.mode = int(volume["configMap"].get("defaultMode", 0o644))
        # The pod's fsGroup owns the files, as the kubelet sets it (root alone may give them away).
        group = (pod_spec.get("securityContext") or {}).get("fsGroup")
        self.group = group if os.geteuid() == 0 else None
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)

    def files(self, objects: list[dict[str, Any]]) -> dict[str, bytes]:
        """Each projected path and its bytes, from the ConfigMaps and Secrets in ``objects``."""
        by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        out: dict[str, bytes] = {}
        for source in self.sources:
            kind = "ConfigMap" if "configMap" in source else "Secret"
            ref = source["configMap"] if kind == "ConfigMap" else source["secret"]
            obj = by_name.get((kind, ref["name"]))
            if obj is None:
                raise AssertionError(f"the pod mounts {kind} {ref['name']}, which is not there")
            items = ref.get("items") or [{"key": key, "path": key} for key in obj["data"]]
            for item in items:
                raw = obj["data"][item["key"]]
                out[item["path"]] = base64.b64decode(raw) if kind == "Secret" else raw.encode()
        return out

    def write(self, objects: list[dict[str, Any]]) -> None:
        """Project ``objects`` into the directory: a new timestamped copy, then ``..data`` swapped."""
        files = self.files(objects)
        stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.") + f"{time.monotonic_ns() % 10**9:09d}"
        fresh = self.directory / stamp
        for rel, content in files.items():
            path = fresh / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            if self.group is not None:
                os.chown(path, 0, int(self.group))
            path.chmod(self.mode)
        for sub in [fresh, *(p for p in fresh.rglob("*") if p.is_dir())]:
            if self.group is not None:
                os.chown(sub, 0, int(self.group))
            sub.chmod(0o755)
        data = self.directory / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        staged = self.directory / "..data_tmp"
        staged.unlink(missing_ok=True)
        staged.symlink_to(stamp)
        os.replace(staged, data)
        for top in {rel.split("/", 1)[0] for rel in files}:
            link = self.directory / top
            if not link.is_symlink():
                link.symlink_to(f"..data/{top}")
        if old is not None:
            shutil.rmtree(self.directory / old)


def for_podman(workload: dict[str, Any], volumes_dir: Path) -> tuple[dict[str, Any], list[ProjectedVolume]]:
    """The Deployment (or a one-replica StatefulSet, as its pod ``<name>-0``) as podman 4.3 can
    play it on the host's network, and its ConfigMap and projected volumes (written by the
    caller with ``ProjectedVolume.write``).

    For a StatefulSet: the pod's host name and its DNS name under the headless Service resolve
    to 127.0.0.1 (a hosts file mounted in every container); volume claims become host
    directories owned by the pod's fsGroup (as a provisioner's volume is); native sidecars (init
    containers that restart always) run beside the main containers, which podman would
    otherwise wait for them to end. The fsGroup joins every container's groups, as the kubelet
    adds it."""
    work = yaml.safe_load(yaml.safe_dump(workload))  # a deep copy
    pod = work["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    context = pod.setdefault("securityContext", {})
    if "fsGroup" in context:  # the kubelet adds the fsGroup to every container's groups
        groups = context.setdefault("supplementalGroups", [])
        if context["fsGroup"] not in groups:
            groups.append(context["fsGroup"])
    if work["kind"] == "StatefulSet":
        if int(work["spec"].get("replicas", 1)) != 1:
            raise ValueError("podman runs one pod of a StatefulSet here: render it with replicas 1")
        name = f"{work['metadata']['name']}-0"
        domain = (
            f"{work['spec']['serviceName']}.{work['metadata'].get('namespace', 'default')}.svc.cluster.local"
        )
        pod["hostname"] = name
        # Cluster DNS: the pod's names resolve to 127.0.0.1 (podman 4.3 ignores hostAliases on
        # the host's network, so every container gets this hosts file).
        hosts = volumes_dir / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(f"127.0.0.1 localhost\n127.0.0.1 {name} {name}.{domain}\n")
        hosts.chmod(0o644)
        pod.setdefault("volumes", []).append(
            {"name": "cluster-dns", "hostPath": {"path": str(hosts), "type": "File"}}
        )
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            container.setdefault("volumeMounts", []).append(
                {"name": "cluster-dns", "mountPath": "/etc/hosts", "readOnly": True}
            )
        group = context.get("fsGroup")
        for claim in work["spec"].pop("volumeClaimTemplates", []):
            claim_dir = volumes_dir / claim["metadata"]["name"]
            claim_dir.mkdir(parents=True, exist_ok=True)
            if group is not None and os.geteuid() == 0:
                os.chown(claim_dir, int(group), int(group))
            claim_dir.chmod(0o2775)
            pod.setdefault("volumes", []).append(
                {"name": claim["metadata"]["name"], "hostPath": {"path": str(claim_dir), "type": "Directory"}}
            )
        work = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": work["spec"]["template"]["metadata"].get("labels", {})},
            "spec": pod,
        }
    sidecars = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    if sidecars:
        pod["initContainers"] = [c for c in pod["initContainers"] if c not in sidecars]
        for sidecar in sidecars:
            del sidecar["restartPolicy"]
        pod["containers"] = [*sidecars, *pod["containers"]]
    projected = []
    for volume in pod.get("volumes", []):
        if "projected" in volume or "configMap" in volume:
            pv = ProjectedVolume(volume, pod, volumes_dir / volume["name"])
            projected.append(pv)
            volume.pop("projected", None)
            volume.pop("configMap", None)
            volume["hostPath"] = {"path": str(pv.directory), "type": "Directory"}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        container.pop("ports", None)
        for env in container.get("env", []):
            field = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            if field == "status.podIP":
                del env["valueFrom"]
                env["value"] = "127.0.0.1"
    return work, projected


def container_ports(container: Mapping[str, Any]) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}


def probe(container: Mapping[str, Any], which: str, timeout: float | None = None) -> float:
    """Ask the container's ``which`` probe (startupProbe, readinessProbe, livenessProbe, an httpGet)
    as the kubelet does, every periodSeconds, until it passes; seconds it took. Raises when it
    failed failureThreshold times in a row (or ``timeout`` passed)."""
    spec = container[which].get("httpGet") or container[which]["tcpSocket"]
    port = spec["port"]
    if isinstance(port, str):
        port = container_ports(container)[port]
    if "path" not in spec:  # tcpSocket: the port accepts a connection
        return _wait_for_tcp(container[which], port, which, timeout)
    period = float(container[which].get("periodSeconds", 10))
    failures_allowed = int(container[which].get("failureThreshold", 3))
    per_try = float(container[which].get("timeoutSeconds", 1))
    began = time.monotonic()
    time.sleep(float(container[which].get("initialDelaySeconds", 0)))
    failures = 0
    last = ""
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{spec['path']}", timeout=per_try) as resp:
                if 200 <= resp.status < 400:
                    return time.monotonic() - began
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = repr(exc)
        failures += 1
        if failures >= failures_allowed or (timeout is not None and time.monotonic() - began > timeout):
            raise AssertionError(f"{which} failed {failures} times, last: {last}")
        time.sleep(period)


def _wait_for_tcp(probe_spec: Mapping[str, Any], port: int, which: str, timeout: float | None) -> float:
    import socket

    period = float(probe_spec.get("periodSeconds", 10))
    began = time.monotonic()
    deadline = began + (timeout if timeout is not None else 600.0)
    while True:
        try:
            with socket.create_connection(
                ("127.0.0.1", port), timeout=float(probe_spec.get("timeoutSeconds", 1))
            ):
                return time.monotonic() - began
        except OSError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{which} (tcp {port}) never passed: {exc!r}") from exc
        time.sleep(min(period, 1.0))


@contextmanager
def played(manifests: list[dict[str, Any]], workdir: Path, env: Mapping[str, str]) -> Iterator[Path]:
    """``podman kube play`` of ``manifests`` (written to ``workdir/kube.yaml``); ``podman kube
    down`` afterwards if the caller has not taken it down itself. Yields the file."""
    path = workdir / "kube.yaml"
    path.write_text(yaml.safe_dump_all(manifests))
    done = subprocess.run(
        ["podman", "kube", "play", str(path)], capture_output=True, text=True, timeout=180, env=dict(env)
    )
    if done.returncode != 0:
        subprocess.run(["podman", "kube", "down", str(path)], capture_output=True, timeout=120, env=dict(env))
        raise RuntimeError(f"podman kube play failed: {_quiet(done.stderr)[-2000:]}")
    try:
        yield path
    finally:
        subprocess.run(["podman", "kube", "down", str(path)], capture_output=True, timeout=120, env=dict(env))


def _quiet(stderr: str) -> str:
    """podman's output without its complaints about systemd timers (none in a container)."""
    return "\n".join(line for line in stderr.splitlines() if "systemd" not in line)


def inspect(name: str, env: Mapping[str, str]) -> dict[str, Any]:
    import json

    done = subprocess.run(
        ["podman", "inspect", name], capture_output=True, text=True, timeout=60, env=dict(env), check=True
    )
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return found[0]
