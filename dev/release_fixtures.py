"""Write what a release writes, with that release's own code, as fixtures the next release must read.

Run against a checkout of a release (``--tree``), it imports that checkout's modules, not this
one's, and writes into ``--out``:

- ``config/``: the config and quotas files of that release's chart (the gateway and sidecar CI
  values, as ``helm template`` renders them) and every example of its config reference;
- ``capture/``: a Parquet capture file from its file sink, and the messages of its Kafka sink
  (headers and value, one JSON object per line);
- ``exchange/``: a usage report and a mutation record of the gateway replicas' exchange topic,
  and a volume snapshot record, as bytes;
- ``quota_api/``: the records its client-quota store writes (key and value, JSON lines);
- ``MANIFEST.json``: the commit and what each file is.

``tests/unit/test_release_formats.py`` reads every file with the current release. Made once per
release: ``python dev/release_fixtures.py --commit <the release's commit>`` (a temporary
checkout of it is made with ``git archive``).
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "releases"

# One Produce, one Fetch and one CreateTopics, in the capture schema's field order.
_ROWS: list[dict[str, Any]] = [
    {
        "ts_ms": 1_790_000_000_000,
        "proxy": "replica-0",
        "node": 1,
        "conn": 7,
        "client_addr": "10.0.0.5:51234",
        "principal": "User:alice",
        "client_id": "orders-app",
        "api_key": 0,
        "api_version": 11,
        "request_bytes": 16_512,
        "response_bytes": 96,
        "partitions": [("orders", 0, 16_384, 16), ("orders", 3, 0, 0)],
        "producer_ids": [4001],
        "new_producer_ids": 1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": 0,
        "decided_throttle_ms": 0,
        "broker_throttle_ms": 0,
        "upstream_ms": 1.75,
        "dry_run": False,
    },
    {
        "ts_ms": 1_790_000_000_250,
        "proxy": "replica-0",
        "node": 2,
        "conn": 8,
        "client_addr": "10.0.0.6:40001",
        "principal": "ANONYMOUS",
        "client_id": "reporting",
        "api_key": 1,
        "api_version": 17,
        "request_bytes": 120,
        "response_bytes": 1_048_700,
        "partitions": [("0123456789abcdef0123456789abcdef", 1, 1_048_576, -1)],
        "producer_ids": [],
        "new_producer_ids": -1,
        "mutations": -1,
        "mutations_rejected": 0,
        "error_codes": [],
        "throttle_ms": 412,
        "decided_throttle_ms": 412,
        "broker_throttle_ms": -1,
        "upstream_ms": 502.5,
        "dry_run": False,
    },
    {
        "ts_ms": 1_790_000_001_000,
        "proxy": "replica-1",
        "node": -1,
        "conn": 9,
        "client_addr": "[fd00::7]:60000",
        "principal": "User:ops",
        "client_id": "",
        "api_key": 19,
        "api_version": 7,
        "request_bytes": 210,
        "response_bytes": 64,
        "partitions": [],
        "producer_ids": [],
        "new_producer_ids": -1,
        "mutations": 12,
        "mutations_rejected": 12,
        "error_codes": [89],
        "throttle_ms": 0,
        "decided_throttle_ms": 0,
        "broker_throttle_ms": -1,
        "upstream_ms": -1.0,
        "dry_run": True,
    },
]


def _rows(field_names: list[str]) -> list[tuple[Any, ...]]:
    return [tuple(row[name] for name in field_names) for row in _ROWS]


def _helm_config(tree: Path, values: str) -> dict[str, str]:
    """The ConfigMap data the release's chart renders with one of its CI values files."""
    import yaml

    chart = tree / "helm" / "kthrottle"
    out = subprocess.run(
        ["helm", "template", "fixture", str(chart), "-f", str(chart / "ci" / values)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for doc in yaml.safe_load_all(out):
        if doc and doc.get("kind") == "ConfigMap" and "kthrottle.yaml" in (doc.get("data") or {}):
            return dict(doc["data"])
    raise SystemExit(f"{values}: the chart rendered no kthrottle ConfigMap")


def _write_configs(tree: Path, out: Path, manifest: dict[str, str]) -> None:
    for mode in ("gateway", "sidecar"):
        data = _helm_config(tree, f"{mode}-values.yaml")
        (out / f"chart-{mode}").mkdir(parents=True)
        for name in ("kthrottle.yaml", "quotas.yaml"):
            (out / f"chart-{mode}" / name).write_text(data[name], encoding="utf-8")
        manifest[f"config/chart-{mode}/kthrottle.yaml"] = f"the chart's {mode} config (ci/{mode}-values.yaml)"
    docs = importlib.import_module("dev.config_docs")
    for key in sorted(docs.EXAMPLES):
        name = f"example-{key or 'top-level'}.yaml"
        (out / name).write_text(docs.example_config(key), encoding="utf-8")
        manifest[f"config/{name}"] = f"the config reference's example of {key or 'the top level'}"
    (out / "quotas-file").mkdir()
    (out / "quotas-file" / "quotas.yaml").write_text(docs.QUOTAS_FILE_EXAMPLE, encoding="utf-8")
    (out / "quotas-file" / "kthrottle.yaml").write_text(
        docs.EXAMPLE_BASE + docs.QUOTAS_FILE_MAIN, encoding="utf-8"
    )
    manifest["config/quotas-file/kthrottle.yaml"] = "a main file naming a quotas file (quotas_file:)"


def _write_capture(out: Path, manifest: dict[str, str]) -> None:
    schema = importlib.import_module("quota.capture_schema")
    capture_json = importlib.import_module("quota.capture_json")
    writer = importlib.import_module("proxy.capture.writer")
    rows = _rows([f.name for f in schema.FIELDS])
    files = writer.CaptureFiles(out / "files", "replica-0", 1 << 30, 3600.0, clock=lambda: 1_790_000_000.0)
    files.write(rows)
    files.close()
    written = sorted((out / "files").glob("*.parquet"))
    if len(written) != 1:
        raise SystemExit(f"the file sink wrote {written}, not one capture file")
    written[0].rename(out / "capture.parquet")
    (out / "files").rmdir()
    manifest["capture/capture.parquet"] = "the files sink's Parquet capture file (3 records)"
    header = [schema.CAPTURE_VERSION_KEY, str(schema.CAPTURE_SCHEMA_VERSION)]
    with (out / "kafka-records.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"headers": [header], "value": capture_json.encode(row).decode()}) + "\n")
    manifest["capture/kafka-records.jsonl"] = "the Kafka sink's messages: headers and value"


def _write_exchange(out: Path, manifest: dict[str, str]) -> None:
    report = importlib.import_module("quota.cluster_report")
    usage = report.UsageReport("replica-0", 42, 1_790_000_000_125.0, address="10.0.0.9:9644")
    usage.add(report.PRODUCE, "User:alice", "orders-app", 65_536.0, report.BLOCKED)
    usage.add(report.FETCH, "<default>", "reporting", 1_048_576.0)
    usage.add(report.PRODUCE_PARTITION, "orders", "3", 16_384.0)
    usage.add(report.PRODUCER_ID, "User:alice", "4001", 1.0)
    (out / "usage-report.bin").write_bytes(usage.encode())
    manifest["exchange/usage-report.bin"] = "a usage report of the cluster-quota exchange"
    mutation = report.MutationRecord(
        "replica-1", 5, "User:ops", "admin-1", ("User:ops", "admin-1"), (3, 6), True, 5.0, 11.0
    )
    (out / "mutation-record.bin").write_bytes(mutation.encode())
    manifest["exchange/mutation-record.bin"] = "a mutation record of the cluster-quota exchange"
    volume = importlib.import_module("quota.volume_message")
    limit = volume.LimitDefinition(volume.LimitType.CONSUMED_SPACE, 900)
    snapshot = volume.VolumeSnapshot(
        1_790_000_000_000,
        limit,
        volume.LimitDefinition(volume.LimitType.CONSUMED_SPACE, 950),
        (volume.VolumeDetails("/var/lib/kafka", 1000, 800),),
    )
    record = {"key": base64.b64encode(volume.encode_key(2)).decode(), "value": snapshot.encode().decode()}
    (out / "volume-record.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
    manifest["exchange/volume-record.json"] = "a volume snapshot record (key base64, value JSON)"


def _write_quota_api(out: Path, manifest: dict[str, str]) -> None:
    ops = importlib.import_module("quota.client_quota_ops")
    entries = [
        ({"user": "alice", "client-id": "orders-app"}, "producer_byte_rate", 1_048_576.0),
        ({"user": None}, "consumer_byte_rate", 2_097_152.0),
        ({"client-id": "reporting"}, "request_percentage", None),
        ({"ip": "10.0.0.5"}, "connection_creation_rate", 10.0),
    ]
    with (out / "store-records.jsonl").open("w", encoding="utf-8") as f:
        for entity, key, value in entries:
            record = {
                "key": ops.encode_key(ops.canonical(entity), key).decode(),
                "value": None if value is None else ops.encode_value(value).decode(),
            }
            f.write(json.dumps(record) + "\n")
    manifest["quota_api/store-records.jsonl"] = "the client-quota store's records (a null value: removed)"


def write(tree: Path, out: Path, commit: str) -> None:
    sys.path.insert(0, str(tree))
    for name in [m for m in sys.modules if m.split(".")[0] in ("proxy", "quota", "protocol", "dev")]:
        del sys.modules[name]
    manifest: dict[str, str] = {}
    steps: tuple[tuple[str, Callable[[Path], None]], ...] = (
        ("config", lambda d: _write_configs(tree, d, manifest)),
        ("capture", lambda d: _write_capture(d, manifest)),
        ("exchange", lambda d: _write_exchange(d, manifest)),
        ("quota_api", lambda d: _write_quota_api(d, manifest)),
    )
    for part, step in steps:
        (out / part).mkdir(parents=True)
        step(out / part)
    doc = {"commit": commit, "written_by": "dev/release_fixtures.py", "files": dict(sorted(manifest.items()))}
    (out / "MANIFEST.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commit", required=True, help="the release's commit (in this repository)")
    parser.add_argument("--out", type=Path, help="default: tests/fixtures/releases/<commit, 12 digits>")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{args.commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    out = args.out or FIXTURES / commit[:12]
    if out.exists():
        raise SystemExit(f"{out} exists: fixtures of a release are written once")
    with tempfile.TemporaryDirectory(prefix="kthrottle-release-") as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        write(Path(tmp), out, commit)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
