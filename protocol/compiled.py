"""Where the compiled hot path is picked up: mypyc's build of the modules in ``COMPILED``.

The same typed source runs compiled (C extensions built by ``dev/compile.py``) or as pure Python.
The extensions live apart from the source, under ``.compiled/<python tag>/`` beside the packages,
never beside the ``.py`` files: an extension there would shadow the source after an edit. Each
compiled package's ``__init__`` calls ``use_compiled``, which puts the extensions first on the
package's path only while the build's stamp matches the sources; an edited source runs as pure
Python (said once on stderr) until the next build. ``KTHROTTLE_PURE_PYTHON=1`` runs pure Python
whatever was built (CI runs the codec and pipeline unit tests so too).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

# The per-request path. Sans-IO: frame splitting and headers, the Produce scan and acks, the
# look for NodeEndpoints at the end of every Produce v10+ and Fetch v16+ answer, record batch
# headers, and the byte-rate quota tables with what they call per request; and the walk of a
# large Metadata answer's topics, which runs on the event loop. Then the socket protocols' calls
# on each read, and the pipeline that calls them for each request: its in-flight queue and flow
# control, streamed frames, the stage dispatch, the request, response and FIFO entry objects, the
# address stage every Produce and Fetch passes, and the traffic counters (its coroutines stay
# pure: proxy/pipeline/tasks.py).
COMPILED = (
    "protocol/api_keys.py",
    "protocol/frames.py",
    "protocol/metadata_topics.py",
    "protocol/node_endpoints.py",
    "protocol/partition_bytes.py",
    "protocol/produce_scan.py",
    "protocol/records.py",
    "protocol/schema.py",
    "protocol/versions.py",
    "quota/cluster.py",
    "quota/entities.py",
    "quota/generation.py",
    "quota/keys.py",
    "quota/manager.py",
    "quota/rate.py",
    "quota/shared_usage.py",
    "quota/token_bucket.py",
    "proxy/net/pipeline_reads.py",
    "proxy/pipeline/connection.py",
    "proxy/pipeline/flow.py",
    "proxy/pipeline/frame_streams.py",
    "proxy/pipeline/stages/addresses.py",
    "proxy/pipeline/stages/base.py",
    "proxy/pipeline/stages/chain.py",
    "proxy/traffic_metrics.py",
)

PACKAGES = tuple(sorted({rel.split("/")[0] for rel in COMPILED}))  # whose sources a build is of
ROOT = Path(__file__).resolve().parent.parent  # where the packages are
PURE_ENV = "KTHROTTLE_PURE_PYTHON"
_fresh: bool | None = None  # the build matches the sources (checked once per process)


def build_dir() -> Path:
    return ROOT / ".compiled" / sys.implementation.cache_tag


def source_stamp() -> str:
    """What a build is of: this Python and every source of the compiled packages (a compiled
    module holds the types it imports from its package's pure modules too, checked at run time)."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _build_is_fresh() -> bool:
    global _fresh
    if _fresh is None:
        stamp = build_dir() / "STAMP"
        try:
            built = stamp.read_text().strip()
        except OSError:
            _fresh = False  # never built here (no compiler): pure Python, as setup said
            return False
        _fresh = built == source_stamp()
        if not _fresh:
            print(
                f"kthrottle: the compiled modules in {build_dir()} are older than their source; "
                "running pure Python (python dev/compile.py, or source dev/setup.sh, builds them)",
                file=sys.stderr,
            )
    return _fresh


def use_compiled(package: str, path: list[str]) -> None:
    """Called by the ``__init__`` of a package holding compiled modules with its name and ``__path__``."""
    if os.environ.get(PURE_ENV) or not _build_is_fresh():
        return
    where = build_dir()
    if str(where) not in sys.path:
        sys.path.append(str(where))  # mypyc's shared runtime of the build, a top-level module
    path.insert(0, str(where.joinpath(*package.split("."))))


def loaded_compiled(module: object) -> bool:
    """Whether ``module`` was loaded from a compiled extension."""
    return not str(getattr(module, "__file__", "")).endswith(".py")
