"""Capture files in, proposed quotas out: the kthrottle tuning job.

Run it any of these ways (the same job; Spark runs on ``local[*]`` unless told otherwise)::

    spark-submit analytics/tune.py --input DIR_OR_GLOB_OR_URI --output DIR [--master URL]
    python -m analytics.tune --input ... --output ...
    kthrottle tune --input ... --output ...

Input: a directory (searched recursively for ``*.parquet``), a glob, a file, or any Hadoop URI
(``s3a://``, ``hdfs://``, ...). It is refused before any work, exit code 2 and nothing written,
when unreadable, empty, of another capture schema version, or of mixed schemas.

Output (a local directory, written as a hidden sibling and renamed into place at the very end, so
a failure never leaves half a report; a previous report there is replaced)::

    quotas.yaml                   the proposal, loadable by the proxy as is (``quotas_file:``)
    report.html                   self-contained report (analytics.report, when available)
    meta.json                     input, span, options, stage times
    tables/<name>/<name>.parquet  every table below, also as
    tables/<name>/<name>.csv

Tables (name -> columns) handed to ``analytics.report.write_report`` and written under tables/.
Levels are ``user``, ``client`` and ``user-client``; '' is the key a level does not have; ``sec``
is epoch seconds; bytes are per 1-second window; definitions are in analytics/stats.py and the
proposal rules in analytics/propose.py (the operator controls': analytics/stats_controls.py and
analytics/propose_controls.py):

- entity_rates: level, user, client_id, direction (produce|fetch), active_s, total_bytes, p50_bps,
  p95_bps, p99_bps, max_bps, requests, throttle_ms, max_burst_s, bursts, mean_burst_s, mean_bps,
  throttled_share, quota_bps, quota_level (the proposed quota resolving for a (user, client-id)
  and its KIP-55 level; empty on the other levels)
- entity_series: level, user, client_id, direction, sec, bytes (top entities by p99, for plots)
- topic_rates: direction, topic, active_s, total_bytes, p50_bps, p95_bps, p99_bps, max_bps,
  partitions, partition_p99_max_bps, partition_max_bps
- partition_rates: direction, topic, partition, active_s, total_bytes, p50_bps, p95_bps, p99_bps,
  max_bps
- topic_series: direction, topic, sec, bytes (top topics by p99)
- mutations: level, user, client_id, requests, mutations, active_s, max_per_s, max_window,
  peak_rate, mean_rate, well_behaved
- mutation_series: level, user, client_id, sec, mutations
- producer_ids: user, new_ids, hours, max_new_per_hour, mean_new_per_hour, peak_ids_per_s,
  over_quota
- producer_ids_hourly: user, hour_start_s, covered_s, new_ids, ids_per_s
- client_families: prefix, direction, client_ids, peak_ids, median_life_s, first_s, last_s,
  requests, active_s, total_bytes, p50_bps, p95_bps, p99_bps, max_bps (client ids told apart
  only by a generated suffix, their bytes together; analytics/stats_controls.py)
- throttle_times: direction, throttle_ms (decided, rounded up to 100 ms), requests, longest_for
  (the throttles decided on Produce and Fetch; the entities whose longest is in the step)
- group_joins: level (user-client|client), user, client_id, joins, join_requests, first_ms,
  last_ms, span_s, peak_per_min, median_interval_s (new-member joins of consumer groups: the
  connections (proxy, conn) that sent a JoinGroup, each at its first; the most in any 60 s, the
  median time between them; analytics/stats_controls.py)
- proposal: kind (default|override|window|excluded|prefix|bound), level, user, client_id, topic,
  key, value, observed, basis, requests, seconds, entities (the evidence), written, note (why
  not written, or for a prefix, the bound and a join rate what the capture showed); ``prefix``
  rows are ``client_id_prefixes`` (client_id: the prefix), the ``bound`` row ``max_throttle_ms``,
  ``override`` rows of key ``join_group_rate`` an entity in a join loop (observed: its most
  joins in a minute; requests: its joins; seconds: their span) and one not written for the
  entities of 2 joins or more in none (analytics/propose_controls.py)
- replay: what ``analytics.replay.replay`` returns (when available)

``meta`` for the report: input, files, records, start_ms, end_ms, span_s, options, stages
(seconds per stage), spark_version, master, generated_at, notes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if not __package__:  # spark-submit analytics/tune.py, python analytics/tune.py: import from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd

from analytics.propose import DEFAULT_LEVELS, Proposal, ProposeOptions, propose
from analytics.session import (
    CaptureInput,
    InputError,
    build_session,
    check_local,
    check_remote,
    is_remote,
    read_captures,
)
from analytics.stats import Stats, StatsOptions, compute

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

QUOTAS_FILE = "quotas.yaml"
REPORT_FILE = "report.html"
MARKER = ".kthrottle-tune"  # marks a directory as this job's output (safe to replace)


class Progress:
    """Progress lines on stderr with the elapsed time, and the time of each stage."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.stages: dict[str, float] = {}

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"tune: [{time.monotonic() - self.t0:7.1f}s] {message}", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        print(f"tune: warning: {message}", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        self(f"{name} ...")
        yield
        took = time.monotonic() - start
        self.stages[name] = round(took, 3)
        self(f"{name}: done in {took:.1f}s")


def _control_args(p: argparse.ArgumentParser) -> None:
    """The options of the operator controls' and the join guard rail's proposals."""
    p.add_argument(
        "--request-timeout-ms",
        type=int,
        default=30_000,
        help="clients' request.timeout.ms: propose max_throttle_ms when throttles outlast it (30000)",
    )
    p.add_argument(
        "--poll-interval-ms",
        type=int,
        default=300_000,
        help="consumers' max.poll.interval.ms: one fetch throttled longer calls for a bound (300000)",
    )
    p.add_argument(
        "--bound-share",
        type=float,
        default=0.01,
        help="share of throttled requests over the request timeout that calls for a bound (0.01)",
    )
    p.add_argument(
        "--prefix-min-ids",
        type=int,
        default=5,
        help="client ids a family of generated ids needs for a client_id_prefixes quota (5)",
    )
    p.add_argument(
        "--prefix-churn",
        type=float,
        default=0.5,
        help="a family churns when its ids' median lifetime is at most this share of the capture (0.5)",
    )
    p.add_argument(
        "--join-loop-min",
        type=int,
        default=10,
        help="new-member joins of one entity a join loop has at least, for join_group_rate (10)",
    )
    p.add_argument(
        "--join-loop-interval-s",
        type=float,
        default=60.0,
        help="a join loop's median interval between new-member joins is at most this (60)",
    )
    p.add_argument(
        "--join-every-s",
        type=float,
        default=120.0,
        help="join_group_rate proposed for a join loop: one new-member join per this many seconds (120)",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tune", description="Propose kthrottle quotas from capture files (a PySpark job)."
    )
    p.add_argument("--input", required=True, help="capture files: directory, glob, file or Hadoop URI")
    p.add_argument("--output", required=True, help="report directory (local; replaced if a previous report)")
    p.add_argument(
        "--master", default=None, help="Spark master (default local[*]; spark-submit's own if under it)"
    )
    p.add_argument(
        "--top-k", type=int, default=5, help="overrides per entity level and for topics (default 5)"
    )
    p.add_argument("--headroom", type=float, default=1.5, help="quota = observed p99 x this (default 1.5)")
    p.add_argument("--coverage", type=float, default=0.95, help="share of entities the default covers (0.95)")
    p.add_argument(
        "--default-level",
        choices=DEFAULT_LEVELS,
        default="user-client",
        help="level of the <default> byte-rate quotas (default user-client: one bucket per pair)",
    )
    p.add_argument(
        "--max-override-factor",
        type=float,
        default=10.0,
        help="an outlier's override is at most this x the default (default 10)",
    )
    p.add_argument(
        "--burst-factor", type=float, default=2.0, help="a burst is a run of seconds above this x median"
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=10,
        help="write no value resting on fewer mutation requests or new producer ids (default 10)",
    )
    p.add_argument(
        "--min-windows",
        type=float,
        default=3.0,
        help="write no byte-rate value resting on fewer seconds than this many 11 s quota windows (3)",
    )
    _control_args(p)
    p.add_argument(
        "--skip-replay", action="store_true", help="do not replay the traffic through the proposal"
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines (warnings and errors only)")
    return p.parse_args(argv)


def _check_output(output: Path) -> None:
    if output.exists():
        if not output.is_dir():
            raise InputError(f"--output {output} exists and is not a directory")
        if any(output.iterdir()) and not (output / MARKER).exists():
            raise InputError(
                f"--output {output} exists and is not a previous tune report; not overwriting it"
            )


def write_table(directory: Path, name: str, df: pd.DataFrame) -> None:
    """tables/<name>/<name>.parquet and .csv (tables are small: pandas writes them on the driver)."""
    target = directory / "tables" / name
    target.mkdir(parents=True, exist_ok=True)
    df.to_parquet(target / f"{name}.parquet", index=False)
    df.to_csv(target / f"{name}.csv", index=False)


def _replace(tmp: Path, output: Path) -> None:
    """Move the finished report into place; a previous report there is dropped after the move."""
    old = output.with_name(f".{output.name}.old-{os.getpid()}")
    if output.exists():
        output.rename(old)
    tmp.rename(output)
    shutil.rmtree(old, ignore_errors=True)


def failure_line(exc: BaseException) -> str:
    """What went wrong, in one line: the exception and its message, not just its type.

    A Spark Python worker's failure reaches the driver as a PythonException (or a Java exception)
    whose first line is only "An exception was thrown from the Python worker"; the worker's own
    exception is the first unindented line after the last Python traceback in its text.
    """
    lines = str(exc).strip().splitlines()
    marker = "Traceback (most recent call"
    starts = [i for i, line in enumerate(lines) if marker in line]
    if starts:
        # The traceback may follow a prefix ("...PythonException: Traceback ..." in a Java error).
        first = lines[starts[-1]]
        indent = len(first) - len(first.lstrip())
        for line in lines[starts[-1] + 1 :]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                return f"{line.strip()[:400]} (in a Spark Python worker)"
    first = next((line.strip() for line in lines if line.strip()), "")
    return f"{type(exc).__name__}: {first[:400]}" if first else type(exc).__name__


def _options(args: argparse.Namespace) -> tuple[StatsOptions, ProposeOptions]:
    """The statistics' and the proposal's options from the command line; bad values are refused."""
    stats_opts = StatsOptions(burst_factor=args.burst_factor, keep_seconds=not args.skip_replay)
    try:
        propose_opts = ProposeOptions(
            args.coverage,
            args.headroom,
            args.top_k,
            args.default_level,
            max_override_factor=args.max_override_factor,
            min_requests=args.min_requests,
            min_windows=args.min_windows,
            request_timeout_ms=args.request_timeout_ms,
            poll_interval_ms=args.poll_interval_ms,
            bound_share=args.bound_share,
            prefix_min_ids=args.prefix_min_ids,
            prefix_churn=args.prefix_churn,
            join_loop_min=args.join_loop_min,
            join_loop_interval_s=args.join_loop_interval_s,
            join_every_s=args.join_every_s,
        )
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    return stats_opts, propose_opts


def _open_input(args: argparse.Namespace, progress: Progress) -> tuple[CaptureInput, SparkSession]:
    """The input checked (local files before Spark starts, so a refusal is quick) and the session."""
    source = None
    if not is_remote(args.input):
        with progress.stage("checking input"):
            source = check_local(args.input)
            progress(f"{source.files} files, {source.rows:,} records, {(source.bytes or 0) / 1e6:,.1f} MB")
    with progress.stage("starting Spark"):
        spark = build_session(args.master)
    if source is None:
        with progress.stage("checking input"):
            source = check_remote(spark, args.input)
            progress(f"{source.files} files")
    for note in source.notes:
        progress.warn(note)
    return source, spark


def _replay_step(
    spark: SparkSession, captures: DataFrame, proposal: Proposal, stats: Stats, progress: Progress
) -> pd.DataFrame | None:
    """The proposal replayed over the captures, or None when skipped or not installed."""
    try:
        from analytics.replay import replay
    except ImportError as exc:
        progress.warn(f"replay skipped: analytics.replay is not available ({exc})")
        return None
    with progress.stage("replay"):
        return replay(spark, captures, proposal.config, seconds=stats.seconds)


def _meta(
    args: argparse.Namespace,
    source: CaptureInput,
    stats: Stats,
    stats_opts: StatsOptions,
    tables: Mapping[str, pd.DataFrame],
    spark: SparkSession,
    progress: Progress,
) -> dict[str, Any]:
    """What the report and meta.json say about the run (module docstring)."""
    return {
        "input": args.input,
        "files": source.files,
        "records": stats.records,
        "start_ms": stats.start_s * 1000,
        "end_ms": (stats.end_s + 1) * 1000,
        "span_s": stats.span_s,
        "options": {
            "coverage": args.coverage,
            "headroom": args.headroom,
            "top_k": args.top_k,
            "default_level": args.default_level,
            "burst_factor": args.burst_factor,
            "min_requests": args.min_requests,
            "min_windows": args.min_windows,
            "request_timeout_ms": args.request_timeout_ms,
            "poll_interval_ms": args.poll_interval_ms,
            "bound_share": args.bound_share,
            "prefix_min_ids": args.prefix_min_ids,
            "prefix_churn": args.prefix_churn,
            "join_loop_min": args.join_loop_min,
            "join_loop_interval_s": args.join_loop_interval_s,
            "join_every_s": args.join_every_s,
            "controller_window_s": stats_opts.controller_window_s,
            "sustained_window_s": stats_opts.sustained_window_s,
        },
        "stages": progress.stages,
        "replay": tables["replay"].attrs.get("replay", {}) if "replay" in tables else None,
        "spark_version": spark.version,
        "master": spark.sparkContext.master,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "notes": source.notes,
    }


def _write_output(
    output: Path,
    tables: dict[str, pd.DataFrame],
    proposal_yaml: str,
    meta: dict[str, Any],
    progress: Progress,
) -> None:
    """Everything written into a hidden sibling first, then renamed into place."""
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with progress.stage("writing"):
            tmp.mkdir(parents=True)
            (tmp / MARKER).write_text("written by kthrottle tune (analytics/tune.py)\n")
            (tmp / QUOTAS_FILE).write_text(proposal_yaml)
            for name, df in tables.items():
                write_table(tmp, name, df)
            try:
                from analytics.report import write_report
            except ImportError as exc:
                progress.warn(f"report skipped: analytics.report is not available ({exc})")
            else:
                write_report(str(tmp / REPORT_FILE), tables, proposal_yaml, meta)
        (tmp / "meta.json").write_text(
            json.dumps(meta, indent=2, default=str) + "\n"
        )  # with the writing time
        _replace(tmp, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, progress: Progress) -> Path:
    """The job, step by step; returns the output directory. Raises InputError for input it refuses."""
    output = Path(args.output).resolve()
    _check_output(output)
    stats_opts, propose_opts = _options(args)
    source, spark = _open_input(args, progress)
    captures = read_captures(spark, source)
    with progress.stage("statistics"):
        stats = compute(spark, captures, stats_opts, progress)
    if stats.records == 0:
        raise InputError(f"input {args.input}: no records")
    with progress.stage("proposal"):
        proposal = propose(stats, propose_opts, source=args.input)
    tables: dict[str, pd.DataFrame] = dict(stats.tables)
    tables["proposal"] = proposal.table
    if args.skip_replay:
        progress("replay skipped (--skip-replay)")
    else:
        replayed = _replay_step(spark, captures, proposal, stats, progress)
        if replayed is not None:
            tables["replay"] = replayed
    meta = _meta(args, source, stats, stats_opts, tables, spark, progress)
    _write_output(output, tables, proposal.yaml, meta, progress)
    return output


def main(argv: list[str] | None = None) -> int:
    """Run the job; 0 on success, 2 on refused input or options, 1 on any other failure."""
    args = parse_args(argv)
    progress = Progress(args.quiet)
    from pyspark.sql import SparkSession

    had_session = SparkSession.getActiveSession() is not None
    try:
        output = run(args, progress)
    except InputError as exc:
        print(f"tune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tune: interrupted; nothing written", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"tune: failed: {failure_line(exc)}; nothing written", file=sys.stderr)
        return 1
    finally:
        if not had_session:
            active = SparkSession.getActiveSession()
            if active is not None:
                active.stop()
    progress(f"wrote {output} ({output / QUOTAS_FILE}) in {time.monotonic() - progress.t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
