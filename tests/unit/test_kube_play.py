"""The runtime step's stand-in for the kubelet's projected volumes (dev/kube_play.py): the files
are where the kubelet puts them, and an update swaps them all at once."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from dev.kube_play import ProjectedVolume, for_podman, secret

VOLUME: dict[str, Any] = {
    "name": "config",
    "projected": {
        "defaultMode": 0o440,
        "sources": [
            {"configMap": {"name": "cm", "items": [{"key": "a.yaml", "path": "a.yaml"}]}},
            {"secret": {"name": "s", "items": [{"key": "token", "path": "admin/token"}]}},
        ],
    },
}


def _objects(a: str, token: bytes) -> list[dict[str, Any]]:
    return [
        {"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a.yaml": a}},
        secret("s", {"token": token}),
    ]


def test_files_appear_through_data_and_an_update_replaces_them_at_once(tmp_path: Path) -> None:
    volume = ProjectedVolume(VOLUME, {}, tmp_path / "v")
    volume.write(_objects("one", b"t1"))
    assert (tmp_path / "v" / "a.yaml").read_text() == "one"
    assert (tmp_path / "v" / "admin" / "token").read_bytes() == b"t1"
    assert (tmp_path / "v" / "a.yaml").is_symlink() and (tmp_path / "v" / "..data").is_symlink()
    first = (tmp_path / "v" / "..data").readlink()
    volume.write(_objects("two", b"t2"))
    assert (tmp_path / "v" / "a.yaml").read_text() == "two"
    assert (tmp_path / "v" / "admin" / "token").read_bytes() == b"t2"
    assert not (tmp_path / "v" / first).exists(), "the old copy is removed"
    assert (tmp_path / "v" / "..data" / "a.yaml").stat().st_mode & 0o777 == 0o440


def test_the_pod_is_given_what_podman_lacks(tmp_path: Path) -> None:
    deployment: dict[str, Any] = {
        "kind": "Deployment",
        "spec": {
            "template": {
                "spec": {
                    "volumes": [VOLUME],
                    "containers": [
                        {
                            "name": "c",
                            "ports": [{"name": "admin", "containerPort": 9644}],
                            "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                        }
                    ],
                }
            }
        },
    }
    pod, volumes = for_podman(deployment, tmp_path)
    spec = pod["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    assert spec["volumes"][0]["hostPath"]["path"] == str(volumes[0].directory)
    assert "ports" not in spec["containers"][0]
    assert spec["containers"][0]["env"] == [{"name": "IP", "value": "127.0.0.1"}]
    assert "projected" in deployment["spec"]["template"]["spec"]["volumes"][0], "the original is kept"
    assert base64.b64decode(secret("s", {"k": b"v"})["data"]["k"]) == b"v"
