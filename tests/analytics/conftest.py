"""A local[2] SparkSession shared by the analytics tests, one generated capture set, and the job's
report on it."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.generate import GeneratedTruth, generate
from tests.tools import unavailable

# Records and span of the shared capture set: enough seconds per entity for stable p99s, small
# enough that the whole job runs in well under a minute on two cores.
RECORDS = 150_000
SPAN_S = 600


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] session for all analytics tests (the job reuses the active session)."""
    if importlib.util.find_spec("pyspark") is None:
        unavailable("the analytics extra (pyspark) is not installed")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from analytics.session import build_session

    session = build_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GeneratedTruth]:
    """Capture files with planted outliers (analytics/generate.py), written once per session."""
    directory = tmp_path_factory.mktemp("captures")
    return directory, generate(directory, RECORDS, seed=7, span_s=SPAN_S)


@pytest.fixture(scope="session")
def report(
    spark: Any, captures: tuple[Path, GeneratedTruth], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The job run once on the generated captures, in process, on the shared session (main
    reuses the active one)."""
    from analytics.tune import main

    directory, _ = captures
    out = tmp_path_factory.mktemp("tune") / "report"
    assert main(["--input", str(directory), "--output", str(out), "--quiet"]) == 0
    return out
