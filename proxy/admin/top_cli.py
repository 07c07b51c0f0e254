"""`kthrottle top`: the live connections of a running proxy, busiest first, refreshed in place.

It reads GET /connections twice an interval apart and shows the rates between the two readings
(a connection's own counters: requests, bytes from the client and to it), with what holds it
back now (the throttle left, the reasons it is not read). ``--json`` prints one such reading for
scripts and exits. Exit codes as `kthrottle quotas`: 0 done; 1 the proxy refused; 2 usage; 3 the
proxy is unreachable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from proxy.admin.connections import SORT_KEYS
from proxy.admin.quota_cli import (
    DEFAULT_ADMIN_URL,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    call,
    read_token,
)

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: the next table draws over the last
COLUMNS = (
    ("ID", 6),
    ("PRINCIPAL", 16),
    ("CLIENT ID", 22),
    ("SOURCE", 21),
    ("BROKER", 6),
    ("REQ/S", 8),
    ("IN/S", 9),
    ("OUT/S", 9),
    ("THROTTLE", 8),
    ("STATE", 14),
)
_RATE_KEY = {"bytes_in": "bytes_in_per_s", "bytes_out": "bytes_out_per_s", "requests": "requests_per_s"}


def add_parser(sub: Any) -> None:
    top = sub.add_parser(
        "top",
        help="live connections of a running proxy, busiest first (its admin HTTP)",
        description="The proxy's client connections with principal, client id, source, broker, "
        "requests/s and bytes/s each way, the throttle left and what holds each back, refreshed "
        "in place. Needs the admin token unless the proxy allows unauthenticated reads.",
    )
    top.add_argument(
        "--admin-url", default=DEFAULT_ADMIN_URL, help=f"the proxy's admin HTTP ({DEFAULT_ADMIN_URL})"
    )
    top.add_argument("--token-file", type=Path, help="file holding the admin token (admin.token_file)")
    top.add_argument("--sort", choices=SORT_KEYS, default="bytes_in", help="busiest first by (bytes_in)")
    top.add_argument("--user", help="only this principal")
    top.add_argument("--client-id", help="only this client id")
    top.add_argument("--broker", type=int, help="only connections to this broker node")
    top.add_argument("--limit", type=int, default=40, help="rows shown (40)")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between readings (2)")
    top.add_argument("--iterations", type=int, default=0, help="refreshes before exiting (0: until Ctrl-C)")
    top.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the proxy (10)")
    top.add_argument("--json", action="store_true", help="print one reading's rates as JSON and exit")


def rates(before: dict[str, Any], after: dict[str, Any], seconds: float) -> list[dict[str, Any]]:
    """The connections of the second reading, their rates over the time between the two (a
    connection new since the first: over its own age)."""
    earlier = {row["id"]: row for row in before.get("connections", [])}
    out = []
    for row in after.get("connections", []):
        prev = earlier.get(row["id"])
        span = seconds if prev is not None else max(row["age_s"], 1e-3)
        base = prev or {"requests": 0, "bytes_in": 0, "bytes_out": 0}
        out.append(
            {
                **row,
                "requests_per_s": round((row["requests"] - base["requests"]) / span, 2),
                "bytes_in_per_s": round((row["bytes_in"] - base["bytes_in"]) / span, 1),
                "bytes_out_per_s": round((row["bytes_out"] - base["bytes_out"]) / span, 1),
            }
        )
    return out


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(n) < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}G"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def render(rows: list[dict[str, Any]], sort: str, total: int, width: int = 160) -> list[str]:
    """The table, busiest first by ``sort`` (the rates between readings decide)."""
    key = _RATE_KEY.get(sort)
    if key is not None:
        rows = sorted(rows, key=lambda r: r[key], reverse=True)
    lines = [
        f"kthrottle top: {total} connections, by {sort}  ({time.strftime('%H:%M:%S')})",
        " ".join(f"{name:<{w}}" for name, w in COLUMNS)[:width],
    ]
    for r in rows:
        state = ",".join(r["paused"]) or ("exempt" if r["exempt"] else "-")
        cells = (
            str(r["id"]),
            r["principal"],
            r["client_id"] or "(none)",
            r["source"],
            "-" if r["broker"] is None else str(r["broker"]),
            f"{r['requests_per_s']:.1f}",
            _human(r["bytes_in_per_s"]),
            _human(r["bytes_out_per_s"]),
            f"{r['throttle_left_ms']}ms" if r["throttle_left_ms"] else "-",
            state,
        )
        lines.append(
            " ".join(f"{_cut(c, w):<{w}}" for c, (_n, w) in zip(cells, COLUMNS, strict=True))[:width]
        )
    return lines


def _url(args: argparse.Namespace) -> str:
    query = {"sort": args.sort, "limit": str(max(args.limit, 1) * 4)}  # rates may reorder them
    for name, value in (("user", args.user), ("client_id", args.client_id), ("broker", args.broker)):
        if value is not None:
            query[name] = str(value)
    return f"{args.admin_url.rstrip('/')}/connections?{urllib.parse.urlencode(query)}"


def run(args: argparse.Namespace) -> int:
    try:
        if args.interval <= 0 or args.limit < 1 or args.iterations < 0:
            raise UsageError("--interval must be above 0, --limit at least 1, --iterations 0 or more")
        token = read_token(args.token_file)
    except UsageError as exc:
        print(f"kthrottle top: {exc}", file=sys.stderr)
        return EXIT_USAGE
    url = _url(args)
    shown = 0
    try:
        status, before = call(url, args.timeout, token=token)
        taken = time.monotonic()
        while status == 200:
            time.sleep(args.interval)
            status, after = call(url, args.timeout, token=token)
            now = time.monotonic()
            if status != 200:
                before = after
                break
            rows = rates(before, after, now - taken)
            if args.json:
                print(
                    json.dumps(
                        {"interval_s": round(now - taken, 3), "total": after["total"], "connections": rows}
                    )
                )
                return EXIT_OK
            width = shutil.get_terminal_size((160, 40)).columns
            table = render(rows, args.sort, after["total"], width)[: args.limit + 2]
            print((CLEAR if sys.stdout.isatty() else "") + "\n".join(table), flush=True)
            shown += 1
            if args.iterations and shown >= args.iterations:
                return EXIT_OK
            before, taken = after, now
    except OSError as exc:
        print(f"kthrottle top: cannot reach {args.admin_url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_OK
    print(f"kthrottle top: the proxy answered {status}: {json.dumps(before)[:300]}", file=sys.stderr)
    return EXIT_REFUSED
