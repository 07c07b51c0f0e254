"""The Helm chart's pods on a real container runtime: rendered by ``helm template``, run by
``podman kube play`` on the image the suite builds. The gateway, in front of the harness's real
broker: its pod starts as the chart's security context says, its probes pass, clients produce
and consume through the port its Service names, a changed ConfigMap reloads the quotas in the
running pod, and deleted as Kubernetes deletes a pod it drains with nothing acknowledged lost.
The sidecar, in the chart's example broker pod on a broker image of the harness's Kafka jars:
both containers start, probes pass, clients go through the sidecar, its quota holds, a changed
ConfigMap reloads it in the running sidecar, and the pod deleted under a producer drains the
sidecar with everything acknowledged in the broker's log (read from the data volume by Kafka's
DumpLogSegments).

Runs as its own step of `.ci/run`, after the image step. What podman lacks and the test stands in
for (the kubelet's volumes and DNS, the pod IP, probes asked from outside, a StatefulSet's pod),
and what only a real Kubernetes cluster checks, are in dev/kube_play.py and docs/deployment.md.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dev import kube_play
from dev.harness import KafkaCluster, free_port, run_tool
from dev.proxy_process import DrainSummary, admin_get
from dev.waiting import wait_until
from tests.image.test_image import TAG
from tests.integration.clients import produce_until
from tests.tools import unavailable

pytestmark = pytest.mark.timeout(900)
UID = 10001
SLOW = 64 * 1024  # the quota the changed ConfigMap gives client "podman-slow"


@pytest.fixture(scope="module")
def podman_env(image: tuple[str, list[str], int]) -> dict[str, str]:
    try:
        return kube_play.podman_env()
    except RuntimeError as exc:
        unavailable(f"podman kube play cannot run here: {exc}")


def _values(broker: KafkaCluster, ports: dict[str, int], quotas: dict[str, Any]) -> dict[str, Any]:
    repository, tag = TAG.split(":")
    node_ids = [node.node_id for node in broker.nodes]
    return {
        "image": {"repository": f"localhost/{repository}", "tag": tag, "pullPolicy": "Never"},
        "gateway": {
            "replicas": 1,
            "upstreamBootstrap": broker.bootstrap_servers.split(","),
            "advertisedHost": "127.0.0.1",
            "bootstrapPort": ports["bootstrap"],
            "brokers": {"nodeIds": node_ids, "portBase": ports["brokers"] - min(node_ids)},
            "preStopSleepSeconds": 1,
        },
        "admin": {"port": ports["admin"], "token": {"enabled": True, "secretName": "kthrottle-admin"}},
        "config": {"drain_seconds": 8},
        "quotas": quotas,
    }


def _admin(port: int, path: str, token: str) -> tuple[int, str]:
    """An admin GET of the pod's proxy; (0, the error) while nothing answers on the port."""
    try:
        return admin_get(f"http://127.0.0.1:{port}{path}", token)
    except OSError as exc:
        return 0, repr(exc)


def _producer_quota(admin_port: int, token: str, client_id: str) -> float | None:
    """The producer byte rate quota the pod's proxy holds ``client_id`` to (None: none, or no answer)."""
    status, body = _admin(admin_port, f"/quotas/entity?client_id={client_id}", token)
    quota: float | None = json.loads(body)["producer_byte_rate"].get("quota") if status == 200 else None
    return quota


def _service_bootstrap(manifests: list[dict[str, Any]], container: dict[str, Any]) -> str:
    """host:port of the Service's client port, its targetPort resolved against the container's
    named ports (on the host network the pod's port is the host's)."""
    service = next(
        m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"].endswith("kthrottle")
    )
    named = kube_play.container_ports(container)
    kafka = next(p for p in service["spec"]["ports"] if p["name"] == "kafka")
    target = kafka["targetPort"]
    return f"127.0.0.1:{named[target] if isinstance(target, str) else target}"


@pytest.mark.timeout(600)
def test_the_gateway_runs_on_podman(
    podman_env: dict[str, str], kafka_broker: KafkaCluster, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    ports = {"bootstrap": free_port(), "brokers": free_port(), "admin": free_port()}
    values = _values(kafka_broker, ports, {"window": {"num": 11, "size_seconds": 1}})
    manifests = kube_play.render(values)
    deployment = kube_play.only(manifests, "Deployment")
    config_map = kube_play.only(manifests, "ConfigMap")
    token = secrets.token_hex(16)
    objects = [config_map, kube_play.secret("kthrottle-admin", {"token": token.encode()})]
    pod, volumes = kube_play.for_podman(deployment, tmp_path / "volumes")
    for volume in volumes:
        volume.write(objects)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_name = f"{deployment['metadata']['name']}-pod-0"  # podman's name for a Deployment's pod
    name = f"{pod_name}-{container['name']}"
    bootstrap = _service_bootstrap(manifests, container)
    topic = f"podman-{uuid.uuid4().hex[:6]}"
    kafka_broker.create_topic(topic)

    with kube_play.played([pod], tmp_path, podman_env) as kube_file:
        logs = subprocess.Popen(
            ["podman", "logs", "-f", name],
            stdout=(tmp_path / "pod.log").open("w"),
            stderr=subprocess.STDOUT,
            env=podman_env,
        )
        try:
            # The probes, asked as the kubelet asks them, pass in their own limits.
            started_in = kube_play.probe(container, "startupProbe")
            kube_play.probe(container, "readinessProbe")
            kube_play.probe(container, "livenessProbe")
            print(f"podman: startup probe passed after {started_in:.1f} s")

            # The pod runs as the chart's security context says.
            info = kube_play.inspect(name, podman_env)
            assert info["Config"]["User"] in (f"{UID}:{UID}", str(UID)), info["Config"]["User"]
            assert info["HostConfig"]["ReadonlyRootfs"] is True
            assert not info["HostConfig"]["CapAdd"]
            assert "CAP_NET_RAW" in info["HostConfig"]["CapDrop"]
            assert any("no-new-privileges" in opt for opt in info["HostConfig"]["SecurityOpt"] or [])
            started_at = info["State"]["StartedAt"]

            # Clients produce and consume through the Service's port.
            acked: list[bytes] = []
            failed: list[tuple[float, str]] = []

            def delivered(err: object, msg: Any) -> None:
                if err is None:
                    acked.append(msg.value())
                else:
                    failed.append((time.monotonic(), str(err)))

            producer = Producer(
                {"bootstrap.servers": bootstrap, "client.id": "podman-client", "log_level": 2}
            )
            for i in range(1000):
                producer.produce(topic, f"m{i}".encode(), on_delivery=delivered)
                producer.poll(0)
            assert producer.flush(60) == 0 and not failed, failed[:3]
            seen = _read_all(bootstrap, topic, set(acked), group=f"g-{topic}")
            assert seen == set(acked), f"{len(set(acked) - seen)} acknowledged messages not consumed"

            # New quotas in the ConfigMap: the kubelet's swap of the mounted files reaches the
            # running proxy, which reloads them without a restart (the pod template's checksum,
            # which rolls the pods, covers the main config only).
            changed = kube_play.render(
                {**values, "quotas": {"clients": {"podman-slow": {"producer_byte_rate": SLOW}}}}
            )
            assert (
                kube_play.only(changed, "Deployment")["spec"]["template"]["metadata"]["annotations"]
                == deployment["spec"]["template"]["metadata"]["annotations"]
            ), "a quota change would roll the pods"
            for volume in volumes:
                volume.write([kube_play.only(changed, "ConfigMap"), objects[1]])

            wait_until(
                lambda: _producer_quota(ports["admin"], token, "podman-slow") == SLOW,
                30,
                "the ConfigMap's new quota never reached the proxy",
            )
            assert kube_play.inspect(name, podman_env)["State"]["StartedAt"] == started_at, "restarted"

            # The pod deleted while a producer has requests in flight, as Kubernetes deletes it
            # (SIGTERM, then terminationGracePeriodSeconds before a SIGKILL; podman 4.3's own
            # `kube down` stops with no grace at all, so the pod is stopped first and `kube down`
            # then removes it): the proxy drains, no delivery fails before it has gone, it exits
            # 0, and everything acknowledged is in the topic.
            grace = int(deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
            gone = _stop_under_producer(pod_name, grace, podman_env, producer, topic, delivered, acked)
            exit_code = kube_play.inspect(name, podman_env)["State"]["ExitCode"]
            down = subprocess.run(
                ["podman", "kube", "down", str(kube_file)],
                capture_output=True,
                text=True,
                timeout=120,
                env=podman_env,
            )
            assert down.returncode == 0, down.stderr[-2000:]
        finally:
            logs.wait(30)
    log = (tmp_path / "pod.log").read_text()
    assert exit_code == 0, f"exit code {exit_code}:\n{log[-3000:]}"
    # Every request the proxy read was answered before its connection closed (librdkafka's
    # retries would hide one cut; the proxy counts them).
    drain = DrainSummary.from_log(log)
    assert drain.connections >= 1 and drain.cut == 0 and drain.unanswered == 0, drain
    during = [err for at, err in failed if at < gone]
    assert not during, f"{len(during)} deliveries failed before the pod was gone: {during[:3]}"
    in_topic = _read_all(kafka_broker.bootstrap_servers, topic, set(acked))
    assert set(acked) <= in_topic, f"{len(set(acked) - in_topic)} acknowledged messages missing"


def _stop_under_producer(
    pod_name: str,
    grace: int,
    env: dict[str, str],
    producer: Any,
    topic: str,
    delivered: Any,
    acked: list[bytes],
) -> float:
    """The pod stopped as Kubernetes deletes it (SIGTERM, then ``grace`` seconds before a SIGKILL;
    podman 4.3's own `kube down` gives no grace at all) once ``producer`` has had 500 messages
    acknowledged (``acked`` cleared first) and while it keeps requests in flight; returns when it
    was gone (monotonic). The producer stops then and flushes what it can."""
    acked.clear()
    stop = threading.Event()
    worker = threading.Thread(target=produce_until, args=(stop, producer, topic, delivered))
    worker.start()
    try:
        wait_until(lambda: len(acked) > 500, 30, "the producer made no progress through the pod")
        stopped = subprocess.run(
            ["podman", "pod", "stop", "--time", str(grace), pod_name],
            capture_output=True,
            text=True,
            timeout=grace + 60,
            env=env,
        )
        gone = time.monotonic()
    finally:
        stop.set()
        worker.join(30)
    producer.flush(10)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    return gone


def _read_all(bootstrap: str, topic: str, want: set[bytes], group: str = "") -> set[bytes]:
    """Every value in ``topic`` read by a consumer group (until ``want`` is all there, or 90 s)."""
    from confluent_kafka import Consumer

    direct = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group or f"d-{topic}", "auto.offset.reset": "earliest"}
    )
    direct.subscribe([topic])
    found: set[bytes] = set()
    deadline = time.monotonic() + 90
    while not want <= found and time.monotonic() < deadline:
        for msg in direct.consume(1000, timeout=1.0):
            value = msg.value()
            if msg.error() is None and value is not None:
                found.add(value)
    direct.close()
    return found


@pytest.fixture(scope="module")
def broker_image(podman_env: dict[str, str]) -> str:
    """The Apache Kafka broker image of the harness's jars (dev/broker_image.sh)."""
    built = subprocess.run(
        ["bash", str(kube_play.REPO / "dev" / "broker_image.sh"), "--tag", BROKER_TAG],
        capture_output=True,
        text=True,
        timeout=1200,
        env=podman_env,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    print(built.stdout.strip().splitlines()[-1])
    return BROKER_TAG


BROKER_TAG = "kthrottle-kafka:test"


@pytest.mark.timeout(600)
def test_the_sidecar_runs_on_podman_beside_a_broker(
    podman_env: dict[str, str], broker_image: str, tmp_path: Path
) -> None:
    """The chart's example broker StatefulSet (one replica) with kthrottle as its native sidecar,
    on a broker image built from the harness's Kafka jars: both containers start as the chart
    says, the sidecar's probes and the broker's readiness pass, clients produce and consume
    through the sidecar, the sidecar holds a client to the chart's quota, takes a changed
    ConfigMap's quota without a restart, and drains when the pod is deleted, losing nothing
    acknowledged."""
    from confluent_kafka import Producer

    ports = {"listen": free_port(), "upstream": free_port(), "admin": free_port()}
    ports.update(replication=free_port(), controller=free_port())
    repository, tag = TAG.split(":")
    broker_repository, broker_tag = broker_image.split(":")
    quota = 256 * 1024
    values: dict[str, Any] = {
        "mode": "sidecar",
        "image": {"repository": f"localhost/{repository}", "tag": tag, "pullPolicy": "Never"},
        "sidecar": {
            "listenPort": ports["listen"],
            "upstream": f"127.0.0.1:{ports['upstream']}",
            "advertisedHost": "127.0.0.1",
            "exampleStatefulSet": {
                "enabled": True,
                "replicas": 1,
                "image": {
                    "repository": f"localhost/{broker_repository}",
                    "tag": broker_tag,
                    "pullPolicy": "Never",
                },
                "heapOpts": "-Xms256m -Xmx256m",
                "ports": {"replication": ports["replication"], "controller": ports["controller"]},
                "serverProperties": {
                    "num.partitions": 1,
                    "default.replication.factor": 1,
                    "min.insync.replicas": 1,
                    "offsets.topic.replication.factor": 1,
                    "transaction.state.log.replication.factor": 1,
                    "transaction.state.log.min.isr": 1,
                },
            },
        },
        "admin": {"port": ports["admin"], "token": {"enabled": True, "secretName": "kthrottle-admin"}},
        "config": {"drain_seconds": 5},
        "quotas": {
            "window": {"num": 11, "size_seconds": 0.2},
            "clients": {"podman-slow": {"producer_byte_rate": quota}},
        },
    }
    manifests = kube_play.render(values)
    statefulset = kube_play.only(manifests, "StatefulSet")
    token = secrets.token_hex(16)
    objects = [
        *(m for m in manifests if m["kind"] == "ConfigMap"),
        kube_play.secret("kthrottle-admin", {"token": token.encode()}),
    ]
    pod, volumes = kube_play.for_podman(statefulset, tmp_path / "volumes")
    for volume in volumes:
        volume.write(objects)
    spec = statefulset["spec"]["template"]["spec"]
    sidecar = next(c for c in spec["initContainers"] if c.get("restartPolicy") == "Always")
    broker = spec["containers"][0]
    pod_name = pod["metadata"]["name"]
    bootstrap = f"127.0.0.1:{ports['listen']}"
    topic = f"podman-sidecar-{uuid.uuid4().hex[:6]}"

    with kube_play.played([pod], tmp_path, podman_env):
        try:
            kube_play.probe(sidecar, "startupProbe")
            kube_play.probe(broker, "readinessProbe", timeout=180)
            kube_play.probe(sidecar, "readinessProbe")
            for container, user in ((sidecar, "10001"), (broker, "1000")):
                info = kube_play.inspect(f"{pod_name}-{container['name']}", podman_env)
                assert info["Config"]["User"].split(":")[0] == user, info["Config"]["User"]
                assert info["HostConfig"]["ReadonlyRootfs"] is True
                assert not info["HostConfig"]["CapAdd"]

            acked: list[bytes] = []
            failed: list[str] = []

            def delivered(err: object, msg: Any) -> None:
                if err is None:
                    acked.append(msg.value())
                else:
                    failed.append(str(err))

            # A client at its defaults: produce and consume through the sidecar.
            # log_level 2: not the reconnection attempts of every producer once the pod is gone.
            producer = Producer(
                {"bootstrap.servers": bootstrap, "client.id": "podman-client", "log_level": 2}
            )
            for i in range(500):
                producer.produce(topic, f"s{i}".encode(), on_delivery=delivered)
                producer.poll(0)
            assert producer.flush(120) == 0 and not failed, failed[:3]
            seen = _read_all(bootstrap, topic, set(acked), group=f"g-{topic}")
            assert seen == set(acked), f"{len(set(acked) - seen)} acknowledged messages not consumed"

            # The chart's quota holds a greedy client in the sidecar: 1.5 MiB in 64 KiB batches at
            # 256 KiB/s, past the window's burst (quota x 10 x 0.2 s), takes seconds (the last
            # batch's throttle comes after its answer), and the client is told of the throttle.
            throttles: list[int] = []

            def on_stats(raw: str) -> None:
                for broker_stats in json.loads(raw).get("brokers", {}).values():
                    throttles.append(int(broker_stats.get("throttle", {}).get("max", 0)))

            slow = Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "client.id": "podman-slow",
                    "log_level": 2,
                    "batch.size": 65536,
                    "linger.ms": 5,
                    "statistics.interval.ms": 200,
                    "stats_cb": on_stats,
                }
            )
            began = time.monotonic()
            for _ in range(1536):
                slow.produce(topic, b"x" * 1024, on_delivery=delivered)
                slow.poll(0)
            assert slow.flush(120) == 0 and not failed, failed[:3]
            took = time.monotonic() - began
            slow.poll(0.5)  # a last statistics callback
            least = (1536 * 1024 - 2 * quota - 65536) / quota
            assert took >= 0.75 * least, f"1.5 MiB in {took:.1f} s at {quota // 1024} KiB/s"
            assert max(throttles, default=0) > 0, "the client was never told of a throttle"
            status, body = _admin(ports["admin"], "/quotas/entity?client_id=podman-slow", token)
            assert status == 200 and json.loads(body)["producer_byte_rate"]["quota"] == quota, body

            # A changed quota in the ConfigMap reaches the running sidecar; no container restarts
            # and the pod template (which would roll the StatefulSet) does not change.
            sidecar_name = f"{pod_name}-{sidecar['name']}"
            started_at = kube_play.inspect(sidecar_name, podman_env)["State"]["StartedAt"]
            changed = kube_play.render(
                {
                    **values,
                    "quotas": {**values["quotas"], "clients": {"podman-slow": {"producer_byte_rate": SLOW}}},
                }
            )
            assert (
                kube_play.only(changed, "StatefulSet")["spec"]["template"] == statefulset["spec"]["template"]
            ), "a quota change would roll the broker pods"
            for volume in volumes:
                volume.write([*(m for m in changed if m["kind"] == "ConfigMap"), objects[-1]])

            wait_until(
                lambda: _producer_quota(ports["admin"], token, "podman-slow") == SLOW,
                30,
                "the ConfigMap's new quota never reached the sidecar",
            )
            assert kube_play.inspect(sidecar_name, podman_env)["State"]["StartedAt"] == started_at, (
                "restarted"
            )

            # The pod deleted while a producer has requests in flight through the sidecar (SIGTERM
            # to both containers, then the pod's grace period): the sidecar drains and exits 0,
            # and everything it acknowledged is in the broker's log.
            grace = int(spec["terminationGracePeriodSeconds"])
            _stop_under_producer(pod_name, grace, podman_env, producer, topic, delivered, acked)
            exit_code = kube_play.inspect(sidecar_name, podman_env)["State"]["ExitCode"]
            sidecar_log = subprocess.run(
                ["podman", "logs", sidecar_name], capture_output=True, text=True, timeout=60, env=podman_env
            )
            log = sidecar_log.stdout + sidecar_log.stderr
            assert exit_code == 0, f"the sidecar exited {exit_code}:\n{log[-3000:]}"
            # Its broker stops at the same moment here (not after it, as on Kubernetes), so a
            # request may be cut by the broker; the summary is printed, not judged.
            print(f"podman sidecar: {DrainSummary.from_log(log)}")
        except BaseException:
            for container in (sidecar, broker):
                logs = subprocess.run(
                    ["podman", "logs", "--tail", "40", f"{pod_name}-{container['name']}"],
                    capture_output=True,
                    text=True,
                    env=podman_env,
                )
                print(f"--- {container['name']}:\n{logs.stdout}{logs.stderr}")
            raise
    in_log = _logged_values(tmp_path / "volumes" / "data", topic)
    late = {v for v in acked if v.startswith(b"late")}
    print(f"podman: {len(late)} messages acknowledged through the sidecar from the drain's producer")
    missing = late - in_log
    assert not missing, f"{len(missing)} acknowledged messages not in the broker's log: {sorted(missing)[:3]}"


def _logged_values(data_dir: Path, topic: str) -> set[bytes]:
    """Every record value in ``topic``'s log segments under a stopped broker's ``data_dir``, as
    Kafka's own DumpLogSegments prints them."""
    segments = sorted(str(p) for p in data_dir.glob(f"{topic}-*/*.log"))
    assert segments, f"no log segments of {topic} in {data_dir}: {sorted(p.name for p in data_dir.iterdir())}"
    dumped = run_tool("kafka.tools.DumpLogSegments", "--files", ",".join(segments), "--print-data-log")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    return {m.group(1).encode() for m in re.finditer(r" payload: (\S*)$", dumped.stdout, re.MULTILINE)}
