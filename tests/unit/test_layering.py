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


# The compiled path's loader (no wire format in it): every compiled package's __init__ calls it.
ANYWHERE = {"protocol.compiled", "protocol.compiled.use_compiled"}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_it_stands_on(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files(package)
        for name in sorted(_imports(path))
        if name.split(".")[0] not in ALLOWED[package] and name not in ANYWHERE
    ]
    assert not wrong


def test_stages_see_the_connection_only_through_their_interface() -> None:
    """A stage never imports the pipeline, its flow control, its sockets or the server."""
    banned = {
        "proxy.pipeline.connection",
        "proxy.server",
        "proxy.pipeline.flow",
        "proxy.net.transports",
        "proxy.pipeline.frame_streams",
    }
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files("proxy/pipeline/stages")
        for name in sorted(_imports(path))
        if name in banned
    ]
    assert not wrong


def _runtime_imports(path: Path) -> set[str]:
    """The modules of ours a file imports when it runs: imports under ``if TYPE_CHECKING:`` are
    for types only and left out."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("proxy.")}


# The rooms of proxy/, lowest first. A room's modules import the proxy's basics, their own room
# and the rooms below it; the wiring (server, reload, cli) imports anything; nothing imports the
# wiring or a room above it when it runs.
BASICS = ("config", "secrets", "ratelog", "metrics", "traffic_metrics")
ROOMS = ("net", "shared", "capture", "pipeline", "admin")
WIRING = ("server", "reload", "cli")


def _place(module: str) -> str:
    """The room (or basics, wiring) a module of proxy/ lives in."""
    part = module.split(".")[1]
    if part in ROOMS:
        return part
    if part in BASICS:
        return "basics"
    if part in WIRING:
        return "wiring"
    return part  # a module name not in the map fails the test below


def test_every_proxy_module_lives_in_a_known_room() -> None:
    places = {
        _place("proxy." + ".".join(p.relative_to(ROOT / "proxy").with_suffix("").parts))
        for p in _files("proxy")
    }
    assert places <= {"basics", "wiring", *ROOMS, "__init__"}, places


def test_nothing_in_proxy_imports_upward_when_it_runs() -> None:
    order = {"basics": 0, **{room: i + 1 for i, room in enumerate(ROOMS)}, "wiring": len(ROOMS) + 1}
    wrong = []
    for path in _files("proxy"):
        module = "proxy." + ".".join(path.relative_to(ROOT / "proxy").with_suffix("").parts)
        here = _place(module)
        if here in ("wiring", "__init__"):
            continue
        for name in sorted(_runtime_imports(path)):
            there = _place(name)
            if there != here and order.get(there, 99) > order[here]:
                wrong.append(f"{path.relative_to(ROOT)} ({here}) imports {name} ({there})")
    assert not wrong


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
