"""The report's section on the proxy's operator controls: what the capture showed for each.

A bound on throttles (``max_throttle_ms``), shared buckets for families of generated client ids
(``client_id_prefixes``) and a rate of new-member group joins (``join_group_rate``) are not
Kafka's; the reader sees, beside the proposal's sentence for each, the numbers it came from: the
decided throttles per direction (``throttle_times``), the client-id families found
(``client_families``) and the entities that joined consumer groups most (``group_joins``). The
rules are in analytics/propose_controls.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from analytics.report_html import html_note, html_table
from analytics.report_text import (
    TOP_ENTITIES,
    as_text,
    fmt_ms,
    fmt_num,
    fmt_rate,
    fmt_seconds,
    fmt_time,
    quota_value,
)
from analytics.stats_controls import step_percentile
from quota.keys import JOIN_GROUP_RATE

_TABLE_ROWS = TOP_ENTITIES


def _sentences(tables: Mapping[str, Any], kind: str, key: str | None = None) -> str:
    """The proposal's rows of one kind (and key), each as a sentence: what was proposed, or why
    not."""
    proposal = tables.get("proposal")
    if not isinstance(proposal, pd.DataFrame) or "kind" not in proposal.columns:
        return ""
    rows = proposal[proposal["kind"] == kind]
    if key is not None:
        rows = rows[rows["key"] == key]
    out = []
    for r in rows.to_dict("records"):
        user, client = as_text(r.get("user")), as_text(r.get("client_id"))
        who = f"{user}/{client} " if user and client else (f"{client} " if client else "")
        value = quota_value(r.get("key"), r.get("value"))
        head = f"{who}{as_text(r.get('key'))}" + (f" {value}" if value else "")
        done = "written" if r.get("written") else "not written"
        out.append(html_note(f"{head}, {done}: {as_text(r.get('note'))}."))
    return "".join(out)


def _throttle_rows(times: pd.DataFrame) -> pd.DataFrame:
    """Per direction: throttled requests and their decided throttle at p50, p90, p99 and longest."""
    rows = []
    for direction, d in times.sort_values("throttle_ms").groupby("direction"):
        steps, counts = d["throttle_ms"], d["requests"]
        rows.append(
            {
                "direction": direction,
                "requests": int(counts.sum()),
                **{f"p{p}": step_percentile(steps, counts, p / 100) for p in (50, 90, 99)},
                "longest": int(steps.max()),
            }
        )
    return pd.DataFrame(rows)


def _throttles(tables: Mapping[str, Any]) -> str:
    times = tables.get("throttle_times")
    parts = ["<h3>Longest throttle (max_throttle_ms)</h3>", _sentences(tables, "bound")]
    if not isinstance(times, pd.DataFrame) or times.empty:
        return "".join([*parts, html_note("No throttle was decided on a Produce or Fetch request.")])
    columns = [("direction", "direction", as_text), ("throttled requests", "requests", fmt_num)]
    columns += [(name, name, fmt_ms) for name in ("p50", "p90", "p99", "longest")]
    parts.append(html_table(_throttle_rows(times), columns, text_columns=("direction",)))
    return "".join(parts)


def _families(tables: Mapping[str, Any]) -> str:
    fams = tables.get("client_families")
    parts = ["<h3>Families of generated client ids (client_id_prefixes)</h3>", _sentences(tables, "prefix")]
    if not isinstance(fams, pd.DataFrame) or fams.empty:
        return "".join([*parts, html_note("No client ids told apart only by a generated suffix.")])
    top = fams.sort_values(["client_ids", "p99_bps"], ascending=False).head(_TABLE_ROWS)
    columns = [
        ("prefix", "prefix", as_text),
        ("direction", "direction", as_text),
        ("client ids", "client_ids", fmt_num),
        ("at most at once", "peak_ids", fmt_num),
        ("median lifetime", "median_life_s", fmt_seconds),
        ("p99 of the family", "p99_bps", fmt_rate),
        ("max", "max_bps", fmt_rate),
    ]
    parts.append(html_table(top, columns, text_columns=("prefix", "direction")))
    return "".join(parts)


def _joins(tables: Mapping[str, Any]) -> str:
    joins = tables.get("group_joins")
    parts = ["<h3>Join loops (join_group_rate)</h3>", _sentences(tables, "override", JOIN_GROUP_RATE)]
    if isinstance(joins, pd.DataFrame) and not joins.empty:
        joins = joins[joins["level"] == "user-client"]
    if not isinstance(joins, pd.DataFrame) or joins.empty:
        return "".join([*parts, html_note("No consumer joined a group (no JoinGroup request).")])
    top = joins.sort_values(["joins", "peak_per_min"], ascending=False).head(_TABLE_ROWS)
    columns = [
        ("user", "user", as_text),
        ("client id", "client_id", as_text),
        ("new-member joins", "joins", fmt_num),
        ("JoinGroup requests", "join_requests", fmt_num),
        ("first", "first_ms", fmt_time),
        ("over", "span_s", fmt_seconds),
        ("most in a minute", "peak_per_min", fmt_num),
        ("median interval", "median_interval_s", fmt_seconds),
    ]
    parts.append(html_table(top, columns, text_columns=("user", "client id", "first")))
    return "".join(parts)


def controls(tables: Mapping[str, Any]) -> str:
    """The section: the bound, the client-id families, then the join loops."""
    intro = html_note(
        "Controls Kafka does not have: a bound on every throttle, so none outlasts the clients'"
        " request timeout (what it leaves unpaid is carried over), one bucket shared by a"
        " family of client ids generated per process, which per-id quotas would give a full"
        " bucket each, and a rate of new-member joins for a consumer caught in a join loop"
        " (crash-looping: a new connection and a JoinGroup on every start, each rebalancing its"
        " group). A new-member join is a connection that sent a JoinGroup."
    )
    return intro + _throttles(tables) + _families(tables) + _joins(tables)
