"""The tuning job's report: one self-contained HTML file an operator reads before applying a proposal.

Everything is inline (CSS in a <style>, plots as base64 PNG drawn with matplotlib's Agg backend),
so the file can be mailed, attached to a ticket or opened offline. Every piece of text from the
data goes through ``html.escape``: user and client names are whatever clients sent.

The tables are taken as they come: each section looks for the columns it knows under the names the
job uses (and a few older spellings), skips with a note what is missing or empty, and a section
that fails for any other reason is replaced by a note rather than failing the report.
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

TOP_ENTITIES = 15  # rows per table of top entities
TOP_SERIES = 8  # lines per rate-over-time plot
LEVEL_ORDER = ("user-client", "user", "client")

# Logical column -> accepted names, first found wins.
_NAMES: dict[str, tuple[str, ...]] = {
    "p50": ("p50_bps", "p50"),
    "p95": ("p95_bps", "p95"),
    "p99": ("p99_bps", "p99"),
    "max": ("max_bps", "max"),
    "mean": ("mean_bps", "mean"),
    "active": ("active_s", "seconds_active"),
    "total": ("total_bytes", "bytes_total"),
    "throttled": ("throttle_ms", "throttled_ms"),
    "quota": ("quota_bps", "proposed_quota", "quota", "quota_value"),
    "quota_level": ("quota_level",),
    "second": ("sec", "second"),
    "bytes": ("bytes",),
    "bursts": ("max_burst_s",),
    "mutations": ("mutations", "total"),
    "max_per_s": ("max_per_s", "max_per_second"),
    "max_window": ("max_window", "max_burst"),
    "peak_rate": ("peak_rate",),
    "new_ids": ("new_ids",),
    "hour": ("hour_start_s", "hour"),
}

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td.t,th.t{text-align:left}
tr:nth-child(even) td{background:#fafafa}
pre{background:#f6f8fa;border:1px solid #ddd;padding:1em;overflow-x:auto;font-size:.85em}
.note{color:#666;font-style:italic}.warn{color:#a33}
img{max-width:100%;height:auto;display:block;margin:.5em 0}
nav a{margin-right:1em}
"""


# --- formatting -------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt_bytes(value: Any, suffix: str = "B") -> str:
    """1536 -> '1.5 KiB' (binary units: quotas are set in bytes)."""
    if _missing(value):
        return ""
    v = float(value)
    for unit in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(v) < 1024 or unit == "Ti":
            return f"{v:.0f} {unit}{suffix}" if unit == "" else f"{v:.1f} {unit}{suffix}"
        v /= 1024
    return f"{v:.1f} Ti{suffix}"


def fmt_rate(value: Any) -> str:
    return fmt_bytes(value, "B/s")


def fmt_num(value: Any) -> str:
    if _missing(value):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def fmt_ms(value: Any) -> str:
    """Milliseconds as the unit that reads best."""
    if _missing(value):
        return ""
    v = float(value)
    if v < 1000:
        return f"{v:.0f} ms"
    if v < 120_000:
        return f"{v / 1000:.1f} s"
    if v < 7_200_000:
        return f"{v / 60_000:.1f} min"
    return f"{v / 3_600_000:.1f} h"


def fmt_time(ms: Any) -> str:
    if _missing(ms):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(ms) / 1000.0))


def _text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def _col(df: pd.DataFrame, logical: str) -> str | None:
    for name in _NAMES.get(logical, (logical,)):
        if name in df.columns:
            return name
    return None


def entity_label(user: Any, client_id: Any) -> str:
    """How an entity reads: 'alice', 'client app-1', or 'alice / app-1'."""
    u, c = _text(user), _text(client_id)
    if u and c:
        return f"{u} / {c}"
    if u:
        return u
    if c:
        return f"client {c}"
    return "(none)"


Column = tuple[str, str | None, Callable[[Any], str]]  # header, column name, formatter


def _table(df: pd.DataFrame, columns: Sequence[Column], text_columns: Iterable[str] = ()) -> str:
    """An HTML table of the rows of ``df``; missing columns are left out, every cell escaped."""
    cols = [(h, c, f) for h, c, f in columns if c is not None and c in df.columns]
    if not cols or df.empty:
        return _note("no rows")
    left = set(text_columns)
    head = "".join(f'<th class="{"t" if h in left else ""}">{_esc(h)}</th>' for h, _, _ in cols)
    body = []
    for _, row in df.iterrows():
        cells = "".join(f'<td class="{"t" if h in left else ""}">{_esc(f(row[c]))}</td>' for h, c, f in cols)
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{_esc(text)}</p>'


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{_esc(anchor)}"><h2>{_esc(title)}</h2>{body}</section>'


def _usable(tables: Mapping[str, Any], *names: str) -> tuple[str, pd.DataFrame] | None:
    """The first of ``names`` present as a non-empty DataFrame."""
    for name in names:
        df = tables.get(name)
        if isinstance(df, pd.DataFrame) and not df.empty:
            return name, df
    return None


# --- plots --------------------------------------------------------------------------------------


def _figure(width: float = 9.0, height: float = 3.6) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=90, layout="constrained")


def _png(fig: Any, alt: str) -> str:
    """The figure as an inline <img> (base64 PNG): nothing outside the file."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">'


def _rate_axis(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_rate(v)))


def _key_label(keys: Sequence[str], key: tuple[Any, ...]) -> str:
    named = dict(zip(keys, key, strict=True))
    if "user" in named or "client_id" in named:
        return entity_label(named.get("user"), named.get("client_id"))
    return " ".join(_text(v) for v in key)


def _series_plot(
    series: pd.DataFrame,
    keys: list[str],
    title: str,
    value: str | None = None,
    unit: str = "B/s",
    sparse: bool = False,
) -> str:
    """Values over time, one line per key (the top ones by total)."""
    sec, val = _col(series, "second"), value or _col(series, "bytes")
    if sec is None or val is None or val not in series.columns or any(k not in series.columns for k in keys):
        return _note(f"{title}: the series table lacks its columns")
    totals = series.groupby(keys, dropna=False)[val].sum().sort_values(ascending=False)
    top = list(totals.index[:TOP_SERIES])
    if not top:
        return _note(f"{title}: no data")
    t0 = float(series[sec].min())
    fig = _figure()
    ax = fig.add_subplot()
    for key in top:
        key_t = key if isinstance(key, tuple) else (key,)
        mask = pd.Series(True, index=series.index)
        for k, v in zip(keys, key_t, strict=True):
            mask &= series[k].isna() if _missing(v) else series[k] == v
        part = series[mask].sort_values(sec)
        x = part[sec].astype(float) - t0
        style = {"ls": "none", "marker": "o", "ms": 3} if sparse else {"lw": 1.0}
        ax.plot(x, part[val].astype(float), label=_key_label(keys, key_t)[:40], **style)
    ax.set_xlabel(f"seconds since {fmt_time(t0 * 1000)}")
    if unit == "B/s":
        ax.set_ylabel("bytes per second")
        _rate_axis(ax)
    else:
        ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncols=2)
    return _png(fig, title)


def _distribution_plot(rates: pd.DataFrame, title: str) -> str:
    """Histogram and CDF of the per-entity p99, per direction (log scale: rates span decades)."""
    import numpy as np

    p99 = _col(rates, "p99")
    if p99 is None:
        return _note(f"{title}: no p99 column")
    fig = _figure(9.0, 3.4)
    hist, cdf = fig.subplots(1, 2)
    groups = list(rates.groupby("direction")) if "direction" in rates.columns else [("all", rates)]
    drawn = False
    for direction, part in groups:
        values = pd.to_numeric(part[p99], errors="coerce").dropna()
        values = values[values > 0].to_numpy(dtype=float)
        if values.size == 0:
            continue
        drawn = True
        lo, hi = values.min(), values.max()
        bins = np.logspace(math.log10(lo), math.log10(hi * 1.0001), 30) if hi > lo else 10
        hist.hist(values, bins=bins, alpha=0.6, label=str(direction))
        xs = np.sort(values)
        (line,) = cdf.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=str(direction))
        quota = _col(part, "quota")
        if quota is not None:
            q = pd.to_numeric(part[quota], errors="coerce").dropna()
            if not q.empty:
                cdf.axvline(float(q.median()), ls="--", lw=0.8, color=line.get_color())
    if not drawn:
        return _note(f"{title}: no positive rates")
    for ax in (hist, cdf):
        ax.set_xscale("log")
        ax.set_xlabel("p99 of 1-second rates (B/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    hist.set_ylabel("entities")
    cdf.set_ylabel("share of entities")
    hist.set_title("per-entity p99")
    cdf.set_title("CDF (dashed: median proposed quota)")
    return _png(fig, title)


def _bar_plot(labels: Sequence[str], values: Sequence[float], title: str, xlabel: str) -> str:
    """Horizontal bars, largest on top; log scale when the values span two decades or more."""
    fig = _figure(9.0, max(2.0, 0.3 * len(labels) + 1.0))
    ax = fig.add_subplot()
    ax.barh(range(len(labels)), values, color="#c0504d")
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) >= 100:
        ax.set_xscale("log")
    ax.set_yticks(range(len(labels)), [lbl[:50] for lbl in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig, title)


# --- sections -----------------------------------------------------------------------------------


def _summary(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    if meta.get("input") is not None:
        rows.append(("input", _text(meta["input"])))
    if meta.get("files") is not None:
        rows.append(("files", fmt_num(meta["files"])))
    if meta.get("records") is not None:
        rows.append(("records", fmt_num(meta["records"])))
    start, end = meta.get("start_ms"), meta.get("end_ms")
    if start is not None and end is not None:
        rows.append(("time span", f"{fmt_time(start)} to {fmt_time(end)}"))
    span = meta.get("span_s")
    if span is None and start is not None and end is not None:
        span = (float(end) - float(start)) / 1000.0
    if span is not None:
        rows.append(("span", fmt_ms(float(span) * 1000)))
    stages = meta.get("stages")
    run_s = meta.get("run_s", meta.get("seconds"))
    if run_s is None and isinstance(stages, Mapping):
        try:
            run_s = sum(float(v) for v in stages.values())
        except (TypeError, ValueError):
            run_s = None
    if run_s is not None:
        rows.append(("run time", fmt_ms(float(run_s) * 1000)))
        records = meta.get("records")
        if records and float(run_s) > 0:
            rows.append(("throughput", f"{fmt_num(round(float(records) / float(run_s)))} records/s"))
    for key in ("master", "spark_version", "generated_at"):
        if meta.get(key) is not None:
            rows.append((key.replace("_", " "), _text(meta[key])))
    shown = {
        "input",
        "files",
        "records",
        "start_ms",
        "end_ms",
        "span_s",
        "stages",
        "run_s",
        "seconds",
        "master",
        "spark_version",
        "generated_at",
        "notes",
        "options",
    }
    for key, value in meta.items():
        if key not in shown and isinstance(value, (str, int, float, bool)):
            rows.append((str(key), _text(value)))
    body = (
        "<table>"
        + "".join(f'<tr><th class="t">{_esc(k)}</th><td class="t">{_esc(v)}</td></tr>' for k, v in rows)
        + "</table>"
    )
    if isinstance(stages, Mapping) and stages:
        body += (
            "<h3>Stages</h3><table>"
            + "".join(
                f'<tr><th class="t">{_esc(k)}</th><td>{_esc(_stage_time(v))}</td></tr>'
                for k, v in stages.items()
            )
            + "</table>"
        )
    options = meta.get("options")
    if isinstance(options, Mapping) and options:
        body += (
            "<h3>Options</h3><table>"
            + "".join(
                f'<tr><th class="t">{_esc(k)}</th><td class="t">{_esc(v)}</td></tr>'
                for k, v in options.items()
            )
            + "</table>"
        )
    notes = meta.get("notes")
    if isinstance(notes, str):
        notes = [notes]
    for note in notes or []:
        body += _note(str(note))
    present = [name for name, df in tables.items() if isinstance(df, pd.DataFrame) and not df.empty]
    body += _note("tables: " + (", ".join(sorted(present)) or "none"))
    return body


def _stage_time(value: Any) -> str:
    try:
        return fmt_ms(float(value) * 1000)
    except (TypeError, ValueError):
        return _text(value)


def _proposal(proposal_yaml: str, tables: Mapping[str, Any]) -> str:
    body = f"<pre>{_esc(proposal_yaml.strip()) or '(empty)'}</pre>"
    found = _usable(tables, "proposal")
    if found is not None:
        df = found[1]
        body += "<h3>How each value was chosen</h3>" + _table(
            df,
            [
                ("kind", "kind", _text),
                ("level", "level", _text),
                ("user", "user", _text),
                ("client id", "client_id", _text),
                ("topic", "topic", _text),
                ("key", "key", _text),
                ("value", "value", fmt_num),
                ("observed", "observed", fmt_num),
                ("basis", "basis", _text),
                ("written", "written", fmt_num),
                ("note", "note", _text),
            ],
            text_columns=("kind", "level", "user", "client id", "topic", "key", "basis", "note"),
        )
    return body


def _rate_columns(df: pd.DataFrame) -> list[Column]:
    return [
        ("entity", "_label", _text),
        ("active", _col(df, "active"), lambda v: fmt_ms(float(v) * 1000) if not _missing(v) else ""),
        ("total", _col(df, "total"), fmt_bytes),
        ("p50", _col(df, "p50"), fmt_rate),
        ("p95", _col(df, "p95"), fmt_rate),
        ("p99", _col(df, "p99"), fmt_rate),
        ("max", _col(df, "max"), fmt_rate),
        ("longest burst", _col(df, "bursts"), lambda v: fmt_ms(float(v) * 1000) if not _missing(v) else ""),
        ("throttled (live)", _col(df, "throttled"), fmt_ms),
        ("proposed quota", _col(df, "quota"), fmt_rate),
        ("quota level", _col(df, "quota_level"), _text),
    ]


def _entities(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "entity_rates")
    if found is None:
        return _note("no entity rates in this run")
    df = found[1].copy()
    p99 = _col(df, "p99")
    df["_label"] = [
        entity_label(u, c)
        for u, c in zip(
            df["user"] if "user" in df.columns else [""] * len(df),
            df["client_id"] if "client_id" in df.columns else [""] * len(df),
            strict=True,
        )
    ]
    levels: list[str | None] = [lv for lv in LEVEL_ORDER if "level" in df.columns and lv in set(df["level"])]
    if "level" in df.columns:
        levels += sorted({str(lv) for lv in df["level"]} - set(LEVEL_ORDER))
    directions: list[Any] = sorted(set(df["direction"]), key=str) if "direction" in df.columns else [None]
    parts = [
        _note(
            f"Top {TOP_ENTITIES} entities per level and direction by p99 of their 1-second rates; "
            "the proposed quota is the one that would apply to them."
        )
    ]
    for level in levels or [None]:
        for direction in directions:
            sel = df
            if level is not None:
                sel = sel[sel["level"].astype(str) == str(level)]
            if direction is not None:
                sel = sel[sel["direction"] == direction]
            if sel.empty:
                continue
            if p99 is not None:
                sel = sel.sort_values(p99, ascending=False, na_position="last")
            title = " / ".join(str(x) for x in (level, direction) if x is not None) or "entities"
            parts.append(f"<h3>{_esc(title)} ({fmt_num(len(sel))} entities)</h3>")
            parts.append(
                _table(sel.head(TOP_ENTITIES), _rate_columns(sel), text_columns=("entity", "quota level"))
            )
    return "".join(parts)


def _timeseries(tables: Mapping[str, Any]) -> str:
    parts = []
    found = _usable(tables, "entity_series", "entity_timeseries")
    if found is None:
        parts.append(_note("no per-second series of entities in this run"))
    else:
        df = found[1]
        keys = [k for k in ("level", "user", "client_id") if k in df.columns]
        groups = list(df.groupby("direction")) if "direction" in df.columns else [("", df)]
        for direction, part in groups:
            levels = list(part.groupby("level")) if "level" in part.columns else [("", part)]
            for level, sub in levels:
                title = f"{direction} rate over time, top {level or 'entities'}".strip()
                parts.append(_series_plot(sub, keys, title))
    found = _usable(tables, "topic_series")
    if found is not None:
        df = found[1]
        groups = list(df.groupby("direction")) if "direction" in df.columns else [("", df)]
        for direction, part in groups:
            if "topic" in part.columns:
                parts.append(_series_plot(part, ["topic"], f"{direction} rate over time, top topics"))
    return "".join(parts)


def _distributions(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "entity_rates")
    if found is None:
        return _note("no entity rates in this run")
    df = found[1]
    parts = []
    levels: list[str | None] = [lv for lv in LEVEL_ORDER if "level" in df.columns and lv in set(df["level"])]
    for level in levels or [None]:
        sel = df if level is None else df[df["level"] == level]
        parts.append(_distribution_plot(sel, f"p99 per entity{'' if level is None else f' ({level} level)'}"))
    return "".join(parts)


_QUOTA_NAMES = {
    "producer_byte_rate": "produce bytes",
    "consumer_byte_rate": "fetch bytes",
    "controller_mutation_rate": "mutations",
    "producer_ids_rate": "producer ids",
    "topic_producer": "topic produce",
    "topic_consumer": "topic fetch",
}


def _bucket_label(row: Mapping[str, Any]) -> str:
    topic = _text(row.get("topic"))
    if topic:
        part = row.get("partition")
        if part is None or _missing(part) or int(part) < 0:
            return topic
        return f"{topic}-{int(part)}"
    return entity_label(row.get("user"), row.get("client_id"))


def _replay(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "replay")
    if found is None:
        return _note("the traffic was not replayed through the proposal in this run")
    df = found[1].copy()
    total = (
        "effective_throttle_ms_total" if "effective_throttle_ms_total" in df.columns else "throttle_ms_total"
    )
    if total not in df.columns or "requests" not in df.columns:
        return _note("the replay table lacks its columns")
    df["_label"] = [_bucket_label(r) for r in df.to_dict("records")]
    df["_quota"] = [_QUOTA_NAMES.get(str(q), str(q)) for q in df.get("quota", pd.Series([""] * len(df)))]
    throttled_col = "throttled_requests" if "throttled_requests" in df.columns else None
    hit = df[pd.to_numeric(df[total], errors="coerce").fillna(0) > 0]
    parts = []
    info = found[1].attrs.get("replay") if hasattr(found[1], "attrs") else None
    summary = f"{fmt_num(len(hit))} of {fmt_num(len(df))} quota buckets would be throttled under the proposal"
    if throttled_col is not None:
        summary += f", {fmt_num(df[throttled_col].sum())} requests in all"
    parts.append(f"<p>{_esc(summary)}.</p>")
    parts.append(
        _note(
            "Replayed through the proxy's own quota code in capture order. A client would have sent "
            "less once throttled, so these are upper bounds; 'request throttle' counts, per request, "
            "the largest throttle of all quotas it is under."
        )
    )
    if isinstance(info, Mapping):
        parts.append(
            _note("replay: " + ", ".join(f"{k} {v}" for k, v in info.items() if not isinstance(v, Mapping)))
        )
    if hit.empty:
        parts.append(_note("nobody would be throttled"))
        return "".join(parts)
    hit = hit.sort_values(total, ascending=False)
    top = hit.head(TOP_ENTITIES)
    parts.append(
        _bar_plot(
            [f"{q}: {lbl}" for q, lbl in zip(top["_quota"], top["_label"], strict=True)],
            [float(v) / 1000.0 for v in top[total]],
            "throttle under the proposal (top buckets)",
            "seconds of throttle over the capture",
        )
    )
    df_share = top.copy()
    if throttled_col is not None:
        df_share["_share"] = [
            f"{100.0 * t / r:.1f}%" if r else ""
            for t, r in zip(top[throttled_col], top["requests"], strict=True)
        ]
    parts.append(
        _table(
            df_share,
            [
                ("quota", "_quota", _text),
                ("bucket", "_label", _text),
                ("level", "level", _text),
                ("quota value", "quota_value", fmt_num),
                ("requests", "requests", fmt_num),
                ("throttled", throttled_col, fmt_num),
                ("share", "_share", _text),
                ("throttle (own)", "throttle_ms_total", fmt_ms),
                ("max", "max_throttle_ms", fmt_ms),
                ("request throttle", "effective_throttle_ms_total", fmt_ms),
                ("rejected mutations", "rejected_mutations", fmt_num),
            ],
            text_columns=("quota", "bucket", "level"),
        )
    )
    return "".join(parts)


def _mutations(tables: Mapping[str, Any]) -> str:
    parts = []
    found = _usable(tables, "mutations")
    if found is None:
        return _note("no partition mutations in the capture")
    df = found[1].copy()
    df["_label"] = [
        entity_label(u, c)
        for u, c in zip(df.get("user", [""] * len(df)), df.get("client_id", [""] * len(df)), strict=True)
    ]
    order = _col(df, "max_window") or _col(df, "mutations")
    if order is not None:
        df = df.sort_values(order, ascending=False)
    parts.append(
        _table(
            df.head(TOP_ENTITIES),
            [
                ("entity", "_label", _text),
                ("level", "level" if "level" in df.columns else None, _text),
                ("requests", "requests" if "requests" in df.columns else None, fmt_num),
                ("mutations", _col(df, "mutations"), fmt_num),
                ("max per second", _col(df, "max_per_s"), fmt_num),
                ("max per window", _col(df, "max_window"), fmt_num),
                ("peak rate /s", _col(df, "peak_rate"), fmt_num),
                ("well behaved", "well_behaved" if "well_behaved" in df.columns else None, fmt_num),
            ],
            text_columns=("entity", "level"),
        )
    )
    series = _usable(tables, "mutation_series")
    if series is not None:
        s = series[1]
        col = _col(s, "mutations")
        if col is not None:
            if "level" in s.columns and (s["level"] == "user-client").any():
                s = s[s["level"] == "user-client"]  # the other levels are its sums
            keys = [k for k in ("user", "client_id") if k in s.columns]
            parts.append(
                _series_plot(
                    s, keys, "partition mutations per second", col, "mutations per second", sparse=True
                )
            )
    return "".join(parts)


def _producer_ids(tables: Mapping[str, Any]) -> str:
    parts = []
    found = _usable(tables, "producer_ids")
    if found is None:
        return _note("no producer ids in the capture")
    df = found[1]
    hourly = _usable(tables, "producer_ids_hourly")
    if hourly is None and _col(df, "hour") is not None and "user" in df.columns:
        hourly = ("producer_ids", df)  # the brief's shape: (user, hour, new_ids)
        totals = df.groupby("user")[_col(df, "new_ids") or "new_ids"].sum().reset_index()
        df = totals
    order = _col(df, "new_ids")
    if order is not None:
        df = df.sort_values(order, ascending=False)
    parts.append(
        _table(
            df.head(TOP_ENTITIES),
            [
                ("user", "user" if "user" in df.columns else None, _text),
                ("new ids", _col(df, "new_ids"), fmt_num),
                ("hours", "hours" if "hours" in df.columns else None, fmt_num),
                (
                    "max new per hour",
                    "max_new_per_hour" if "max_new_per_hour" in df.columns else None,
                    fmt_num,
                ),
                (
                    "mean new per hour",
                    "mean_new_per_hour" if "mean_new_per_hour" in df.columns else None,
                    fmt_num,
                ),
                ("peak ids/s", "peak_ids_per_s" if "peak_ids_per_s" in df.columns else None, fmt_num),
                ("over quota", "over_quota" if "over_quota" in df.columns else None, fmt_num),
            ],
            text_columns=("user",),
        )
    )
    if hourly is not None:
        h = hourly[1]
        hour, new = _col(h, "hour"), _col(h, "new_ids")
        if hour is not None and new is not None and "user" in h.columns:
            per_user = h.groupby("user")[new].sum().sort_values(ascending=False)
            top = per_user.index[:TOP_SERIES]
            if h[hour].nunique() <= 2:  # an hour or two: one bar per user says more than lines
                parts.append(
                    _bar_plot(
                        [str(u) for u in top],
                        [float(per_user[u]) for u in top],
                        "new producer ids, top users",
                        "new producer ids over the capture",
                    )
                )
                return "".join(parts)
            fig = _figure()
            ax = fig.add_subplot()
            t0 = float(pd.to_numeric(h[hour], errors="coerce").min())
            for user in top:
                part = h[h["user"] == user].sort_values(hour)
                x = pd.to_numeric(part[hour], errors="coerce")
                if t0 > 1e6:  # epoch seconds: hours since the first
                    x = (x - t0) / 3600.0
                ax.plot(x, part[new], marker="o", ms=3, lw=1, label=str(user)[:40])
            ax.set_xlabel("hours since the first" if t0 > 1e6 else "hour")
            ax.set_ylabel("new producer ids")
            ax.set_title("new producer ids per hour, top users")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            parts.append(_png(fig, "new producer ids per hour"))
    return "".join(parts)


def _topics(tables: Mapping[str, Any]) -> str:
    parts = []
    for name, title in (("topic_rates", "Topics"), ("partition_rates", "Partitions")):
        found = _usable(tables, name)
        if found is None:
            continue
        df = found[1].copy()
        p99 = _col(df, "p99")
        if p99 is not None:
            df = df.sort_values(p99, ascending=False)
        if "partition" in df.columns and "topic" in df.columns:
            df["_label"] = [
                f"{_text(t)}-{_text(p)}" for t, p in zip(df["topic"], df["partition"], strict=True)
            ]
        elif "topic" in df.columns:
            df["_label"] = df["topic"].map(_text)
        else:
            continue
        parts.append(f"<h3>{_esc(title)} (top {TOP_ENTITIES} by p99)</h3>")
        parts.append(
            _table(
                df.head(TOP_ENTITIES),
                [
                    ("direction", "direction" if "direction" in df.columns else None, _text),
                    ("topic", "_label", _text),
                    ("total", _col(df, "total"), fmt_bytes),
                    ("p50", _col(df, "p50"), fmt_rate),
                    ("p95", _col(df, "p95"), fmt_rate),
                    ("p99", _col(df, "p99"), fmt_rate),
                    ("max", _col(df, "max"), fmt_rate),
                    ("partitions", "partitions" if "partitions" in df.columns else None, fmt_num),
                    (
                        "partition p99 (max)",
                        "partition_p99_max_bps" if "partition_p99_max_bps" in df.columns else None,
                        fmt_rate,
                    ),
                ],
                text_columns=("direction", "topic"),
            )
        )
    return "".join(parts) or _note("no topic rates in this run")


SECTIONS: tuple[tuple[str, str, Callable[..., str]], ...] = (
    ("entities", "Top entities by level", _entities),
    ("rates", "Rate over time", _timeseries),
    ("distributions", "Distributions", _distributions),
    ("replay", "Throttle under the proposal", _replay),
    ("topics", "Topics and partitions", _topics),
    ("mutations", "Partition mutations", _mutations),
    ("producer-ids", "Producer ids", _producer_ids),
)


def render_report(tables: Mapping[str, Any], proposal_yaml: str, meta: Mapping[str, Any]) -> str:
    """The report as one HTML string."""
    title = "kthrottle quota proposal"
    parts = [_section("summary", "Summary", _guard(lambda: _summary(tables, meta)))]
    parts.append(_section("proposal", "Proposal", _guard(lambda: _proposal(proposal_yaml or "", tables))))
    for anchor, heading, build in SECTIONS:
        parts.append(_section(anchor, heading, _guard(partial(build, tables))))
    nav = "".join(
        f'<a href="#{a}">{_esc(h)}</a>'
        for a, h in (("summary", "Summary"), ("proposal", "Proposal"), *((a, h) for a, h, _ in SECTIONS))
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1><nav>{nav}</nav>{''.join(parts)}"
        f"<footer>{_note('generated by kthrottle (analytics/report.py)')}</footer></body></html>\n"
    )


def _guard(build: Callable[[], str]) -> str:
    """A section that fails is a note in the report, not a failed report."""
    try:
        return build()
    except Exception as exc:  # data of any shape may reach here; the rest of the report stands
        return _note(f"this section could not be drawn: {type(exc).__name__}: {exc}", "warn")


def write_report(
    path: str | Path, tables: dict[str, pd.DataFrame], proposal_yaml: str, meta: dict[str, Any]
) -> None:
    """Write the self-contained HTML report to ``path`` (written whole, then renamed into place)."""
    target = Path(path)
    text = render_report(tables or {}, proposal_yaml, meta or {})
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
