"""The sidecar example's broker start script (helm/kthrottle/templates/kafka-example.yaml), run for
real with bash as pod 1 of the StatefulSet would run it, against Kafka's own storage tool from the
pinned jars (dev/pom.xml, the image's version 4.1.1): Kafka accepts the server.properties it writes
and formats the log dir with the pod's node id. No broker is started: the script's final
`kafka-server-start.sh` is replaced by a copy of its argument.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import yaml

from dev.harness import java_command
from tests.deploy.test_helm_chart import SIDECAR, docs_of, find, render
from tests.tools import unavailable

DOMAIN = "rel-kthrottle-kafka-headless.kafka.svc.cluster.local"


def _properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props


def test_the_broker_start_script_writes_a_config_kafka_formats(helm: str, tmp_path: Path) -> None:
    if not os.environ.get("KTHROTTLE_KAFKA_LIBS"):
        unavailable("KTHROTTLE_KAFKA_LIBS is not set: source dev/setup.sh for the Kafka jars")
    docs = docs_of(render(helm, SIDECAR))
    data = find(docs, "ConfigMap", "rel-kthrottle-kafka-scripts")["data"]
    sts = find(docs, "StatefulSet")
    (kafka,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in kafka["env"]}
    assert kafka["command"] == ["/bin/bash", "/opt/kthrottle-kafka/start.sh"]

    # The pod's file system, moved under tmp_path: the mounted scripts, /tmp, the data volume, and
    # the image's /opt/kafka/bin with Kafka's storage tool behind kafka-storage.sh.
    scripts, bin_dir, data_dir, out = (tmp_path / d for d in ("scripts", "bin", "data", "out"))
    for d in (scripts, bin_dir, data_dir, out):
        d.mkdir()
    (scripts / "extra.properties").write_text(data["extra.properties"])
    storage = " ".join(shlex.quote(a) for a in java_command("kafka.tools.StorageTool", heap="128m"))
    (bin_dir / "kafka-storage.sh").write_text(f'#!/bin/bash\nexec {storage} "$@"\n')
    (bin_dir / "kafka-server-start.sh").write_text(f'#!/bin/bash\ncp "$1" {out}/server.properties\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = (
        data["start.sh"]
        .replace("/opt/kthrottle-kafka/", f"{scripts}/")
        .replace("/opt/kafka/bin/", f"{bin_dir}/")
        .replace("/tmp/kafka", str(tmp_path / "tmp-kafka"))
        .replace("log.dirs=/var/lib/kafka/data", f"log.dirs={data_dir}")
    )
    (scripts / "start.sh").write_text(script)
    run_env = dict(os.environ, HOSTNAME="rel-kthrottle-kafka-1", CLUSTER_ID=env["CLUSTER_ID"])
    result = subprocess.run(
        ["/bin/bash", str(scripts / "start.sh")], capture_output=True, text=True, timeout=120, env=run_env
    )
    assert result.returncode == 0, result.stdout + result.stderr

    props = _properties(out / "server.properties")
    assert props["node.id"] == "1"
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"].startswith("CLIENT://127.0.0.1:9093,")
    assert props["advertised.listeners"] == (
        f"CLIENT://rel-kthrottle-kafka-1.{DOMAIN}:9093,REPLICATION://rel-kthrottle-kafka-1.{DOMAIN}:9094"
    )
    assert props["min.insync.replicas"] == "2"
    meta = _properties(data_dir / "meta.properties")
    assert meta["node.id"] == "1" and meta["cluster.id"] == env["CLUSTER_ID"]
    # The proxy's config in the same pod points at the broker's localhost listener.
    config = yaml.safe_load(find(docs, "ConfigMap", "rel-kthrottle-config")["data"]["kthrottle.yaml"])
    assert config["sidecar"]["upstream"] == "127.0.0.1:9093"
