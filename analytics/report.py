"""The tuning job's report: one self-contained HTML file an operator reads before applying a proposal.

Everything is inline (CSS in a <style>, plots as base64 PNG drawn with matplotlib's Agg backend),
so the file can be mailed, attached to a ticket or opened offline. Every piece of text from the
data goes through ``html.escape``: user and client names are whatever clients sent.

What the reader can rely on:

- Every plot shows data. Each is a ``<figure class="plot" data-points="N">`` with N the points it
  draws; a plot that would have nothing to show is left out with a sentence saying why, and one
  with too few points to be a picture (one second of mutations, one user) is a table or a sentence.
- Tick labels never overlap: constrained layout, few ticks, and any label that would still touch
  its neighbour hidden after the figure is laid out (``declutter``).
- Plain words: quotas, levels and the replay's work are said as an operator would say them, with
  the config key beside the words where the reader needs it to find the value in quotas.yaml.
  Topics are shown by name; a topic captured only as its id says so.
- Each proposed value shows the evidence it rests on (requests, seconds, entities, when the
  proposal table carries them) and, when it was not written, why.

The report is made of steps of its own: ``report_text`` (plain words and numbers), ``report_html``
(the page from its templates under analytics/templates/, and tables), ``report_plots`` (the
figures); this module builds each section from the job's tables and writes the page.

The tables are taken as they come: each section looks for the columns it knows under the names the
job uses (and a few older spellings), skips with a note what is missing or empty, and a section
that fails for any other reason is replaced by a note rather than failing the report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from analytics.report_controls import controls
from analytics.report_html import Column, esc, html_note, html_page, html_pairs, html_section, html_table
from analytics.report_plots import (
    TOP_SERIES,
    bar_plot,
    declutter,
    distribution_plot,
    hourly_lines,
    label_overlaps,
    series_plot,
)
from analytics.report_text import (
    BYTE_QUOTAS,
    LEVEL_PLURAL,
    LEVEL_WORDS,
    OPTION_WORDS,
    QUOTA_WORDS,
    TOP_ENTITIES,
    applies_to,
    as_text,
    column_or,
    counted,
    entity_label,
    evidence,
    find_col,
    fmt_bytes,
    fmt_ms,
    fmt_num,
    fmt_rate,
    fmt_seconds,
    fmt_time,
    is_missing,
    quota_level_words,
    quota_value,
    quota_words,
    topic_label,
)
from quota.keys import ANONYMOUS

__all__ = [
    "applies_to",
    "declutter",
    "evidence",
    "fmt_bytes",
    "fmt_ms",
    "label_overlaps",
    "render_report",
    "topic_label",
    "write_report",
]

LEVEL_ORDER = ("user-client", "user", "client")
MIN_BARS = 2  # a bar chart of one bar is a sentence
MIN_HOURS = 3  # hours a per-hour line needs; fewer are bars per user


def _anonymous_only(df: pd.DataFrame) -> bool:
    """Whether every user in ``df`` is the unauthenticated principal: no user-level traffic."""
    if "user" not in df.columns or df.empty:
        return False
    users = {as_text(u) for u in df["user"]}
    return users <= {ANONYMOUS, ""}


def _no_users_sentence() -> str:
    return html_note(
        f"No user-level traffic: every request came from an anonymous principal ({ANONYMOUS}), so "
        "there are no users to tell apart. Clients are told apart by client id below."
    )


def usable(tables: Mapping[str, Any], *names: str) -> tuple[str, pd.DataFrame] | None:
    """The first of ``names`` present as a non-empty DataFrame."""
    for name in names:
        df = tables.get(name)
        if isinstance(df, pd.DataFrame) and not df.empty:
            return name, df
    return None


# --- summary -------------------------------------------------------------------------------------


def _summary_rows(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run at a glance: what was read, over what time, how long it took."""
    rows: list[tuple[str, str]] = []
    if meta.get("input") is not None:
        rows.append(("input", as_text(meta["input"])))
    if meta.get("files") is not None:
        rows.append(("capture files", fmt_num(meta["files"])))
    if meta.get("records") is not None:
        rows.append(("requests captured", fmt_num(meta["records"])))
    start, end = meta.get("start_ms"), meta.get("end_ms")
    if start is not None and end is not None:
        rows.append(("captured from", f"{fmt_time(start)} to {fmt_time(end)}"))
    span = meta.get("span_s")
    if span is None and start is not None and end is not None:
        span = (float(end) - float(start)) / 1000.0
    if span is not None:
        rows.append(("capture length", fmt_seconds(span)))
    run_s = _run_seconds(meta)
    if run_s is not None:
        rows.append(("job run time", fmt_seconds(run_s)))
        records = meta.get("records")
        if records and run_s > 0:
            rows.append(("job throughput", f"{fmt_num(round(float(records) / run_s))} requests/s"))
    for key, words in (
        ("master", "Spark master"),
        ("spark_version", "Spark version"),
        ("generated_at", "written"),
    ):
        if meta.get(key) is not None:
            rows.append((words, as_text(meta[key])))
    shown = {"input", "files", "records", "start_ms", "end_ms", "span_s", "stages", "run_s", "seconds"}
    shown |= {"master", "spark_version", "generated_at", "notes", "options"}
    for key, value in meta.items():
        if key not in shown and isinstance(value, (str, int, float, bool)):
            rows.append((str(key).replace("_", " "), as_text(value)))
    return rows


def _run_seconds(meta: Mapping[str, Any]) -> float | None:
    stages = meta.get("stages")
    run_s = meta.get("run_s", meta.get("seconds"))
    if run_s is None and isinstance(stages, Mapping):
        try:
            run_s = sum(float(v) for v in stages.values())
        except (TypeError, ValueError):
            return None
    try:
        return None if run_s is None else float(run_s)
    except (TypeError, ValueError):
        return None


def _summary(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    body = html_pairs(_summary_rows(meta))
    stages = meta.get("stages")
    if isinstance(stages, Mapping) and stages:
        body += "<h3>Time per stage of the job</h3>" + html_pairs(
            ((str(k), _stage_time(v)) for k, v in stages.items()), right=True
        )
    options = meta.get("options")
    if isinstance(options, Mapping) and options:
        body += "<h3>Options</h3>" + html_pairs(
            (f"{OPTION_WORDS.get(str(k), str(k).replace('_', ' '))}", as_text(v)) for k, v in options.items()
        )
    notes = meta.get("notes")
    if isinstance(notes, str):
        notes = [notes]
    for note in notes or []:
        body += html_note(str(note))
    if any(isinstance(df, pd.DataFrame) and not df.empty for df in tables.values()):
        body += html_note("Every table behind this report is beside it under tables/, as Parquet and CSV.")
    return body


def _stage_time(value: Any) -> str:
    try:
        return fmt_seconds(float(value))
    except (TypeError, ValueError):
        return as_text(value)


# --- proposal -----------------------------------------------------------------------------------


def _observed(key: Any, value: Any) -> str:
    """What was measured: a rate for byte quotas, a time for the bound, joins in a minute for a
    join rate, else the number the basis column explains."""
    if as_text(key) == "max_throttle_ms":
        return fmt_ms(value)
    if as_text(key) == "join_group_rate":  # the most new-member joins in a minute
        return f"{fmt_num(value)} joins in a minute"
    return fmt_rate(value) if as_text(key) in BYTE_QUOTAS else fmt_num(value)


def _proposal_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The proposal table with its values said in words, ready to show."""
    out = df.copy()
    records = out.to_dict("records")
    out["_what"] = [quota_words(r.get("key")) for r in records]
    out["_who"] = [applies_to(r) for r in records]
    out["_value"] = [quota_value(r.get("key"), r.get("value")) for r in records]
    out["_observed"] = [_observed(r.get("key"), r.get("observed")) for r in records]
    out["_evidence"] = [evidence(r) for r in records]
    out["_why"] = [as_text(r.get("note")) or "(no reason given)" for r in records]
    return out


def _written_mask(df: pd.DataFrame) -> pd.Series:
    if "written" not in df.columns:
        return pd.Series(True, index=df.index)
    return df["written"].map(lambda v: not is_missing(v) and bool(v))


_PROPOSAL_COLUMNS: list[Column] = [
    ("quota", "_what", as_text),
    ("for", "_who", as_text),
    ("value", "_value", as_text),
    ("observed", "_observed", as_text),
    ("how it was chosen", "basis", as_text),
    ("rests on", "_evidence", as_text),
]


def _proposal(proposal_yaml: str, tables: Mapping[str, Any]) -> str:
    body = f"<pre>{esc(proposal_yaml.strip()) or '(empty)'}</pre>"
    found = usable(tables, "proposal")
    if found is None:
        return body
    df = _proposal_rows(found[1])
    written = _written_mask(df)
    kept, left = df[written], df[~written]
    text_cols = ("quota", "for", "how it was chosen", "rests on", "note", "why not written")
    head = f"{counted(len(kept), 'proposed value')} written to quotas.yaml"
    if len(left):
        head += f"; {fmt_num(len(left))} left out, each with its reason under 'Left out of quotas.yaml' below"
    body = f'<p class="{"callout" if len(left) else ""}">{esc(head)}.</p>' + body
    if not kept.empty:
        body += "<h3>Written to quotas.yaml, and what each value rests on</h3>" + html_table(
            kept, [*_PROPOSAL_COLUMNS, ("note", "note", as_text)], text_columns=text_cols
        )
    if not left.empty:
        body += "<h3>Left out of quotas.yaml, and why</h3>" + html_table(
            left,
            [("why not written", "_why", as_text), *_PROPOSAL_COLUMNS],
            text_columns=text_cols,
            classes={"why not written": "t why"},
        )
    return body


# --- entities -----------------------------------------------------------------------------------


def _rate_columns(df: pd.DataFrame) -> list[Column]:
    return [
        ("who", "_label", as_text),
        ("active for", find_col(df, "active"), fmt_seconds),
        ("total", find_col(df, "total"), fmt_bytes),
        ("p50", find_col(df, "p50"), fmt_rate),
        ("p95", find_col(df, "p95"), fmt_rate),
        ("p99", find_col(df, "p99"), fmt_rate),
        ("max", find_col(df, "max"), fmt_rate),
        ("longest burst", find_col(df, "bursts"), fmt_seconds),
        ("throttled while captured", find_col(df, "throttled"), fmt_ms),
        ("proposed quota", find_col(df, "quota"), fmt_rate),
        ("which quota applies", find_col(df, "quota_level"), quota_level_words),
    ]


def _levels(df: pd.DataFrame) -> list[str | None]:
    if "level" not in df.columns:
        return [None]
    present = {str(lv) for lv in df["level"]}
    ordered: list[str | None] = [lv for lv in LEVEL_ORDER if lv in present]
    return ordered + sorted(present - set(LEVEL_ORDER))


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["_label"] = [
        entity_label(u, c) for u, c in zip(column_or(out, "user"), column_or(out, "client_id"), strict=True)
    ]
    return out


def _entities(tables: Mapping[str, Any]) -> str:
    found = usable(tables, "entity_rates")
    if found is None:
        return html_note("no entity rates in this run")
    df = _labelled(found[1])
    p99 = find_col(df, "p99")
    directions: list[Any] = sorted(set(df["direction"]), key=str) if "direction" in df.columns else [None]
    parts = [
        html_note(
            f"The busiest {TOP_ENTITIES} per level and direction, by the p99 of their 1-second rates; "
            "the proposed quota is the one that would apply to them."
        )
    ]
    for level in _levels(df):
        by_level = df if level is None else df[df["level"].astype(str) == level]
        if level == "user" and _anonymous_only(by_level):
            parts.append(f"<h3>{esc(LEVEL_PLURAL['user'].capitalize())}</h3>{_no_users_sentence()}")
            continue
        for direction in directions:
            sel = by_level if direction is None else by_level[by_level["direction"] == direction]
            if sel.empty:
                continue
            if p99 is not None:
                sel = sel.sort_values(p99, ascending=False, na_position="last")
            who = LEVEL_PLURAL.get(str(level), str(level)) if level is not None else "entities"
            title = f"{str(direction).capitalize() + ': ' if direction is not None else ''}{who}"
            parts.append(f"<h3>{esc(title)} ({fmt_num(len(sel))})</h3>")
            parts.append(
                html_table(
                    sel.head(TOP_ENTITIES), _rate_columns(sel), text_columns=("who", "which quota applies")
                )
            )
    return "".join(parts)


def _timeseries(tables: Mapping[str, Any]) -> str:
    parts = []
    found = usable(tables, "entity_series", "entity_timeseries")
    if found is None:
        parts.append(html_note("no per-second series of entities in this run"))
    else:
        df = found[1]
        keys = [k for k in ("user", "client_id") if k in df.columns]
        groups = list(df.groupby("direction")) if "direction" in df.columns else [("", df)]
        for direction, part in groups:
            levels = list(part.groupby("level")) if "level" in part.columns else [("", part)]
            for level, sub in levels:
                who = LEVEL_PLURAL.get(str(level), "entities")
                title = f"{str(direction).capitalize()} bytes per second, busiest {who}".strip()
                if level == "user" and _anonymous_only(sub):
                    parts.append(f"<h3>{esc(title)}</h3>{_no_users_sentence()}")
                    continue
                parts.append(series_plot(sub, keys, title))
    found = usable(tables, "topic_series")
    if found is not None:
        df = found[1]
        groups = list(df.groupby("direction")) if "direction" in df.columns else [("", df)]
        for direction, part in groups:
            if "topic" in part.columns:
                title = f"{str(direction).capitalize()} bytes per second, busiest topics"
                parts.append(series_plot(part, ["topic"], title))
    return "".join(parts)


def _distributions(tables: Mapping[str, Any]) -> str:
    found = usable(tables, "entity_rates")
    if found is None:
        return html_note("no entity rates in this run")
    df = found[1]
    parts = [
        html_note(
            "How the p99 of the 1-second rates spreads over entities, per level: the default is set so "
            "that most stay under it, the few far to the right get overrides."
        )
    ]
    for level in _levels(df):
        sel = df if level is None else df[df["level"].astype(str) == level]
        who = LEVEL_PLURAL.get(str(level), "entities") if level is not None else "entities"
        title = f"p99 per {LEVEL_WORDS.get(str(level), 'entity')}" if level is not None else "p99 per entity"
        if level == "user" and _anonymous_only(sel):
            parts.append(_no_users_sentence())
            continue
        parts.append(distribution_plot(sel, title, who))
    return "".join(parts)


# --- replay -------------------------------------------------------------------------------------


def _bucket_label(row: Mapping[str, Any], short: bool = False) -> str:
    topic = as_text(row.get("topic"))
    if topic:
        part = row.get("partition")
        name = topic_label(topic, short)
        if part is None or is_missing(part) or int(part) < 0:
            return name
        return f"{name} partition {int(part)}"
    return entity_label(row.get("user"), row.get("client_id"))


def _replay_work(info: Mapping[str, Any], buckets: int) -> str:
    """What the replay did, in words (its info dict names its internal steps)."""
    pruned, rows, secs = info.get("pruned_buckets"), info.get("replayed_rows"), info.get("seconds")
    if pruned is None or is_missing(pruned):
        return ""
    text = (
        f"Of the {fmt_num(buckets)} quota buckets, {fmt_num(pruned)} could not have gone over their "
        "quota at any moment (their per-second totals show it), so they were counted without being "
        f"replayed; {fmt_num(max(0, buckets - int(pruned)))} were replayed request by request"
    )
    if not is_missing(rows):
        text += f" ({counted(rows, 'request')})"
    if not is_missing(secs):
        text += f", in {fmt_seconds(secs)}"
    return text + "."


def _replay_rows(df: pd.DataFrame, total: str) -> pd.DataFrame:
    """The replay table with who, which quota and its value in words."""
    out = df.copy()
    records = out.to_dict("records")
    out["_label"] = [_bucket_label(r) for r in records]
    out["_short"] = [_bucket_label(r, short=True) for r in records]
    out["_quota"] = [QUOTA_WORDS.get(as_text(r.get("quota")), as_text(r.get("quota"))) for r in records]
    out["_applies"] = [quota_level_words(r.get("level")) for r in records]
    out["_value"] = [quota_value(r.get("quota"), r.get("quota_value")) for r in records]
    throttled = "throttled_requests" if "throttled_requests" in out.columns else None
    if throttled is not None:
        out["_share"] = [
            f"{100.0 * t / r:.1f}%" if r else "" for t, r in zip(out[throttled], out["requests"], strict=True)
        ]
    return out[pd.to_numeric(out[total], errors="coerce").fillna(0) > 0].sort_values(total, ascending=False)


def _replay(tables: Mapping[str, Any]) -> str:
    found = usable(tables, "replay")
    if found is None:
        return html_note("the traffic was not replayed through the proposal in this run")
    df = found[1]
    total = (
        "effective_throttle_ms_total" if "effective_throttle_ms_total" in df.columns else "throttle_ms_total"
    )
    if total not in df.columns or "requests" not in df.columns:
        return html_note("left out: the replay table lacks its columns")
    hit = _replay_rows(df, total)
    summary = f"{fmt_num(len(hit))} of {fmt_num(len(df))} quota buckets would be throttled under the proposal"
    if "throttled_requests" in df.columns:
        summary += f", {counted(df['throttled_requests'].sum(), 'request')} in all"
    parts = [f"<p>{esc(summary)}.</p>"]
    parts.append(
        html_note(
            "A quota bucket is what one quota counts against: a user, a client id, a user and client "
            "id together, or a topic partition. The captured requests were replayed through the "
            "proxy's own quota code, in the order they came. A client would have sent less once "
            "throttled, so these figures are upper bounds. 'Throttle a client would see' counts, per "
            "request, the largest throttle of all the quotas the request is under."
        )
    )
    info = df.attrs.get("replay") if hasattr(df, "attrs") else None
    work = _replay_work(info, len(df)) if isinstance(info, Mapping) else ""
    if work:
        parts.append(html_note(work))
    if hit.empty:
        parts.append(html_note("Nobody would be throttled."))
        return "".join(parts)
    top = hit.head(TOP_ENTITIES)
    if len(top) >= MIN_BARS:
        parts.append(
            bar_plot(
                [f"{lbl}: {q}" for q, lbl in zip(top["_quota"], top["_short"], strict=True)],
                [float(v) / 1000.0 for v in top[total]],
                "throttle under the proposal, most throttled first",
                "seconds of throttle over the capture",
            )
        )
    parts.append(_replay_table(top))
    return "".join(parts)


def _replay_table(top: pd.DataFrame) -> str:
    return html_table(
        top,
        [
            ("quota", "_quota", as_text),
            ("who", "_label", as_text),
            ("quota that applied", "_applies", as_text),
            ("quota value", "_value", as_text),
            ("requests", "requests", fmt_num),
            (
                "throttled requests",
                "throttled_requests" if "throttled_requests" in top.columns else None,
                fmt_num,
            ),
            ("share", "_share", as_text),
            ("throttle from this quota", "throttle_ms_total", fmt_ms),
            ("longest throttle", "max_throttle_ms", fmt_ms),
            ("throttle a client would see", "effective_throttle_ms_total", fmt_ms),
            ("mutations refused", "rejected_mutations", fmt_num),
        ],
        text_columns=("quota", "who", "quota that applied"),
    )


# --- mutations ----------------------------------------------------------------------------------


def _mutations(tables: Mapping[str, Any]) -> str:
    found = usable(tables, "mutations")
    if found is None:
        return html_note("No partition mutations (topics or partitions created or deleted) in the capture.")
    df = _labelled(found[1])
    if "level" in df.columns and (df["level"] == "user-client").any():
        df = df[df["level"] == "user-client"]  # the other levels are its sums
    order = find_col(df, "max_window") or find_col(df, "mutations")
    if order is not None:
        df = df.sort_values(order, ascending=False)
    parts = [
        html_note(
            "Partitions created or deleted by each user and client id: what the controller mutation "
            "quota counts."
        ),
        html_table(
            df.head(TOP_ENTITIES),
            [
                ("who", "_label", as_text),
                ("requests", "requests" if "requests" in df.columns else None, fmt_num),
                ("partitions", find_col(df, "mutations"), fmt_num),
                ("most in one second", find_col(df, "max_per_s"), fmt_num),
                ("most in one controller window", find_col(df, "max_window"), fmt_num),
                ("peak sustained rate /s", find_col(df, "peak_rate"), fmt_num),
                (
                    "bursts covered by the default",
                    "well_behaved" if "well_behaved" in df.columns else None,
                    fmt_num,
                ),
            ],
            text_columns=("who",),
        ),
    ]
    series = usable(tables, "mutation_series")
    if series is not None:
        s = series[1]
        col = find_col(s, "mutations")
        if col is not None:
            if "level" in s.columns and (s["level"] == "user-client").any():
                s = s[s["level"] == "user-client"]  # the other levels are its sums
            keys = [k for k in ("user", "client_id") if k in s.columns]
            title = "Partitions created or deleted per second"
            parts.append(series_plot(s, keys, title, col, "partitions per second", sparse=True))
    return "".join(parts)


# --- producer ids -------------------------------------------------------------------------------


def _producer_id_table(df: pd.DataFrame) -> str:
    def present(name: str) -> str | None:
        return name if name in df.columns else None

    return html_table(
        df.head(TOP_ENTITIES),
        [
            ("user", present("user"), as_text),
            ("new producer ids", find_col(df, "new_ids"), fmt_num),
            ("hours", present("hours"), fmt_num),
            ("most new in an hour", present("max_new_per_hour"), fmt_num),
            ("mean new per hour", present("mean_new_per_hour"), fmt_num),
            ("peak new ids/s", present("peak_ids_per_s"), fmt_num),
            ("above the proposed default", present("over_quota"), fmt_num),
        ],
        text_columns=("user",),
    )


def _producer_id_hours(h: pd.DataFrame) -> str:
    """New ids per hour per user: lines over several hours, bars per user over one or two."""
    hour, new = find_col(h, "hour"), find_col(h, "new_ids")
    if hour is None or new is None or "user" not in h.columns:
        return ""
    per_user = h.groupby("user")[new].sum().sort_values(ascending=False)
    top = list(per_user.index[:TOP_SERIES])
    if h[hour].nunique() < MIN_HOURS:
        if len(top) < MIN_BARS:
            return html_note("New producer ids: one user only, its count is in the table above.")
        return bar_plot(
            [str(u) for u in top],
            [float(per_user[u]) for u in top],
            "new producer ids, top users",
            "new producer ids over the capture",
        )
    return hourly_lines(h, hour, new, top)


def _producer_ids(tables: Mapping[str, Any]) -> str:
    found = usable(tables, "producer_ids")
    if found is None:
        return html_note("No producer ids in the capture (no idempotent or transactional producer).")
    df = found[1]
    hourly = usable(tables, "producer_ids_hourly")
    if hourly is None and find_col(df, "hour") is not None and "user" in df.columns:
        hourly = ("producer_ids", df)  # the brief's shape: (user, hour, new_ids)
        df = df.groupby("user")[find_col(df, "new_ids") or "new_ids"].sum().reset_index()
    order = find_col(df, "new_ids")
    if order is not None:
        df = df.sort_values(order, ascending=False)
    parts = [_producer_id_table(df)]
    if hourly is not None:
        parts.append(_producer_id_hours(hourly[1]))
    return "".join(parts)


# --- topics -------------------------------------------------------------------------------------


def _topic_labels(df: pd.DataFrame) -> pd.Series | None:
    if "topic" not in df.columns:
        return None
    if "partition" in df.columns:
        return pd.Series(
            [
                f"{topic_label(t)} partition {as_text(p)}"
                for t, p in zip(df["topic"], df["partition"], strict=True)
            ],
            index=df.index,
        )
    return df["topic"].map(topic_label)


def _topics(tables: Mapping[str, Any]) -> str:
    parts = []
    for name, title in (("topic_rates", "Topics"), ("partition_rates", "Partitions")):
        found = usable(tables, name)
        if found is None:
            continue
        df = found[1].copy()
        labels = _topic_labels(df)
        if labels is None:
            continue
        df["_label"] = labels
        p99 = find_col(df, "p99")
        if p99 is not None:
            df = df.sort_values(p99, ascending=False)
        parts.append(f"<h3>{esc(title)}, the busiest {TOP_ENTITIES} by p99 of their 1-second rates</h3>")
        parts.append(_topic_table(df))
    return "".join(parts) or html_note("no topic rates in this run")


def _topic_table(df: pd.DataFrame) -> str:
    return html_table(
        df.head(TOP_ENTITIES),
        [
            ("direction", "direction" if "direction" in df.columns else None, as_text),
            ("topic", "_label", as_text),
            ("total", find_col(df, "total"), fmt_bytes),
            ("p50", find_col(df, "p50"), fmt_rate),
            ("p95", find_col(df, "p95"), fmt_rate),
            ("p99", find_col(df, "p99"), fmt_rate),
            ("max", find_col(df, "max"), fmt_rate),
            ("partitions", "partitions" if "partitions" in df.columns else None, fmt_num),
            (
                "busiest partition's p99",
                "partition_p99_max_bps" if "partition_p99_max_bps" in df.columns else None,
                fmt_rate,
            ),
        ],
        text_columns=("direction", "topic"),
    )


# --- the page -----------------------------------------------------------------------------------

SECTIONS: tuple[tuple[str, str, Callable[..., str]], ...] = (
    ("entities", "Top entities by level", _entities),
    ("rates", "Rate over time", _timeseries),
    ("distributions", "Distributions", _distributions),
    ("replay", "Throttle under the proposal", _replay),
    ("topics", "Topics and partitions", _topics),
    ("mutations", "Partition mutations", _mutations),
    ("producer-ids", "Producer ids", _producer_ids),
    ("controls", "Operator controls", controls),
)


def render_report(tables: Mapping[str, Any], proposal_yaml: str, meta: Mapping[str, Any]) -> str:
    """The report as one HTML string."""
    parts = [html_section("summary", "Summary", _guard(lambda: _summary(tables, meta)))]
    parts.append(html_section("proposal", "Proposal", _guard(lambda: _proposal(proposal_yaml or "", tables))))
    for anchor, heading, build in SECTIONS:
        parts.append(html_section(anchor, heading, _guard(partial(build, tables))))
    nav = [("summary", "Summary"), ("proposal", "Proposal"), *((a, h) for a, h, _ in SECTIONS)]
    return html_page("kthrottle quota proposal", nav, parts, html_note("written by kthrottle tune"))


def _guard(build: Callable[[], str]) -> str:
    """A section that fails is a note in the report, not a failed report."""
    try:
        return build()
    except Exception as exc:  # data of any shape may reach here; the rest of the report stands
        return html_note(f"this section could not be drawn: {type(exc).__name__}: {exc}", "warn")


def write_report(
    path: str | Path, tables: dict[str, pd.DataFrame], proposal_yaml: str, meta: dict[str, Any]
) -> None:
    """Write the self-contained HTML report to ``path`` (written whole, then renamed into place)."""
    target = Path(path)
    text = render_report(tables or {}, proposal_yaml, meta or {})
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
