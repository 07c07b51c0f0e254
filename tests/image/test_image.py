"""The container image, built by dev/image.sh and run as a user would run it: read-only root file
system, non-root, no capabilities, in front of the real broker; real clients produce and consume
through it; its admin endpoints and HEALTHCHECK answer; SIGTERM drains and it exits 0.

Runs as its own step of `.ci/run`, after the main suite (`bash dev/test.sh --image`). Skipped
with the reason only where the machine can run no container engine at all, and never under CI.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import yaml

from dev.harness import KafkaCluster
from dev.proxy_process import DrainSummary, gateway_config
from dev.waiting import wait_until
from tests.integration.clients import produce_until
from tests.tools import unavailable

REPO = Path(__file__).resolve().parents[2]
TAG = "kthrottle:test"
UID = 10001
pytestmark = pytest.mark.timeout(1500)


def _engine_and_run_args() -> tuple[str, list[str]]:
    done = subprocess.run(
        ["bash", str(REPO / "dev" / "image.sh"), "--print-run-args"], capture_output=True, text=True
    )
    if done.returncode != 0:
        unavailable(f"no container engine: {done.stderr.strip()[-300:]}")
    engine, *args = done.stdout.split()
    return engine, args


@pytest.fixture(scope="module")
def image() -> tuple[str, list[str], int]:
    """(engine, run arguments, size in MB) of the image built from this checkout."""
    engine, run_args = _engine_and_run_args()
    built = subprocess.run(
        ["bash", str(REPO / "dev" / "image.sh"), "--tag", TAG], capture_output=True, text=True, timeout=1400
    )
    assert built.returncode == 0, built.stderr[-4000:]
    size = int(built.stdout.split()[-1])
    print(f"image {TAG}: {size} MB")
    return engine, run_args, size


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


@pytest.fixture
def container(
    image: tuple[str, list[str], int], kafka_broker: KafkaCluster, tmp_path: Path
) -> Iterator[tuple[str, str, dict[str, object]]]:
    """The image running in front of the broker: (engine, container name, its config)."""
    engine, run_args, _ = image
    cfg = gateway_config(kafka_broker, drain_seconds=10)
    cfg["admin"] = {"host": "127.0.0.1", "port": cfg["admin"]["port"]}
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "kthrottle.yaml").write_text(yaml.safe_dump(cfg))
    for path in (tmp_path, etc, etc / "kthrottle.yaml"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    name = f"kthrottle-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            engine,
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "--read-only",
            "--tmpfs",
            "/tmp",
            "--user",
            f"{UID}:{UID}",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-e",
            f"KTHROTTLE_ADMIN_PORT={cfg['admin']['port']}",
            *run_args,
            "-v",
            f"{etc}:/etc/kthrottle:ro",
            TAG,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        yield engine, name, cfg
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, timeout=120)


def _logs(engine: str, name: str) -> str:
    done = subprocess.run([engine, "logs", name], capture_output=True, text=True, timeout=60)
    return (done.stdout + done.stderr)[-3000:]


def test_image_runs_read_only_non_root_and_drains_on_sigterm(
    container: tuple[str, str, dict[str, object]], image: tuple[str, list[str], int]
) -> None:
    from confluent_kafka import Consumer, Producer

    engine, name, cfg = container
    run_args = image[1]
    admin_port = cfg["admin"]["port"]  # type: ignore[index]
    gateway = cfg["gateway"]
    bootstrap = f"127.0.0.1:{gateway['bootstrap_port']}"  # type: ignore[index]
    wait_until(
        lambda: _get(admin_port, "/readyz")[0] == 200,
        60,
        lambda: f"never ready:\n{_logs(engine, name)}",
    )
    assert _get(admin_port, "/healthz")[0] == 200
    inspect = json.loads(
        subprocess.run([engine, "inspect", name], capture_output=True, text=True, check=True).stdout
    )[0]
    assert inspect["Config"]["User"] == f"{UID}:{UID}"
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    if engine == "podman":  # the image's own HEALTHCHECK, run now rather than on its interval
        health = subprocess.run([engine, "healthcheck", "run", name], capture_output=True, text=True)
        assert health.returncode == 0, health.stdout + health.stderr

    topic = f"image-{uuid.uuid4().hex[:6]}"
    sent: list[bytes] = []
    failed: list[tuple[float, str]] = []  # (when reported, the error)
    # log_level 2: the connection refusals after the proxy has exited are expected, not news
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": "image-test", "linger.ms": 5, "log_level": 2}
    )

    def delivered(err: object, msg: object) -> None:
        if err is None:
            sent.append(msg.value())  # type: ignore[attr-defined]
        else:
            failed.append((time.monotonic(), str(err)))

    for i in range(2000):
        producer.produce(topic, f"m{i}".encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed[:3]
    status, metrics = _get(admin_port, "/metrics")
    assert status == 200 and 'kthrottle_requests_total{api="Produce"}' in metrics

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "client.id": "image-reader",
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < len(sent) and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=500, timeout=1.0):
            if msg.error() is None:
                got.append(cast(bytes, msg.value()))
    consumer.close()
    assert sorted(got) == sorted(sent)

    # The chart's `helm test` Pod: its script, as its command runs it, in this image, locked down.
    script = (REPO / "helm" / "kthrottle" / "files" / "helm_test.py").read_text()
    helm_test = subprocess.run(
        [
            *(engine, "run", "--rm", "--network", "host", "--read-only", "--user", f"{UID}:{UID}"),
            *("--cap-drop", "ALL", *run_args, "--entrypoint", "python"),
            *("-e", f"KTHROTTLE_TEST_BOOTSTRAP={bootstrap}"),
            *("-e", f"KTHROTTLE_TEST_READYZ_URL=http://127.0.0.1:{admin_port}/readyz"),
            *("-e", "KTHROTTLE_TEST_TLS=false", "-e", "KTHROTTLE_TEST_TIMEOUT=30"),
            *(TAG, "-c", script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert helm_test.returncode == 0, helm_test.stdout + helm_test.stderr

    # SIGTERM while a producer has requests in flight: the acknowledged ones are all in the topic,
    # no client sees an error before the drain ends, and the process exits 0.
    stop = threading.Event()
    sent.clear()

    worker = threading.Thread(target=produce_until, args=(stop, producer, topic, delivered))
    worker.start()
    wait_until(lambda: len(sent) > 500, 30, "the producer made no progress")
    subprocess.run([engine, "kill", "--signal", "TERM", name], check=True, capture_output=True)
    waited = subprocess.run([engine, "wait", name], capture_output=True, text=True, timeout=60)
    exited = time.monotonic()
    stop.set()
    worker.join(30)
    producer.flush(10)
    assert waited.stdout.strip() == "0", f"exit code {waited.stdout.strip()}:\n{_logs(engine, name)}"
    # The proxy's own count: a request it read and did not answer would be retried by
    # librdkafka unseen, and only the proxy knows it cut one.
    drain = DrainSummary.from_log(_logs(engine, name))
    assert drain.connections >= 1 and drain.cut == 0 and drain.unanswered == 0, drain
    during_drain = [err for at, err in failed if at < exited]
    assert not during_drain, f"{len(during_drain)} failed before the drain ended: {during_drain[:3]}"
    acknowledged = set(sent)
    direct = Consumer(
        {
            "bootstrap.servers": gateway["upstream_bootstrap"][0],  # type: ignore[index]
            "group.id": f"d-{topic}",
            "auto.offset.reset": "earliest",
        }
    )
    direct.subscribe([topic])
    in_topic: set[bytes] = set()
    deadline = time.monotonic() + 60
    while not acknowledged <= in_topic and time.monotonic() < deadline:
        for msg in direct.consume(num_messages=1000, timeout=1.0):
            if msg.error() is None:
                in_topic.add(cast(bytes, msg.value()))
    direct.close()
    assert acknowledged <= in_topic, f"{len(acknowledged - in_topic)} acknowledged messages missing"


def test_the_default_image_is_lean(image: tuple[str, list[str], int]) -> None:
    """The proxy's runtime only (no pyarrow): at most 200 MB."""
    engine, run_args, size = image
    probe = subprocess.run(
        [engine, "run", "--rm", *run_args, "--entrypoint", "python", TAG, "-c", "import pyarrow"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode != 0 and "No module named 'pyarrow'" in probe.stderr
    assert size <= 200, f"{size} MB"


def test_the_image_runs_the_compiled_hot_path(image: tuple[str, list[str], int]) -> None:
    """Every module of protocol/compiled.py's COMPILED is loaded from its extension in the image
    (built in the builder stage), and the proxy's own modules import with them."""
    engine, run_args, _size = image
    probe = (
        "import importlib, proxy.cli\n"
        "from protocol.compiled import COMPILED, loaded_compiled\n"
        "names = [rel[:-3].replace('/', '.') for rel in COMPILED]\n"
        "print(sorted(n for n in names if not loaded_compiled(importlib.import_module(n))))\n"
    )
    run = subprocess.run(
        [engine, "run", "--rm", *run_args, "--entrypoint", "python", TAG, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == "[]", run.stdout  # none left pure
