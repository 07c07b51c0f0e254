"""The lean install (and the default image) has no pyarrow: what needs it says so at load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import proxy.config
from proxy.config import ConfigError, parse_config

REPO = Path(__file__).resolve().parents[2]
GATEWAY = "gateway: {upstream_bootstrap: ['127.0.0.1:9092']}\n"


def test_capture_to_files_without_pyarrow_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy.config, "parquet_available", lambda: False)
    with pytest.raises(ConfigError, match=r":2: capture: .*needs pyarrow.*kthrottle\[capture\]"):
        parse_config(GATEWAY + "capture: {enabled: true, directory: /tmp/c}\n")
    # Capture to a Kafka topic, or no capture, needs no pyarrow.
    parse_config(GATEWAY + "capture: {enabled: true, sink: kafka}\n")
    parse_config(GATEWAY + "capture: {enabled: false}\n")


def test_the_proxy_runs_without_pyarrow(tmp_path: Path) -> None:
    """With pyarrow unimportable the proxy's modules load and its config is checked; capture-export
    refuses with the reason (exit 2)."""
    block = "import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.parquet'] = None\n"
    config = tmp_path / "kthrottle.yaml"
    config.write_text(GATEWAY)
    check = (
        block + "import proxy.server, proxy.pipeline.connection, proxy.capture.writer, proxy.cli\n"
        f"sys.exit(proxy.cli.main(['check-config', {str(config)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    export = block + "import proxy.cli\nsys.exit(proxy.cli.main(['capture-export', '--output', 'x']))\n"
    done = subprocess.run(
        [sys.executable, "-c", export], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "needs pyarrow" in done.stderr, done.stderr
    assert not (tmp_path / "x").exists()
