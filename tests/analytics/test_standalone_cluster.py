"""docs/tuning.md's spark-submit line on a real standalone Spark master and worker, started from
the installed pyspark: the job runs beyond one process and proposes what local[*] proposed.

It needs no broker, so it runs with the compute-only tests, on the generated captures the other
analytics tests read; tests/integration/test_tune_loop.py runs the loop (capture through the
proxy, tune, apply) on live traffic."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from analytics.generate import GeneratedTruth


@pytest.mark.timeout(600)
def test_spark_submit_on_a_standalone_cluster(
    report: Path, captures: tuple[Path, GeneratedTruth], tmp_path: Path
) -> None:
    """Run from a directory outside the checkout with no PYTHONPATH, on a master and a worker
    whose Python has pyspark's own dependencies and nothing of this project: the job ships its
    packages to the executors, the replay runs there, and the proposal is the one local[*] made
    from the same captures (it must not depend on how the work is split)."""
    from dev.spark_cluster import SparkStandalone, executor_python, submit_tune

    cluster_python = executor_python(tmp_path / "cluster-python")
    for module, present in (("pandas", True), ("pyarrow", True), ("pydantic", False), ("quota", False)):
        probe = [str(cluster_python), "-c", f"import {module}"]
        found = subprocess.run(probe, cwd=tmp_path, env={}, capture_output=True).returncode
        assert (found == 0) == present, f"the cluster's Python {'lacks' if present else 'has'} {module}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "tuned-on-cluster"
    # Two cores, as the machine has: the proposal must not depend on how the work is split.
    with SparkStandalone(workers=1, cores=2) as cluster:
        tune_args = ["--input", str(captures[0]), "--output", str(out)]
        submit = submit_tune(cluster.master_url, cluster_python, tune_args, elsewhere, timeout=540)
    # spark-submit passes the Python driver's stderr to its stdout: the job's lines are there
    last = submit.stdout.strip().splitlines()[-1:]
    assert submit.returncode == 0, f"spark-submit failed: {last}\n{submit.stdout[-4000:]}"
    assert last[0].startswith("tune: [") and f"wrote {out}" in last[0], last
    meta = json.loads((out / "meta.json").read_text())
    assert meta["master"] == cluster.master_url
    assert meta["replay"]["replayed_rows"] > 0, "no request was replayed on the executors"
    on_cluster = yaml.safe_load((out / "quotas.yaml").read_text())
    assert on_cluster == yaml.safe_load((report / "quotas.yaml").read_text())
