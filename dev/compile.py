"""Builds the compiled hot path: the modules in ``protocol.compiled.COMPILED``, compiled by mypyc
from the same typed source into ``.compiled/<python tag>/`` (see protocol/compiled.py).

Does nothing when the build there matches the sources. Without a C compiler it says so and
exits 0: everything then runs as pure Python. With one, a failed build is an error.

Usage: python dev/compile.py [--force] [--require]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from protocol.compiled import COMPILED, build_dir, source_stamp  # noqa: E402


def compiler() -> str | None:
    """The C compiler Python's build would use, if it is installed, with Python's headers."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    found = shutil.which(cc)
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return found if found and header.is_file() else None


def build(out: Path) -> None:
    """mypyc + setuptools' build_ext, from a scratch copy: nothing is written beside the source.
    The stamp is of the sources as copied; a source changed during the build fails it."""
    stamp = source_stamp()
    with tempfile.TemporaryDirectory(prefix="kthrottle-mypyc-") as scratch:
        work = Path(scratch)
        for rel in COMPILED:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, work / rel)
        for rel in COMPILED:  # every package above a compiled module, with no loader while compiling
            for package in Path(rel).parents[:-1]:
                (work / package / "__init__.py").touch()
        shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")  # the project's mypy settings
        setup = (
            "from setuptools import setup\n"
            "from mypyc.build import mypycify\n"
            f"setup(name='kthrottle-compiled', ext_modules=mypycify({list(COMPILED)!r}, opt_level='3'))\n"
        )
        (work / "setup.py").write_text(setup)
        built = work / "out"
        env = {**os.environ, "PYTHONPATH": str(REPO), "MYPYPATH": str(REPO)}
        cmd = [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(built)]
        run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
            raise SystemExit(f"compile: mypyc failed (exit {run.returncode})")
        if source_stamp() != stamp:
            raise SystemExit("compile: a source changed while it was being compiled: run it again")
        staged = Path(tempfile.mkdtemp(prefix=f"{out.name}.new-", dir=out.parent))
        shutil.copytree(built, staged, dirs_exist_ok=True)
        (staged / "STAMP").write_text(stamp + "\n")
        # Swapped by renames: a process starting meanwhile finds the old build whole or the new.
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        staged.rename(out)
        shutil.rmtree(old, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--force", action="store_true", help="build even if the build matches the sources")
    parser.add_argument("--require", action="store_true", help="no C compiler is an error (the image build)")
    args = parser.parse_args()
    out = build_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time per checkout
        compile_once(out, args.force, args.require)


def compile_once(out: Path, force: bool, require: bool) -> None:
    stamp = out / "STAMP"
    if not force and stamp.is_file() and stamp.read_text().strip() == source_stamp():
        return
    if compiler() is None:
        if require:
            raise SystemExit("compile: no C compiler or Python headers, and --require was given")
        print("compile: no C compiler or Python headers here: kthrottle runs as pure Python", file=sys.stderr)
        return
    print(f"compile: building {len(COMPILED)} modules with mypyc into {out}", file=sys.stderr)
    build(out)


if __name__ == "__main__":
    main()
