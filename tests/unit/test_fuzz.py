"""The fuzz targets in CI: the committed corpus replays clean, then a bounded atheris run each.

A bounded run starts from fuzz/corpus/<target>/ with a fixed seed, so CI needs no broker and
takes seconds; a crash fails the test with the crashing input's path and the traceback.
Longer runs: ``python fuzz/run.py --target X --runs N`` or ``bench/fuzz.py``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.pipeline_target import shared_fuzzer
from fuzz.targets import request_target, response_target
from tests.tools import unavailable

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "fuzz" / "corpus"
# Inputs per target: a second or two each on a 2-core machine, corpus loading included (the
# same inputs every run, from a fixed seed: longer searches are bench/fuzz.py's).
RUNS = {"requests": 30_000, "responses": 20_000, "pipeline": 3_000}


@pytest.mark.parametrize("target", sorted(RUNS))
def test_corpus_replays_clean(target: str) -> None:
    run = {"requests": request_target, "responses": response_target, "pipeline": shared_fuzzer().run}[target]
    seeds = sorted((CORPUS / target).iterdir())
    assert len(seeds) >= 10, f"the {target} corpus is missing (dev/record_corpus.py makes it)"
    for path in seeds:
        try:
            run(path.read_bytes())
        except Exception as exc:
            raise AssertionError(f"seed {path} fails: {exc!r}") from exc


@pytest.mark.parametrize("target", sorted(RUNS))
def test_bounded_fuzz(target: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        unavailable("atheris not installed")
    artifacts = tmp_path / "artifacts"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "fuzz" / "run.py"),
            "--target",
            target,
            "--runs",
            str(RUNS[target]),
            "--seed",
            "1",
            "--new-corpus",
            str(tmp_path / "new"),
            "--artifacts",
            str(artifacts),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    crashes = sorted(artifacts.glob("*")) if artifacts.exists() else []
    assert proc.returncode == 0 and not crashes, (
        f"fuzz target {target} crashed (exit {proc.returncode}); inputs: {[str(c) for c in crashes]}\n"
        f"replay: python fuzz/run.py --target {target} --replay <input>\n{proc.stderr[-4000:]}"
    )
    assert f"#{RUNS[target]}\tDONE" in proc.stderr, proc.stderr[-2000:]
