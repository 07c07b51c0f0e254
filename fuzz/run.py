"""Run one fuzz target under atheris (libFuzzer), with protocol/, proxy/ and quota/ instrumented.

    python fuzz/run.py --target requests --runs 100000            # from the committed corpus
    python fuzz/run.py --target pipeline --max-total-time 600 -- -jobs=1
    python fuzz/run.py --target responses --replay CRASH_FILE     # re-run one input, traceback

New interesting inputs go to a scratch directory (``--new-corpus``, a temporary one by default),
so the committed seed corpus under fuzz/corpus/<target>/ only changes when you copy them in.
Crashing inputs are written to ``--artifacts`` (default ./fuzz-artifacts/) as libFuzzer does.
Extra arguments after ``--`` go to libFuzzer as they are.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "fuzz" / "corpus"
TARGETS = ("requests", "responses", "pipeline")

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def load_target(name: str, instrument: bool) -> Callable[[bytes], None]:
    """Import the target; under atheris, the project's packages are instrumented as they load."""
    if instrument:
        import atheris

        with atheris.instrument_imports(include=["protocol", "proxy", "quota", "fuzz"]):
            return _import(name)
    return _import(name)


def _import(name: str) -> Callable[[bytes], None]:
    if name == "requests":
        from fuzz.targets import request_target

        return request_target
    if name == "responses":
        from fuzz.targets import response_target

        return response_target
    if name == "pipeline":
        from fuzz.pipeline_target import pipeline_target

        return pipeline_target
    raise SystemExit(f"unknown target {name!r} (one of {', '.join(TARGETS)})")


RSS_HEADROOM_MB = 2048  # libFuzzer's default limit, on top of what the process started with


def inherited_peak_rss_mb() -> int:
    """The peak RSS this process already reports: Linux carries a parent's peak across fork and
    exec, so a fuzz run started from a large process (pytest late in a long suite) would be
    "out of memory" before its first input under libFuzzer's absolute default of 2048 MB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", required=True, choices=TARGETS)
    parser.add_argument("--runs", type=int, help="stop after this many inputs (libFuzzer -runs)")
    parser.add_argument("--max-total-time", type=int, help="stop after this many seconds")
    parser.add_argument("--max-len", type=int, default=64 * 1024, help="largest input libFuzzer makes")
    parser.add_argument("--seed", type=int, help="libFuzzer -seed, for a repeatable run")
    parser.add_argument("--new-corpus", type=Path, help="where new interesting inputs go")
    parser.add_argument("--artifacts", type=Path, default=Path("fuzz-artifacts"))
    parser.add_argument("--replay", type=Path, nargs="+", help="run these inputs once, uninstrumented")
    args = parser.parse_args(argv)

    if args.replay:
        target = load_target(args.target, instrument=False)
        for path in args.replay:
            print(f"replaying {path}", flush=True)
            target(path.read_bytes())
        return 0

    import atheris

    # Every rejected input logs a line: the pipeline target reads them; nobody else needs them.
    logging.getLogger("proxy").propagate = False
    target = load_target(args.target, instrument=True)
    new_corpus = args.new_corpus or Path(tempfile.mkdtemp(prefix=f"kthrottle-fuzz-{args.target}-"))
    new_corpus.mkdir(parents=True, exist_ok=True)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    flags = [sys.argv[0], f"-max_len={args.max_len}", f"-artifact_prefix={args.artifacts}/{args.target}-"]
    if args.runs is not None:
        flags.append(f"-runs={args.runs}")
    if args.max_total_time is not None:
        flags.append(f"-max_total_time={args.max_total_time}")
    if args.seed is not None:
        flags.append(f"-seed={args.seed}")
    if not any(flag.startswith("-rss_limit_mb=") for flag in extra):
        flags.append(f"-rss_limit_mb={inherited_peak_rss_mb() + RSS_HEADROOM_MB}")
    flags += extra
    flags += [str(new_corpus), str(CORPUS / args.target)]
    atheris.Setup(flags, target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
