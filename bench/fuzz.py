"""Fuzzing figures: each target run under atheris for a fixed time from the committed corpus.

Targets run one after the other (one process at a time), each for ``--seconds`` from
fuzz/corpus/<target>/, new inputs kept in a scratch directory. libFuzzer's last status line
gives the inputs tried, the coverage reached (``cov``: edges, ``ft``: features) and the corpus
it grew to. Prints one line per target, then one JSON line:

  inputs_tried            {target: n} and inputs_tried_total
  crashes_found           crashing inputs this run (each left in --artifacts)
  crashes_fixed           inputs in fuzz/crashes/ (found earlier, fixed, replayed by the unit tests)
  cov, ft                 {target: n} edges and features libFuzzer reports
  corpus_seeds            {target: n} committed seeds; corpus_after: {target: n} after the run

Usage: source dev/setup.sh && python bench/fuzz.py [--seconds 200] [--targets requests pipeline]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGETS = ("requests", "responses", "pipeline")
_STATUS = re.compile(r"#(\d+)\s+(?:DONE|pulse|NEW|REDUCE|INITED)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


def run_target(target: str, seconds: int, scratch: Path, artifacts: Path) -> dict[str, int]:
    """One bounded atheris run; the figures from libFuzzer's last status line."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "fuzz" / "run.py"),
            "--target",
            target,
            "--max-total-time",
            str(seconds),
            "--new-corpus",
            str(scratch / target),
            "--artifacts",
            str(artifacts),
            "--",
            "-print_final_stats=1",
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        cwd=REPO,
    )
    last = _STATUS.findall(proc.stderr)
    inputs, cov, ft, corp = (int(x) for x in last[-1]) if last else (0, 0, 0, 0)
    done = re.search(r"stat::number_of_executed_units:\s+(\d+)", proc.stderr)
    if done:
        inputs = int(done.group(1))
    crashes = len([p for p in artifacts.glob(f"{target}-*")])
    return {
        "inputs": inputs,
        "cov": cov,
        "ft": ft,
        "corpus": corp,
        "crashes": crashes,
        "exit": proc.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=200, help="per target")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--artifacts", type=Path, help="where crashing inputs go (a new directory)")
    args = parser.parse_args()
    args.artifacts = args.artifacts or REPO / "fuzz-artifacts" / time.strftime("bench-%Y%m%d-%H%M%S")
    args.artifacts.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="kthrottle-fuzz-bench-") as tmp:
        for target in args.targets:
            started = time.monotonic()
            results[target] = run_target(target, args.seconds, Path(tmp), args.artifacts)
            r = results[target]
            print(
                f"{target}: {r['inputs']} inputs in {time.monotonic() - started:.0f}s, cov {r['cov']}, "
                f"ft {r['ft']}, corpus {r['corpus']}, crashes {r['crashes']} (exit {r['exit']})",
                flush=True,
            )
    crashes_dir = REPO / "fuzz" / "crashes"
    figures = {
        "inputs_tried": {t: r["inputs"] for t, r in results.items()},
        "inputs_tried_total": sum(r["inputs"] for r in results.values()),
        "crashes_found": sum(r["crashes"] for r in results.values()),
        "crashes_fixed": len(list(crashes_dir.iterdir())) if crashes_dir.exists() else 0,
        "crashes_fixed_inputs": sorted(p.name for p in crashes_dir.iterdir()) if crashes_dir.exists() else [],
        "cov": {t: r["cov"] for t, r in results.items()},
        "ft": {t: r["ft"] for t, r in results.items()},
        "corpus_seeds": {t: len(list((REPO / "fuzz" / "corpus" / t).iterdir())) for t in results},
        "corpus_after": {t: r["corpus"] for t, r in results.items()},
        "seconds_per_target": args.seconds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
