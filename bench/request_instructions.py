"""User-space instructions kthrottle executes per small request, counted by valgrind's callgrind.

`bench/request_cost.py` reads CPU time, which moves by a fifth from one window to the next on
the 2-core machine: a change worth 3% needs five side-by-side rounds to show. An instruction
count does not move with the machine: the same build gives the same count to within a few
percent (two runs: 41,630 and 41,569), so one run side by side with ``--baseline`` tells whether
a change to the per-request path helps, and by how much, and where the instructions go.

The same traffic as request_cost.py's produce workload (real Produce v13 requests of about
9 KiB and their responses, one in flight) goes through `kthrottle run` in sidecar mode, no
quotas, started under callgrind with instrumentation off; after a warm-up it is switched on for
the counted requests only. Counts user-space instructions (the kernel's share, half the CPU of
a small request, is the relays' too and is not counted). Needs valgrind (Debian's `valgrind`).

  kthrottle_instructions_per_request   instructions a request/response pair, this checkout
  baseline_instructions_per_request    the same from another checkout (``--baseline DIR``)
  kthrottle_to_baseline_instructions   the ratio of the two
  top_inclusive                        this checkout's compiled functions by inclusive count a
                                       request (what a change there could give back at most)

With ``--in-flight 5`` the client sends five requests in one write and reads their five answers
before the next five, as a pipelining client (max.in.flight.requests.per.connection=5) does under
load: the proxy then splits several frames out of one read and writes them out together.

Usage: source dev/setup.sh && python bench/request_instructions.py [--requests 2000] [--in-flight 5]
       [--baseline ../old]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import request_cost

WARMUP_REQUESTS = 200
# glibc copies and fills large buffers with `rep movsb` / `rep stosb`, which valgrind counts as
# one instruction a byte: a 9 KiB copy would count as 9,000 where it takes the time of a few
# hundred. Above these thresholds it would; below them it uses vector loops, counted fairly.
_NO_REP_STRINGS = "glibc.cpu.x86_rep_movsb_threshold=1073741824:glibc.cpu.x86_rep_stosb_threshold=1073741824"
_COUNT = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S.*)$")


def counted(source: Path | None, requests: int, work: Path, in_flight: int = 1) -> Path:
    """Run a sidecar from ``source`` under callgrind through ``requests`` round trips; its profile."""
    frames = request_cost.produce_frames()
    responder = request_cost.Responder(frames[1])
    out = work / f"callgrind.{len(list(work.iterdir()))}"
    wrapper = work / "python-under-callgrind"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"GLIBC_TUNABLES={_NO_REP_STRINGS} exec valgrind --tool=callgrind --instr-atstart=no "
        f'--callgrind-out-file={out}.%p {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    proxy, port = request_cost.sidecar(responder.address, source, str(wrapper))
    proxy.start(timeout=300)  # an interpreter starting under valgrind takes seconds
    try:
        assert proxy.proc is not None
        pid = str(proxy.proc.pid)
        request_cost.drive(("127.0.0.1", port), frames, WARMUP_REQUESTS, 0, in_flight)
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
        request_cost.drive(("127.0.0.1", port), frames, requests, 0, in_flight)
        subprocess.run(["callgrind_control", "--instr=off", pid], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
    finally:
        proxy.stop(timeout=60)
    dumps = sorted(work.glob(f"{out.name}.*.*"), key=lambda p: p.stat().st_mtime)
    if not dumps:
        raise SystemExit(f"callgrind wrote no profile for the proxy (looked for {out}.*)")
    return dumps[-1]


def annotate(profile: Path, inclusive: bool) -> list[tuple[int, str]]:
    """(instructions, function) of a profile, most first."""
    args = ["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}", str(profile)]
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    rows = []
    for line in text.splitlines():
        match = _COUNT.match(line)
        if match:
            rows.append((int(match.group(1).replace(",", "")), match.group(2)))
    return rows


def total(profile: Path) -> int:
    return next(n for n, what in annotate(profile, False) if what.startswith("PROGRAM TOTALS"))


def compiled_functions(profile: Path, requests: int, limit: int = 15) -> dict[str, int]:
    """kthrottle's compiled functions (mypyc's ``CPyDef_``) by inclusive instructions a request."""
    found: dict[str, int] = {}
    for count, what in annotate(profile, True):
        name = re.search(r"CPyDef_(\w+)", what)
        if name and name.group(1) not in found:
            found[name.group(1)] = round(count / requests)
        if len(found) == limit:
            break
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--baseline", type=Path, help="another checkout's source tree (built)")
    parser.add_argument(
        "--in-flight", type=int, default=1, help="requests sent in one write, answered before the next"
    )
    args = parser.parse_args()
    missing = [
        tool for tool in ("valgrind", "callgrind_control", "callgrind_annotate") if not shutil.which(tool)
    ]
    if missing:
        raise SystemExit(f"request_instructions: {', '.join(missing)} not found (Debian's valgrind package)")
    with tempfile.TemporaryDirectory(prefix="kthrottle-callgrind-") as scratch:
        work = Path(scratch)
        ours = counted(None, args.requests, work, args.in_flight)
        per_request = round(total(ours) / args.requests)
        figures: dict[str, object] = {"kthrottle_instructions_per_request": per_request}
        print(f"kthrottle: {per_request:,} instructions a request", flush=True)
        if args.baseline:
            theirs = counted(args.baseline.resolve(), args.requests, work, args.in_flight)
            base = round(total(theirs) / args.requests)
            figures["baseline_instructions_per_request"] = base
            figures["kthrottle_to_baseline_instructions"] = round(per_request / base, 3)
            print(f"baseline: {base:,} instructions a request", flush=True)
        figures["top_inclusive"] = compiled_functions(ours, args.requests)
    figures["requests"] = args.requests
    figures["in_flight"] = args.in_flight
    figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
