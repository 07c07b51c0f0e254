"""The previous release's source tree, to run it beside this one (a rolling upgrade test).

The previous release is the newest one whose fixtures are checked in under
tests/fixtures/releases/ (``dev/release_fixtures.py`` writes them once per release); its source is
taken from this repository's history with ``git archive``. A shallow clone without that commit
fetches it from ``origin`` first, and fails by name if it cannot.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASES = REPO / "tests" / "fixtures" / "releases"


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def _has(commit: str) -> bool:
    return _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def previous_commit() -> str:
    """The commit of the newest release with fixtures (by commit time)."""
    commits = [json.loads((d / "MANIFEST.json").read_text())["commit"] for d in RELEASES.iterdir()]
    if not commits:
        raise RuntimeError(f"no release fixtures under {RELEASES}")
    for commit in commits:
        if not _has(commit):
            _git("fetch", "--quiet", "--depth=1", "origin", commit)
        if not _has(commit):
            raise RuntimeError(
                f"release {commit[:12]} is not in this clone's history and could not be fetched "
                "from origin: clone with history (not --depth) to run the upgrade test"
            )

    def when(commit: str) -> int:
        return int(_git("log", "-1", "--format=%ct", commit).stdout)

    return str(max(commits, key=when))


def checkout(dest: Path, commit: str | None = None) -> Path:
    """The release's source tree in ``dest`` (made if missing); returns ``dest``."""
    commit = commit or previous_commit()
    archive = _git("archive", commit)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit[:12]}: {archive.stderr.decode(errors='replace')}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest
