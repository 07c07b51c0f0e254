"""The import rules of docs/architecture.md, checked on the source: a change that breaks one
fails here with the file and the import, not later as a circle or a slow test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("protocol", "quota", "proxy", "analytics")


def _imports(path: Path) -> set[str]:
    """Every module of ours a file imports (TYPE_CHECKING imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in OURS}


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


# package -> the top-level packages of ours it may import
ALLOWED = {
    "protocol": {"protocol"},
    "quota": {"quota"},
    "analytics": {"analytics", "quota", "protocol"},
}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_it_stands_on(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files(package)
        for name in sorted(_imports(path))
        if name.split(".")[0] not in ALLOWED[package]
    ]
    assert not wrong


def test_stages_see_the_connection_only_through_their_interface() -> None:
    """A stage never imports the pipeline, its flow control, its sockets or the server."""
    banned = {"proxy.pipeline", "proxy.server", "proxy.flow", "proxy.transports", "proxy.frame_streams"}
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files("proxy/stages")
        for name in sorted(_imports(path))
        if name in banned
    ]
    assert not wrong


def test_the_pipeline_does_not_import_the_server() -> None:
    for module in ("pipeline", "flow", "frame_streams", "transports", "host"):
        assert "proxy.server" not in _imports(ROOT / "proxy" / f"{module}.py"), module


def test_protocol_and_quota_stay_sans_io() -> None:
    """protocol/ and quota/ take bytes and times and return decisions: no sockets, no event loop."""
    io = {"asyncio", "socket", "ssl", "selectors", "uvloop"}
    wrong = []
    for package in ("protocol", "quota"):
        for path in _files(package):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                wrong += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] in io]
    assert not wrong
