"""The job's own Python packages, shipped to Spark's Python workers.

The replay runs ``analytics`` and ``quota`` code in Spark's Python workers. Those are other
processes (on a cluster, other machines) with their own ``sys.path``: neither the driver's working
directory nor its ``PYTHONPATH`` reaches them. So the driver zips the packages from wherever it
imported them (a checkout or site-packages) and adds the zip with ``SparkContext.addPyFile``;
Spark copies it to every executor and puts it on the workers' ``sys.path``. Code that runs in a
worker needs only the standard library, pyspark's own dependencies (pandas, pyarrow, numpy) and
this zip: the quota config reaches it as plain attributes (``quota.plain_config``), not pydantic.

The zip's name carries a hash of its contents: zips of different sources never share a name
(Spark refuses a second file of one name in an application), and one application ships once.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

PACKAGES = ("protocol", "quota", "analytics")
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # the same bytes for the same sources
_shipped: dict[str, Path] = {}  # application id -> the zip it got
_workdir: Path | None = None


def package_files() -> list[tuple[str, Path]]:
    """(name inside the zip, file) of every source file of the shipped packages, sorted."""
    files: list[tuple[str, Path]] = []
    for name in PACKAGES:
        init = importlib.import_module(name).__file__
        if init is None or not Path(init).is_file():  # a namespace package, or imported from a zip
            raise RuntimeError(f"cannot ship package {name!r}: it was not imported from source files")
        root = Path(init).parent
        found = [
            path
            for path in sorted(root.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        ]
        files += [(f"{name}/{path.relative_to(root).as_posix()}", path) for path in found]
    return files


def build_zip(directory: Path) -> Path:
    """Zip the packages into ``directory``, named by a hash of their contents."""
    files = package_files()
    digest = hashlib.sha256()
    for arcname, path in files:
        digest.update(arcname.encode() + b"\0" + path.read_bytes() + b"\0")
    target = directory / f"kthrottle-{digest.hexdigest()[:12]}.zip"
    if not target.exists():
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for arcname, path in files:
                info = zipfile.ZipInfo(arcname, _FIXED_TIME)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, path.read_bytes())
        partial.rename(target)
    return target


def _scratch() -> Path:
    global _workdir
    if _workdir is None:
        _workdir = Path(tempfile.mkdtemp(prefix="kthrottle-tune-py-"))
        atexit.register(shutil.rmtree, _workdir, True)
    return _workdir


def ship(sc: SparkContext) -> Path:
    """Add the packages' zip to ``sc`` (once per application); the zip's path."""
    app = sc.applicationId
    if app not in _shipped:
        archive = build_zip(_scratch())
        sc.addPyFile(str(archive))
        _shipped[app] = archive
    return _shipped[app]
