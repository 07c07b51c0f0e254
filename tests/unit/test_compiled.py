"""The compiled hot path (protocol/compiled.py) is the one that runs: under the README's test
command, where a C compiler is present (``KTHROTTLE_REQUIRE_COMPILED=1``), every module of
``COMPILED`` is loaded from its extension; with ``KTHROTTLE_PURE_PYTHON=1`` none is; and a build
older than its source is never used."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from protocol.compiled import COMPILED, PACKAGES, PURE_ENV, ROOT, build_dir, loaded_compiled

MODULES = [rel[: -len(".py")].replace("/", ".") for rel in COMPILED]


def test_the_compiled_modules_are_loaded_all_or_none_as_asked() -> None:
    loaded = {name: loaded_compiled(importlib.import_module(name)) for name in MODULES}
    if os.environ.get(PURE_ENV):
        assert not any(loaded.values()), loaded
    elif os.environ.get("KTHROTTLE_REQUIRE_COMPILED"):
        assert all(loaded.values()), f"not compiled: {[n for n, c in loaded.items() if not c]}"
    else:
        assert len(set(loaded.values())) == 1, loaded  # never a mix of builds


def test_an_edited_source_runs_as_pure_python_never_as_its_old_build(tmp_path: Path) -> None:
    for package in PACKAGES:  # the build's stamp is of them all
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = build_dir()
    if built.is_dir():
        (tmp_path / ".compiled").mkdir()
        (tmp_path / ".compiled" / built.name).symlink_to(built)
    probe = "import protocol.frames, quota.manager; print(protocol.frames.__file__, quota.manager.__file__)"
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    env["PYTHONPATH"] = str(tmp_path)

    def files() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        )

    as_built = files()
    if os.environ.get("KTHROTTLE_REQUIRE_COMPILED"):
        assert as_built.stdout.split()[0].endswith(".so"), as_built.stderr  # the copy matches its build
    with (tmp_path / "quota" / "manager.py").open("a") as source:
        source.write("\n# edited after the build\n")
    edited = files()
    assert edited.stdout.split() == [
        str(tmp_path / "protocol" / "frames.py"),
        str(tmp_path / "quota" / "manager.py"),
    ]
    if built.is_dir() and as_built.stdout.split()[0].endswith(".so"):
        assert "older than their source" in edited.stderr  # said, not silent
