"""`kthrottle quotas describe|alter`: client quotas of a running proxy, through its admin HTTP.

Exit codes: 0 done; 1 the proxy refused (an HTTP error, or an error for some entry); 2 usage or
config error (bad arguments, unreadable token file); 3 the proxy is unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from quota.keys import DEFAULT

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DEFAULT_ADMIN_URL = "http://127.0.0.1:9644"
_LABELS = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}


class UsageError(ValueError):
    """Arguments the command cannot use (exit 2)."""


def add_parser(sub: Any) -> None:
    """Add ``quotas describe`` and ``quotas alter`` to the top-level subparsers."""
    quotas = sub.add_parser(
        "quotas",
        help="describe or alter client quotas of a running proxy (its admin HTTP)",
        description="Client quotas of a running proxy, through its admin HTTP. Exit codes: 0 ok, "
        "1 the proxy refused or an entry failed, 2 usage or config error, 3 proxy unreachable.",
    )
    actions = quotas.add_subparsers(dest="quotas_command", required=True)
    describe = actions.add_parser(
        "describe",
        help="show the effective quotas (config file + alterations) matching a filter",
        description="Kafka's DescribeClientQuotas filter: a name matches exactly, <default> the "
        "default entity, * any name; entity types not given match anything unless --strict. "
        "Needs the admin token unless the proxy allows unauthenticated reads.",
    )
    alter = actions.add_parser(
        "alter",
        help="set or remove quota keys of one entity",
        description="Kafka's AlterClientQuotas for one entity (user, client id, both, or ip; "
        "<default> for the default entity). Needs the admin token.",
    )
    for p in (describe, alter):
        p.add_argument("--user", help="user principal name (<default>: the default user)")
        p.add_argument("--client-id", help="client id (<default>: the default client id)")
        p.add_argument("--ip", help="client IP address (<default>: the default IP)")
        p.add_argument(
            "--admin-url", default=DEFAULT_ADMIN_URL, help=f"the proxy's admin HTTP ({DEFAULT_ADMIN_URL})"
        )
        p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the proxy (30)")
        p.add_argument("--json", action="store_true", help="print the proxy's JSON answer")
        p.add_argument("--token-file", type=Path, help="file holding the admin token (admin.token_file)")
    describe.add_argument("--strict", action="store_true", help="only entities with exactly these types")
    alter.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="set quota keys, e.g. producer_byte_rate=1048576 (repeatable)",
    )
    alter.add_argument(
        "--delete", action="append", default=[], metavar="KEY[,KEY]", help="remove quota keys (repeatable)"
    )
    alter.add_argument("--validate-only", action="store_true", help="validate, change nothing")


def _entity(args: argparse.Namespace) -> dict[str, str | None]:
    entity: dict[str, str | None] = {}
    for key, value in (("user", args.user), ("client-id", args.client_id), ("ip", args.ip)):
        if value is not None:
            entity[key] = None if value == DEFAULT else value
    return entity


def _ops(args: argparse.Namespace) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in ",".join(args.add).split(","):
        if not item.strip():
            continue
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--add {item!r}: give KEY=VALUE")
        try:
            value = float(raw)
        except ValueError as exc:
            raise UsageError(f"--add {item!r}: {raw!r} is not a number") from exc
        out.append({"key": key.strip(), "value": value, "remove": False})
    for item in ",".join(args.delete).split(","):
        if item.strip():
            out.append({"key": item.strip(), "remove": True})
    if not out:
        raise UsageError("give --add KEY=VALUE and/or --delete KEY")
    return out


def call(
    url: str, timeout: float, body: dict[str, Any] | None = None, token: str | None = None
) -> tuple[int, Any]:
    """(HTTP status, JSON answer); raises OSError when the proxy cannot be reached."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, {"error": raw.decode(errors="replace")[:500]}


def _describe_line(entry: dict[str, Any]) -> str:
    entity = entry["entity"]
    parts = [
        f"{_LABELS.get(t, t)} '{n}'" if n is not None else f"the default {_LABELS.get(t, t)}"
        for t in ("user", "client-id", "ip")
        if t in entity
        for n in [entity[t]]
    ]
    values = ", ".join(f"{k}={v}" for k, v in sorted(entry["values"].items()))
    return f"Quota configs for {', '.join(parts)} are {values}"


def _usage_lines(args: argparse.Namespace) -> list[str]:
    """For one named client id or user (not a default, not *): what it uses now of each byte-rate
    quota, on this replica and, where quotas are shared across gateway replicas, on all of them."""
    names = {"user": args.user, "client_id": args.client_id}
    if not any(names.values()) or any(v in (DEFAULT, "*") for v in names.values()):
        return []
    query = urllib.parse.urlencode({k: v for k, v in names.items() if v is not None})
    try:
        status, state = call(f"{args.admin_url.rstrip('/')}/quotas/entity?{query}", args.timeout)
    except (OSError, urllib.error.URLError):
        return []
    if status != 200 or not isinstance(state, dict):
        return []
    lines = []
    for key in ("producer_byte_rate", "consumer_byte_rate"):
        item = state.get(key) or {}
        quota, cluster = item.get("quota"), item.get("cluster")
        if quota is None and not item.get("rate"):
            continue
        of = f" of {quota:.0f} B/s" if quota is not None else " (no quota)"
        if cluster:
            lines.append(
                f"Usage of {key}{of}: {cluster['cluster_rate']:.0f} B/s on all gateway replicas, "
                f"{cluster['this_replica_rate']:.0f} B/s on this one"
            )
        else:
            lines.append(f"Usage of {key}{of}: {item.get('rate', 0.0):.0f} B/s")
    return lines


def read_token(path: Path | None) -> str | None:
    """The admin token from ``--token-file`` (None without one); UsageError when unreadable."""
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise UsageError(f"cannot read --token-file {path}: {exc.strerror}") from exc


def run(args: argparse.Namespace) -> int:
    base = args.admin_url.rstrip("/") + "/quotas/client-quotas"
    try:
        token = read_token(args.token_file)
    except UsageError as exc:
        print(f"kthrottle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.quotas_command == "describe":
            query = {k: DEFAULT if v is None else v for k, v in _entity(args).items()}
            if args.strict:
                query["strict"] = "true"
            url = base + (f"?{urllib.parse.urlencode(query)}" if query else "")
            status, answer = call(url, args.timeout, token=token)
        else:
            entity = _entity(args)
            if not entity:
                raise UsageError("give the entity: --user, --client-id (both for a pair) or --ip")
            body = {"entries": [{"entity": entity, "ops": _ops(args)}], "validate_only": args.validate_only}
            status, answer = call(base, args.timeout, body, token)
    except UsageError as exc:
        print(f"kthrottle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, urllib.error.URLError) as exc:
        print(f"kthrottle: proxy admin at {args.admin_url} unreachable: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    if status != 200:
        message = answer.get("error") if isinstance(answer, dict) else answer
        print(f"kthrottle: the proxy refused (HTTP {status}): {message}", file=sys.stderr)
        return EXIT_REFUSED
    if args.quotas_command == "describe":
        if not args.json:
            for entry in answer.get("entries", []):
                print(_describe_line(entry))
            for line in _usage_lines(args):
                print(line)
        return EXIT_OK
    code = EXIT_OK
    for entry in answer.get("entries", []):
        if entry.get("error_code") != "NONE":
            print(
                f"kthrottle: {entry['entity']}: {entry['error_code']}: {entry.get('error')}", file=sys.stderr
            )
            code = EXIT_REFUSED
        elif not args.json:
            done = "validated" if answer.get("validate_only") else "altered"
            print(f"{done} client quotas of {entry['entity']}")
    return code
