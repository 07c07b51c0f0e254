"""The tuning job (analytics/tune.py) at scale: 1M and 10M capture records on local[2].

Generates the two capture sets once (analytics/generate.py; cached under the cache directory and
reused while the record count and seed match), starts one local[2] Spark session, warms it up on a
small set, then times the whole job (statistics, proposal, replay, writing) on each set in the same
process. Then the same job on the 10M set through ``spark-submit`` on a real standalone cluster of
one worker with as many cores (dev/spark_cluster.py), its executors on a Python that has only
pyspark's own dependencies, as on a shared cluster. Spark start-up and generation are not timed.
Prints progress, then one JSON line last:

  records_per_s_1m, records_per_s_10m   records / job seconds
  scaling_ratio                         time_10m / (10 x time_1m): at most 1 means time grows no
                                        faster than linearly
  seconds_1m, seconds_10m               the job times
  stages_1m, stages_10m                 time per stage of each (statistics, proposal, replay, writing)
  cluster_records_per_s_10m             the 10M job on the 1-worker standalone cluster (its stages
  cluster_seconds_10m, cluster_stages_10m  after Spark's start, as above); --no-cluster leaves it out
  target_records_per_s                  250000 (10M on 2 cores)

Usage: source dev/setup.sh && python bench/tune_scale.py [--cache DIR] [--skip-replay] [--repeat N]
       [--no-cluster]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.generate import GeneratedTruth, generate
from analytics.session import build_session
from analytics.tune import main as tune
from dev.spark_cluster import SparkStandalone, executor_python, submit_tune

TARGET = 250_000
CORES = 2
MASTER = f"local[{CORES}]"


def log(message: str) -> None:
    print(f"tune_scale: {message}", file=sys.stderr, flush=True)


def captures(cache: Path, records: int, seed: int) -> Path:
    """The capture set of ``records`` records, generated unless the cache holds it already."""
    directory = cache / f"captures-{records}-{seed}"
    truth_file = directory / "truth.json"
    if truth_file.exists():
        truth = GeneratedTruth.from_json(truth_file.read_text())
        if truth.records == records and all(Path(f).exists() for f in truth.files):
            log(f"{records:,} records: cached in {directory}")
            return directory
    shutil.rmtree(directory, ignore_errors=True)
    start = time.monotonic()
    generate(directory, records, seed=seed)
    log(f"{records:,} records: generated in {time.monotonic() - start:.1f}s into {directory}")
    return directory


def run(inp: Path, out: Path, extra: list[str], repeat: int = 1) -> tuple[float, dict[str, Any]]:
    """The job's wall time on ``inp`` (the best of ``repeat`` runs) and the meta of that run."""
    best: tuple[float, dict[str, Any]] | None = None
    for _ in range(repeat):
        start = time.monotonic()
        code = tune(["--input", str(inp), "--output", str(out), *extra])
        took = time.monotonic() - start
        if code != 0:
            raise SystemExit(f"tune_scale: the job failed on {inp} (exit code {code})")
        meta = json.loads((out / "meta.json").read_text())
        if best is None or took < best[0]:
            best = (took, meta)
    assert best is not None
    return best


def on_cluster(inp: Path, out: Path, extra: list[str], cores: int) -> tuple[float, dict[str, Any]]:
    """The job through spark-submit on a 1-worker standalone cluster: its seconds after Spark's
    start (the stages, as ``run`` times them) and its meta."""
    python = executor_python(out / "cluster-python")
    with SparkStandalone(workers=1, cores=cores, memory="4g") as cluster:
        log(f"standalone cluster {cluster.master_url}: 1 worker, {cores} cores")
        memory = ("--conf", "spark.executor.memory=3g", "--driver-memory", "2g")
        tune_args = ["--input", str(inp), "--output", str(out / "cluster"), *extra]
        submit = submit_tune(cluster.master_url, python, tune_args, out, memory)
    if submit.returncode != 0:
        raise SystemExit(f"tune_scale: the job failed on the cluster: {submit.stdout.strip()[-2000:]}")
    meta = json.loads((out / "cluster" / "meta.json").read_text())
    took = sum(v for k, v in meta["stages"].items() if k != "starting Spark")
    return took, meta


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cache",
        default=os.environ.get("KTHROTTLE_BENCH_CACHE"),
        help="where the capture sets are kept (default: a directory under the temp dir)",
    )
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--large", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-replay", action="store_true", help="time statistics and proposal only")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per size, the fastest counts (noisy hosts)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines from the job")
    parser.add_argument("--no-cluster", action="store_true", help="leave out the run on a standalone cluster")
    args = parser.parse_args()
    cache = Path(args.cache or Path(tempfile.gettempdir()) / "kthrottle-tune-scale")
    cache.mkdir(parents=True, exist_ok=True)
    small = captures(cache, args.small, args.seed)
    large = captures(cache, args.large, args.seed)
    warm = captures(cache, 100_000, args.seed)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_session(MASTER)
    extra = [*(["--quiet"] if args.quiet else []), *(["--skip-replay"] if args.skip_replay else [])]
    out = Path(tempfile.mkdtemp(prefix="tune-scale-out-"))
    try:
        log("warming up (JIT, first jobs) on 100,000 records, not timed")
        run(warm, out / "warm", ["--quiet", *extra])
        log(f"timing the job on {args.small:,} records ({MASTER})")
        t_small, meta_small = run(small, out / "small", extra, args.repeat)
        log(f"{args.small:,} records: {t_small:.1f}s, {args.small / t_small:,.0f} records/s")
        log(f"timing the job on {args.large:,} records ({MASTER})")
        t_large, meta = run(large, out / "large", extra, args.repeat)
        log(f"{args.large:,} records: {t_large:.1f}s, {args.large / t_large:,.0f} records/s")
        for stage in meta["stages"]:
            small_s, large_s = meta_small["stages"].get(stage, 0.0), meta["stages"][stage]
            log(f"  {stage}: {small_s:.1f}s ({args.small:,})  {large_s:.1f}s ({args.large:,})")
        spark.stop()
        cluster: dict[str, Any] = {}
        if not args.no_cluster:
            t_cluster, meta_cluster = on_cluster(large, out, extra, CORES)
            log(
                f"{args.large:,} records on the cluster: {t_cluster:.1f}s, "
                f"{args.large / t_cluster:,.0f} records/s"
            )
            cluster = {
                "cluster_records_per_s_10m": round(args.large / t_cluster),
                "cluster_seconds_10m": round(t_cluster, 2),
                "cluster_stages_10m": meta_cluster["stages"],
                "cluster_master": f"standalone, 1 worker, {CORES} cores",
            }
    finally:
        shutil.rmtree(out, ignore_errors=True)
        spark.stop()
    ratio = t_large / (args.large / args.small * t_small)
    print(
        json.dumps(
            {
                "records_per_s_1m": round(args.small / t_small),
                "records_per_s_10m": round(args.large / t_large),
                "scaling_ratio": round(ratio, 3),
                "seconds_1m": round(t_small, 2),
                "seconds_10m": round(t_large, 2),
                "stages_1m": meta_small["stages"],
                "stages_10m": meta["stages"],
                "replay": not args.skip_replay,
                "master": MASTER,
                "target_records_per_s": TARGET,
                "meets_target": args.large / t_large >= TARGET and ratio <= 1.0,
                **cluster,
            }
        )
    )


if __name__ == "__main__":
    main()
