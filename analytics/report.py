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

The tables are taken as they come: each section looks for the columns it knows under the names the
job uses (and a few older spellings), skips with a note what is missing or empty, and a section
that fails for any other reason is replaced by a note rather than failing the report.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from quota.keys import ANONYMOUS, DEFAULT

TOP_ENTITIES = 15  # rows per table of top entities
TOP_SERIES = 8  # lines per rate-over-time plot
LEVEL_ORDER = ("user-client", "user", "client")
MIN_SECONDS = 3  # seconds with data a chart over time needs; fewer are listed in a table
MIN_DISTRIBUTION = 5  # entities a distribution needs; fewer are in the tables already
MIN_BARS = 2  # a bar chart of one bar is a sentence
MIN_HOURS = 3  # hours a per-hour line needs; fewer are bars per user
LABEL_CHARS = 40  # legend and bar labels are cut to this

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

# --- plain words ------------------------------------------------------------------------------

LEVEL_WORDS = {"user-client": "user and client id", "user": "user", "client": "client id"}
LEVEL_PLURAL = {"user-client": "user and client-id pairs", "user": "users", "client": "client ids"}

# The KIP-55 level a quota resolved at (quota/entities.py), as the quota that applied.
QUOTA_LEVEL_WORDS = {
    1: "its own (user, client id) quota",
    2: "its user's quota per client id",
    3: "its user's quota, shared by the user's clients",
    4: "the quota of its client id under any user",
    5: "the default per user and client id",
    6: "the default per user, shared by its clients",
    7: "its client id's quota, shared across users",
    8: "the default per client id",
}

QUOTA_WORDS = {
    "producer_byte_rate": "produce bytes/s",
    "consumer_byte_rate": "fetch bytes/s",
    "controller_mutation_rate": "partition mutations/s",
    "producer_ids_rate": "new producer ids/s",
    "producer.byte.rate": "produce bytes/s into a topic",
    "consumer.byte.rate": "fetch bytes/s from a topic",
    "controller_window.num": "controller quota window (1-second samples)",
    "request_percentage": "request time (% of a thread)",
    # the replay names topic quotas by the stage that applies them
    "topic_producer": "produce bytes/s into a topic",
    "topic_consumer": "fetch bytes/s from a topic",
}

OPTION_WORDS = {
    "coverage": "share of entities the default covers",
    "headroom": "headroom (quota = observed p99 x this)",
    "top_k": "overrides per level (at most)",
    "default_level": "level of the defaults",
    "burst_factor": "a burst: seconds above this x the median",
    "controller_window_s": "controller quota window (s)",
    "sustained_window_s": "window of the sustained mutation rate (s)",
    "max_override_factor": "an override is at most this x the default",
    "min_requests": "fewest mutation requests or new producer ids a value rests on",
    "min_windows": "fewest 11 s quota windows of traffic a byte rate rests on",
}

BYTE_QUOTAS = {k for k, words in QUOTA_WORDS.items() if "bytes/s" in words}

_TOPIC_ID = re.compile(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right}td:not(.t){white-space:nowrap}
th{background:#f4f4f4}td.t,th.t{text-align:left}
tr:nth-child(even) td{background:#fafafa}
td.why{color:#a33;font-weight:bold;text-align:left}
pre{background:#f6f8fa;border:1px solid #ddd;padding:1em;overflow-x:auto;font-size:.85em}
.note{color:#666;font-style:italic}.warn{color:#a33}
.callout{border-left:4px solid #c0504d;background:#fbf1f0;padding:.5em 1em}
figure{margin:.5em 0}img{max-width:100%;height:auto;display:block}
figcaption{color:#666;font-size:.9em}
nav a{margin-right:1em}code{font-size:.9em}
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


def fmt_seconds(value: Any) -> str:
    return "" if _missing(value) else fmt_ms(float(value) * 1000)


def fmt_time(ms: Any) -> str:
    if _missing(ms):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(ms) / 1000.0))


def _plural(n: Any, one: str, many: str | None = None) -> str:
    """'1 request', '3 requests': counts in sentences read as English."""
    word = one if not _missing(n) and float(n) == 1 else (many or f"{one}s")
    return f"{fmt_num(n)} {word}"


def _text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def _col(df: pd.DataFrame, logical: str) -> str | None:
    for name in _NAMES.get(logical, (logical,)):
        if name in df.columns:
            return name
    return None


def _column(df: pd.DataFrame, name: str, default: Any = "") -> pd.Series:
    """A column, or ``default`` for every row when the table lacks it."""
    return df[name] if name in df.columns else pd.Series([default] * len(df), index=df.index)


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


def topic_label(topic: Any, short: bool = False) -> str:
    """A topic by name; one captured only as its id (32 hex digits or a UUID) says so rather than
    passing the id off as a name."""
    t = _text(topic)
    if not _TOPIC_ID.fullmatch(t):
        return t
    return f"topic id {t[:8] + '…' if short else t} (name not captured)"


def quota_words(key: Any) -> str:
    """'produce bytes/s (producer_byte_rate)': the plain words, and the key to find in quotas.yaml."""
    k = _text(key)
    words = QUOTA_WORDS.get(k)
    return f"{words} ({k})" if words else k


def quota_value(key: Any, value: Any) -> str:
    """A quota value in the unit of its key, byte rates also as the number quotas.yaml holds."""
    if _missing(value):
        return ""
    k = _text(key)
    if k in BYTE_QUOTAS:
        return f"{fmt_rate(value)} ({fmt_num(value)})"
    if k == "controller_mutation_rate":
        return f"{fmt_num(value)} /s"
    if k == "producer_ids_rate":
        return f"{fmt_num(value)} ids/s"
    return fmt_num(value)


def quota_level_words(value: Any) -> str:
    """The quota that applied to an entity (a KIP-55 level number, or an entity level's name)."""
    if _missing(value) or _text(value) == "":
        return ""
    try:
        return QUOTA_LEVEL_WORDS.get(int(value), _text(value))
    except (TypeError, ValueError):
        return LEVEL_WORDS.get(_text(value), _text(value))


def _anonymous_only(df: pd.DataFrame) -> bool:
    """Whether every user in ``df`` is the unauthenticated principal: no user-level traffic."""
    if "user" not in df.columns or df.empty:
        return False
    users = {_text(u) for u in df["user"]}
    return users <= {ANONYMOUS, ""}


def _no_users_sentence() -> str:
    return _note(
        f"No user-level traffic: every request came from an anonymous principal ({ANONYMOUS}), so "
        "there are no users to tell apart. Clients are told apart by client id below."
    )


Column = tuple[str, str | None, Callable[[Any], str]]  # header, column name, formatter


def _table(
    df: pd.DataFrame,
    columns: Sequence[Column],
    text_columns: Iterable[str] = (),
    classes: Mapping[str, str] | None = None,
) -> str:
    """An HTML table of the rows of ``df``, every cell escaped; columns the table lacks, or whose
    every cell would be empty, are left out."""
    cols = [(h, c, f) for h, c, f in columns if c is not None and c in df.columns]
    if not cols or df.empty:
        return _note("no rows")
    cells = {h: [f(v) for v in df[c]] for h, c, f in cols}
    cols = [col for col in cols if any(cells[col[0]])] or cols
    left = set(text_columns)
    cls = {h: (classes or {}).get(h, "t" if h in left else "") for h, _, _ in cols}
    head = "".join(f'<th class="{"t" if h in left else ""}">{_esc(h)}</th>' for h, _, _ in cols)
    body = []
    for i in range(len(df)):
        row = "".join(f'<td class="{cls[h]}">{_esc(cells[h][i])}</td>' for h, _, _ in cols)
        body.append(f"<tr>{row}</tr>")
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
    """A figure on its own Agg canvas: no pyplot state, nothing shown, safe in any thread."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _label_boxes(axis: Any, renderer: Any) -> list[tuple[Any, Any]]:
    """The visible tick labels of one axis with their boxes, in order along the axis."""
    labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text()]
    boxes = [(t, t.get_window_extent(renderer)) for t in labels]
    along_x = axis.axis_name == "x"
    return sorted(boxes, key=lambda tb: tb[1].x0 if along_x else tb[1].y0)


def label_overlaps(fig: Any) -> int:
    """How many pairs of neighbouring tick labels overlap once the figure is laid out."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    count = 0
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = _label_boxes(axis, renderer)
            count += sum(a[1].overlaps(b[1]) for a, b in itertools.pairwise(boxes))
    return count


def declutter(fig: Any, pad: float = 2.0) -> int:
    """Hide every tick label that would touch the last one kept on its axis; returns how many.
    Locators keep ticks few, but long rate labels or many bars can still meet."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = 0
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            kept = None
            for text, box in _label_boxes(axis, renderer):
                if kept is not None and box.padded(pad).overlaps(kept):
                    text.set_visible(False)
                    hidden += 1
                else:
                    kept = box
    return hidden


def _plot(fig: Any, alt: str, points: int, caption: str = "") -> str:
    """The figure as an inline <img> (base64 PNG) in a <figure> that says how many points it draws."""
    declutter(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    cap = f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
    return (
        f'<figure class="plot" data-points="{int(points)}">'
        f'<img alt="{_esc(alt)}" src="data:image/png;base64,{data}">{cap}</figure>'
    )


def _binary_ticks(vmin: float, vmax: float, log: bool) -> list[float]:
    """Ticks at round numbers of the binary unit the axis reads in (100 KiB/s, 1 MiB/s), not at
    round byte counts that print as 97.7 KiB/s; on a log axis 1, 10, 100 of a unit (or 2 and 5
    between them when the range is short)."""
    from matplotlib.ticker import MaxNLocator

    vmin, vmax = sorted((vmin, vmax))
    if not log:
        unit = 1024.0 ** max(0, int(math.log(max(abs(vmax), 1.0), 1024)))
        steps = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(vmin / unit, vmax / unit)
        return [float(v) * unit for v in steps]
    inside: list[float] = []
    for mantissas in ((1, 10, 100), (1, 5, 10, 50, 100, 500), (1, 2, 5, 10, 20, 50, 100, 200, 500)):
        ticks = {m * 1024.0**k for k in range(6) for m in mantissas}
        inside = sorted(t for t in ticks if vmin <= t <= vmax)
        if len(inside) >= 3:
            break
    return inside[:: math.ceil(len(inside) / 6)] if inside else inside


def _rate_axis(axis: Any, log: bool = False) -> None:
    """Bytes per second in KiB/MiB at round values, few ticks, no minor labels."""
    from matplotlib.ticker import FuncFormatter, Locator, NullFormatter, NullLocator

    class Binary(Locator):
        def __call__(self) -> list[float]:
            assert self.axis is not None  # set by set_major_locator
            return self.tick_values(*self.axis.get_view_interval())

        def tick_values(self, vmin: float, vmax: float) -> list[float]:
            return _binary_ticks(vmin, vmax, log)

    axis.set_major_locator(Binary())
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_rate(v).replace(".0 ", " ")))
    if log:
        axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def _count_axis(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=6))


def _time_axis(seconds: pd.Series) -> tuple[pd.Series, str]:
    """x values in the unit the span reads best in (seconds, minutes, hours), and their label."""
    secs = pd.to_numeric(seconds, errors="coerce").astype(float)
    t0 = float(secs.min())
    span = float(secs.max()) - t0
    unit, div = (
        ("hours", 3600.0) if span > 3 * 3600 else ("minutes", 60.0) if span > 900 else ("seconds", 1.0)
    )
    return (secs - t0) / div, f"{unit} since {fmt_time(t0 * 1000)}"


def _legend(ax: Any, entries: int) -> None:
    """The legend beside the plot (never over data or the axes' labels), small enough to fit."""
    if entries:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def _cut(label: str, chars: int = LABEL_CHARS) -> str:
    return label if len(label) <= chars else label[: chars - 1] + "…"


def _key_label(keys: Sequence[str], key: tuple[Any, ...]) -> str:
    named = dict(zip(keys, key, strict=True))
    if "user" in named or "client_id" in named:
        return entity_label(named.get("user"), named.get("client_id"))
    if "topic" in named:
        return topic_label(named["topic"], short=True)
    return " ".join(_text(v) for v in key)


def _series_mask(series: pd.DataFrame, keys: Sequence[str], key: tuple[Any, ...]) -> pd.Series:
    mask = pd.Series(True, index=series.index)
    for k, v in zip(keys, key, strict=True):
        mask &= series[k].isna() if _missing(v) else series[k] == v
    return mask


def _few_seconds(series: pd.DataFrame, keys: list[str], title: str, sec: str, val: str, unit: str) -> str:
    """Too few seconds for a chart: the seconds themselves, as a table and a sentence."""
    rows = series.sort_values(sec).head(TOP_ENTITIES).copy()
    rows["_when"] = [fmt_time(float(s) * 1000) for s in rows[sec]]
    rows["_who"] = [_key_label(keys, tuple(r[k] for k in keys)) for _, r in rows.iterrows()]
    fmt = fmt_rate if unit == "B/s" else fmt_num
    seconds = series[sec].nunique()
    sentence = _note(
        f"{title}: only {_plural(seconds, 'second')} with data in the capture, too few for a chart "
        f"(at least {MIN_SECONDS} are needed); here they are."
    )
    return sentence + _table(
        rows,
        [("time", "_when", _text), ("who", "_who", _text), (unit, val, fmt)],
        text_columns=("time", "who"),
    )


def _series_plot(
    series: pd.DataFrame,
    keys: list[str],
    title: str,
    value: str | None = None,
    unit: str = "B/s",
    sparse: bool = False,
) -> str:
    """Values over time, one line per key (the top ones by total); a few seconds are a table."""
    sec, val = _col(series, "second"), value or _col(series, "bytes")
    if sec is None or val is None or val not in series.columns or any(k not in series.columns for k in keys):
        return _note(f"{title}: left out, the per-second table lacks its columns")
    series = series[pd.to_numeric(series[val], errors="coerce").fillna(0) > 0]
    if series.empty:
        return _note(f"{title}: left out, no second in the capture had any")
    if series[sec].nunique() < MIN_SECONDS:
        return _few_seconds(series, keys, title, sec, val, unit)
    totals = series.groupby(keys, dropna=False)[val].sum().sort_values(ascending=False)
    top = [k if isinstance(k, tuple) else (k,) for k in totals.index[:TOP_SERIES]]
    x_all, xlabel = _time_axis(series[sec])
    fig = _figure()
    ax = fig.add_subplot()
    points = 0
    for key in top:
        part = series[_series_mask(series, keys, key)].sort_values(sec)
        style = {"ls": "none", "marker": "o", "ms": 3} if sparse else {"lw": 1.0}
        ax.plot(x_all[part.index], part[val].astype(float), label=_cut(_key_label(keys, key)), **style)
        points += len(part)
    ax.set_xlabel(xlabel)
    _count_axis(ax.xaxis)
    if unit == "B/s":
        ax.set_ylabel("bytes per second")
        _rate_axis(ax.yaxis)
    else:
        ax.set_ylabel(unit)
        _count_axis(ax.yaxis)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax, len(top))
    caption = f"the {len(top)} with the most in all, of {len(totals)}" if len(totals) > len(top) else ""
    return _plot(fig, title, points, caption)


def _p99s(rates: pd.DataFrame) -> dict[str, Any]:
    """Positive p99 values per direction (a rate of 0 has no place on a log axis)."""
    import numpy as np

    p99 = _col(rates, "p99")
    if p99 is None:
        return {}
    groups = list(rates.groupby("direction")) if "direction" in rates.columns else [("all", rates)]
    out = {}
    for direction, part in groups:
        values = pd.to_numeric(part[p99], errors="coerce").dropna()
        out[str(direction)] = np.sort(values[values > 0].to_numpy(dtype=float))
    return out


def _distribution_plot(rates: pd.DataFrame, title: str, plural: str = "entities") -> str:
    """Histogram and CDF of the per-entity p99, per direction with enough entities to show a shape;
    with fewer the tables above say it all, and a sentence says so."""
    import numpy as np

    values = _p99s(rates)
    if not values:
        return _note(f"{title}: left out, the rates table has no p99 column")
    shown = {d: v for d, v in values.items() if v.size >= MIN_DISTRIBUTION}
    few = {d: v.size for d, v in values.items() if v.size < MIN_DISTRIBUTION}
    few_text = "; ".join(f"{d}: {_plural(n, 'entity', 'entities')}" for d, n in few.items())
    if not shown:
        return _note(
            f"{title}: left out, too few {plural} with traffic for a distribution ({few_text}; "
            f"at least {MIN_DISTRIBUTION} are needed). Their rates are in the tables above."
        )
    everything = np.concatenate(list(shown.values()))
    lo, hi = float(everything.min()), float(everything.max())
    if hi == lo:
        return _note(
            f"{title}: left out, all {fmt_num(everything.size)} {plural} have the same p99, {fmt_rate(lo)}."
        )
    log = hi >= 10 * lo
    bins = np.logspace(math.log10(lo), math.log10(hi * 1.0001), 25) if log else min(25, everything.size)
    fig = _figure(9.0, 3.4)
    hist, cdf = fig.subplots(1, 2)
    quota, dashed = _col(rates, "quota"), False
    for direction, xs in shown.items():
        hist.hist(xs, bins=bins, alpha=0.6, label=direction)
        (line,) = cdf.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=direction)
        part = rates[rates["direction"].astype(str) == direction] if "direction" in rates.columns else rates
        q = pd.to_numeric(part[quota], errors="coerce").dropna() if quota else pd.Series(dtype=float)
        if not q.empty:
            cdf.axvline(float(q.median()), ls="--", lw=0.8, color=line.get_color())
            dashed = True
    span = max(hi - lo, 0.2 * hi)  # a narrow linear range is widened: ticks print apart
    pad = (span - (hi - lo)) / 2 + 0.05 * span
    for ax in (hist, cdf):
        ax.set_xscale("log" if log else "linear")
        if not log:
            ax.set_xlim(lo - pad, hi + pad)
        _rate_axis(ax.xaxis, log)
        ax.set_xlabel("p99 of the 1-second rates")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _count_axis(hist.yaxis)
    hist.set_ylabel(plural)
    cdf.set_ylabel(f"share of {plural}")
    hist.set_title(f"{plural} per p99 range")
    cdf.set_title("share at or below each p99")
    caption = "Dashed: the median proposed quota. " if dashed else ""
    caption += f"Left out, too few to show a shape: {few_text}." if few else ""
    return _plot(fig, title, sum(v.size for v in shown.values()), caption)


def _bar_plot(labels: Sequence[str], values: Sequence[float], title: str, xlabel: str) -> str:
    """Horizontal bars, largest on top; log scale when the values span two decades or more."""
    from matplotlib.ticker import LogLocator, NullFormatter

    fig = _figure(9.0, max(2.2, 0.28 * len(labels) + 1.2))
    ax = fig.add_subplot()
    ax.barh(range(len(labels)), values, color="#c0504d")
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) >= 100:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=6))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        _count_axis(ax.xaxis)
    ax.set_yticks(range(len(labels)), [_cut(lbl, 64) for lbl in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return _plot(fig, title, len(labels))


# --- summary -------------------------------------------------------------------------------------


def _summary_rows(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run at a glance: what was read, over what time, how long it took."""
    rows: list[tuple[str, str]] = []
    if meta.get("input") is not None:
        rows.append(("input", _text(meta["input"])))
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
            rows.append((words, _text(meta[key])))
    shown = {"input", "files", "records", "start_ms", "end_ms", "span_s", "stages", "run_s", "seconds"}
    shown |= {"master", "spark_version", "generated_at", "notes", "options"}
    for key, value in meta.items():
        if key not in shown and isinstance(value, (str, int, float, bool)):
            rows.append((str(key).replace("_", " "), _text(value)))
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


def _pairs(rows: Iterable[tuple[str, str]], right: bool = False) -> str:
    cls = "" if right else "t"
    cells = "".join(f'<tr><th class="t">{_esc(k)}</th><td class="{cls}">{_esc(v)}</td></tr>' for k, v in rows)
    return f"<table>{cells}</table>"


def _summary(tables: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    body = _pairs(_summary_rows(meta))
    stages = meta.get("stages")
    if isinstance(stages, Mapping) and stages:
        body += "<h3>Time per stage of the job</h3>" + _pairs(
            ((str(k), _stage_time(v)) for k, v in stages.items()), right=True
        )
    options = meta.get("options")
    if isinstance(options, Mapping) and options:
        body += "<h3>Options</h3>" + _pairs(
            (f"{OPTION_WORDS.get(str(k), str(k).replace('_', ' '))}", _text(v)) for k, v in options.items()
        )
    notes = meta.get("notes")
    if isinstance(notes, str):
        notes = [notes]
    for note in notes or []:
        body += _note(str(note))
    if any(isinstance(df, pd.DataFrame) and not df.empty for df in tables.values()):
        body += _note("Every table behind this report is beside it under tables/, as Parquet and CSV.")
    return body


def _stage_time(value: Any) -> str:
    try:
        return fmt_seconds(float(value))
    except (TypeError, ValueError):
        return _text(value)


# --- proposal -----------------------------------------------------------------------------------


def applies_to(row: Mapping[str, Any]) -> str:
    """Who a proposed value is for, in words ('user etl, client id etl-bulk-loader')."""
    kind, level = _text(row.get("kind")), _text(row.get("level"))
    user, client, topic = _text(row.get("user")), _text(row.get("client_id")), _text(row.get("topic"))
    if kind == "window" or level == "controller":
        return "the controller (every admin client)"
    if topic or level == "topic":
        return (
            "each topic without an override (default)" if topic == DEFAULT else f"topic {topic_label(topic)}"
        )
    if level in LEVEL_PLURAL and DEFAULT in (user, client) and {user, client} <= {DEFAULT, ""}:
        return f"each {LEVEL_WORDS[level]} without an override (default)"
    if level == "user":
        return f"user {user} (all its clients together)"
    if level == "client":
        return f"client id {client} (across users)"
    if user and client:
        return f"user {user}, client id {client}"
    return entity_label(user, client)


def evidence(row: Mapping[str, Any]) -> str:
    """What a value rests on: '1 mutation request over a 240 s capture from 1 user and client-id
    pair'; '9,629 requests in a median 80 s of traffic each from 66 user and client-id pairs'."""
    parts = []
    key = _text(row.get("key"))
    if not _missing(row.get("requests")):
        # What was counted: new producer ids for their rate, mutation requests for the controller's.
        one, many = {
            "producer_ids_rate": ("new producer id", "new producer ids"),
            "controller_mutation_rate": ("mutation request", "mutation requests"),
            "controller_window.num": ("mutation request", "mutation requests"),
        }.get(key, ("request", "requests"))
        parts.append(_plural(row["requests"], one, many))
    many_entities = not _missing(row.get("entities")) and float(row["entities"]) > 1
    if not _missing(row.get("seconds")):
        if key not in BYTE_QUOTAS:  # rates of events: counted over the whole capture
            parts.append(f"over a {fmt_num(row['seconds'])} s capture")
        elif many_entities:  # a default: the median entity's seconds
            parts.append(f"in a median {fmt_num(row['seconds'])} s of traffic each")
        else:
            parts.append(f"in {fmt_num(row['seconds'])} s of traffic")
    if not _missing(row.get("entities")):
        level = _text(row.get("level"))
        if level == "controller":  # the controller window rests on the admin clients' bursts
            parts.append(f"from {_plural(row['entities'], 'admin client')}")
            return " ".join(parts)
        one, many = {"user-client": ("user and client-id pair", "user and client-id pairs")}.get(
            level, (LEVEL_WORDS.get(level, level or "entity"), LEVEL_PLURAL.get(level, "entities"))
        )
        if level == "topic":
            one, many = "topic", "topics"
        parts.append(f"from {_plural(row['entities'], one, many)}")
    return " ".join(parts)


def _observed(key: Any, value: Any) -> str:
    """What was measured: a rate for byte quotas, else the number the basis column explains."""
    return fmt_rate(value) if _text(key) in BYTE_QUOTAS else fmt_num(value)


def _proposal_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The proposal table with its values said in words, ready to show."""
    out = df.copy()
    records = out.to_dict("records")
    out["_what"] = [quota_words(r.get("key")) for r in records]
    out["_who"] = [applies_to(r) for r in records]
    out["_value"] = [quota_value(r.get("key"), r.get("value")) for r in records]
    out["_observed"] = [_observed(r.get("key"), r.get("observed")) for r in records]
    out["_evidence"] = [evidence(r) for r in records]
    out["_why"] = [_text(r.get("note")) or "(no reason given)" for r in records]
    return out


def _written_mask(df: pd.DataFrame) -> pd.Series:
    if "written" not in df.columns:
        return pd.Series(True, index=df.index)
    return df["written"].map(lambda v: not _missing(v) and bool(v))


_PROPOSAL_COLUMNS: list[Column] = [
    ("quota", "_what", _text),
    ("for", "_who", _text),
    ("value", "_value", _text),
    ("observed", "_observed", _text),
    ("how it was chosen", "basis", _text),
    ("rests on", "_evidence", _text),
]


def _proposal(proposal_yaml: str, tables: Mapping[str, Any]) -> str:
    body = f"<pre>{_esc(proposal_yaml.strip()) or '(empty)'}</pre>"
    found = _usable(tables, "proposal")
    if found is None:
        return body
    df = _proposal_rows(found[1])
    written = _written_mask(df)
    kept, left = df[written], df[~written]
    text_cols = ("quota", "for", "how it was chosen", "rests on", "note", "why not written")
    head = f"{_plural(len(kept), 'proposed value')} written to quotas.yaml"
    if len(left):
        head += f"; {fmt_num(len(left))} left out, each with its reason under 'Left out of quotas.yaml' below"
    body = f'<p class="{"callout" if len(left) else ""}">{_esc(head)}.</p>' + body
    if not kept.empty:
        body += "<h3>Written to quotas.yaml, and what each value rests on</h3>" + _table(
            kept, [*_PROPOSAL_COLUMNS, ("note", "note", _text)], text_columns=text_cols
        )
    if not left.empty:
        body += "<h3>Left out of quotas.yaml, and why</h3>" + _table(
            left,
            [("why not written", "_why", _text), *_PROPOSAL_COLUMNS],
            text_columns=text_cols,
            classes={"why not written": "t why"},
        )
    return body


# --- entities -----------------------------------------------------------------------------------


def _rate_columns(df: pd.DataFrame) -> list[Column]:
    return [
        ("who", "_label", _text),
        ("active for", _col(df, "active"), fmt_seconds),
        ("total", _col(df, "total"), fmt_bytes),
        ("p50", _col(df, "p50"), fmt_rate),
        ("p95", _col(df, "p95"), fmt_rate),
        ("p99", _col(df, "p99"), fmt_rate),
        ("max", _col(df, "max"), fmt_rate),
        ("longest burst", _col(df, "bursts"), fmt_seconds),
        ("throttled while captured", _col(df, "throttled"), fmt_ms),
        ("proposed quota", _col(df, "quota"), fmt_rate),
        ("which quota applies", _col(df, "quota_level"), quota_level_words),
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
        entity_label(u, c) for u, c in zip(_column(out, "user"), _column(out, "client_id"), strict=True)
    ]
    return out


def _entities(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "entity_rates")
    if found is None:
        return _note("no entity rates in this run")
    df = _labelled(found[1])
    p99 = _col(df, "p99")
    directions: list[Any] = sorted(set(df["direction"]), key=str) if "direction" in df.columns else [None]
    parts = [
        _note(
            f"The busiest {TOP_ENTITIES} per level and direction, by the p99 of their 1-second rates; "
            "the proposed quota is the one that would apply to them."
        )
    ]
    for level in _levels(df):
        by_level = df if level is None else df[df["level"].astype(str) == level]
        if level == "user" and _anonymous_only(by_level):
            parts.append(f"<h3>{_esc(LEVEL_PLURAL['user'].capitalize())}</h3>{_no_users_sentence()}")
            continue
        for direction in directions:
            sel = by_level if direction is None else by_level[by_level["direction"] == direction]
            if sel.empty:
                continue
            if p99 is not None:
                sel = sel.sort_values(p99, ascending=False, na_position="last")
            who = LEVEL_PLURAL.get(str(level), str(level)) if level is not None else "entities"
            title = f"{str(direction).capitalize() + ': ' if direction is not None else ''}{who}"
            parts.append(f"<h3>{_esc(title)} ({fmt_num(len(sel))})</h3>")
            parts.append(
                _table(
                    sel.head(TOP_ENTITIES), _rate_columns(sel), text_columns=("who", "which quota applies")
                )
            )
    return "".join(parts)


def _timeseries(tables: Mapping[str, Any]) -> str:
    parts = []
    found = _usable(tables, "entity_series", "entity_timeseries")
    if found is None:
        parts.append(_note("no per-second series of entities in this run"))
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
                    parts.append(f"<h3>{_esc(title)}</h3>{_no_users_sentence()}")
                    continue
                parts.append(_series_plot(sub, keys, title))
    found = _usable(tables, "topic_series")
    if found is not None:
        df = found[1]
        groups = list(df.groupby("direction")) if "direction" in df.columns else [("", df)]
        for direction, part in groups:
            if "topic" in part.columns:
                title = f"{str(direction).capitalize()} bytes per second, busiest topics"
                parts.append(_series_plot(part, ["topic"], title))
    return "".join(parts)


def _distributions(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "entity_rates")
    if found is None:
        return _note("no entity rates in this run")
    df = found[1]
    parts = [
        _note(
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
        parts.append(_distribution_plot(sel, title, who))
    return "".join(parts)


# --- replay -------------------------------------------------------------------------------------


def _bucket_label(row: Mapping[str, Any], short: bool = False) -> str:
    topic = _text(row.get("topic"))
    if topic:
        part = row.get("partition")
        name = topic_label(topic, short)
        if part is None or _missing(part) or int(part) < 0:
            return name
        return f"{name} partition {int(part)}"
    return entity_label(row.get("user"), row.get("client_id"))


def _replay_work(info: Mapping[str, Any], buckets: int) -> str:
    """What the replay did, in words (its info dict names its internal steps)."""
    pruned, rows, secs = info.get("pruned_buckets"), info.get("replayed_rows"), info.get("seconds")
    if pruned is None or _missing(pruned):
        return ""
    text = (
        f"Of the {fmt_num(buckets)} quota buckets, {fmt_num(pruned)} could not have gone over their "
        "quota at any moment (their per-second totals show it), so they were counted without being "
        f"replayed; {fmt_num(max(0, buckets - int(pruned)))} were replayed request by request"
    )
    if not _missing(rows):
        text += f" ({_plural(rows, 'request')})"
    if not _missing(secs):
        text += f", in {fmt_seconds(secs)}"
    return text + "."


def _replay_rows(df: pd.DataFrame, total: str) -> pd.DataFrame:
    """The replay table with who, which quota and its value in words."""
    out = df.copy()
    records = out.to_dict("records")
    out["_label"] = [_bucket_label(r) for r in records]
    out["_short"] = [_bucket_label(r, short=True) for r in records]
    out["_quota"] = [QUOTA_WORDS.get(_text(r.get("quota")), _text(r.get("quota"))) for r in records]
    out["_applies"] = [quota_level_words(r.get("level")) for r in records]
    out["_value"] = [quota_value(r.get("quota"), r.get("quota_value")) for r in records]
    throttled = "throttled_requests" if "throttled_requests" in out.columns else None
    if throttled is not None:
        out["_share"] = [
            f"{100.0 * t / r:.1f}%" if r else "" for t, r in zip(out[throttled], out["requests"], strict=True)
        ]
    return out[pd.to_numeric(out[total], errors="coerce").fillna(0) > 0].sort_values(total, ascending=False)


def _replay(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "replay")
    if found is None:
        return _note("the traffic was not replayed through the proposal in this run")
    df = found[1]
    total = (
        "effective_throttle_ms_total" if "effective_throttle_ms_total" in df.columns else "throttle_ms_total"
    )
    if total not in df.columns or "requests" not in df.columns:
        return _note("left out: the replay table lacks its columns")
    hit = _replay_rows(df, total)
    summary = f"{fmt_num(len(hit))} of {fmt_num(len(df))} quota buckets would be throttled under the proposal"
    if "throttled_requests" in df.columns:
        summary += f", {_plural(df['throttled_requests'].sum(), 'request')} in all"
    parts = [f"<p>{_esc(summary)}.</p>"]
    parts.append(
        _note(
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
        parts.append(_note(work))
    if hit.empty:
        parts.append(_note("Nobody would be throttled."))
        return "".join(parts)
    top = hit.head(TOP_ENTITIES)
    if len(top) >= MIN_BARS:
        parts.append(
            _bar_plot(
                [f"{lbl}: {q}" for q, lbl in zip(top["_quota"], top["_short"], strict=True)],
                [float(v) / 1000.0 for v in top[total]],
                "throttle under the proposal, most throttled first",
                "seconds of throttle over the capture",
            )
        )
    parts.append(_replay_table(top))
    return "".join(parts)


def _replay_table(top: pd.DataFrame) -> str:
    return _table(
        top,
        [
            ("quota", "_quota", _text),
            ("who", "_label", _text),
            ("quota that applied", "_applies", _text),
            ("quota value", "_value", _text),
            ("requests", "requests", fmt_num),
            (
                "throttled requests",
                "throttled_requests" if "throttled_requests" in top.columns else None,
                fmt_num,
            ),
            ("share", "_share", _text),
            ("throttle from this quota", "throttle_ms_total", fmt_ms),
            ("longest throttle", "max_throttle_ms", fmt_ms),
            ("throttle a client would see", "effective_throttle_ms_total", fmt_ms),
            ("mutations refused", "rejected_mutations", fmt_num),
        ],
        text_columns=("quota", "who", "quota that applied"),
    )


# --- mutations ----------------------------------------------------------------------------------


def _mutations(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "mutations")
    if found is None:
        return _note("No partition mutations (topics or partitions created or deleted) in the capture.")
    df = _labelled(found[1])
    if "level" in df.columns and (df["level"] == "user-client").any():
        df = df[df["level"] == "user-client"]  # the other levels are its sums
    order = _col(df, "max_window") or _col(df, "mutations")
    if order is not None:
        df = df.sort_values(order, ascending=False)
    parts = [
        _note(
            "Partitions created or deleted by each user and client id: what the controller mutation "
            "quota counts."
        ),
        _table(
            df.head(TOP_ENTITIES),
            [
                ("who", "_label", _text),
                ("requests", "requests" if "requests" in df.columns else None, fmt_num),
                ("partitions", _col(df, "mutations"), fmt_num),
                ("most in one second", _col(df, "max_per_s"), fmt_num),
                ("most in one controller window", _col(df, "max_window"), fmt_num),
                ("peak sustained rate /s", _col(df, "peak_rate"), fmt_num),
                (
                    "bursts covered by the default",
                    "well_behaved" if "well_behaved" in df.columns else None,
                    fmt_num,
                ),
            ],
            text_columns=("who",),
        ),
    ]
    series = _usable(tables, "mutation_series")
    if series is not None:
        s = series[1]
        col = _col(s, "mutations")
        if col is not None:
            if "level" in s.columns and (s["level"] == "user-client").any():
                s = s[s["level"] == "user-client"]  # the other levels are its sums
            keys = [k for k in ("user", "client_id") if k in s.columns]
            title = "Partitions created or deleted per second"
            parts.append(_series_plot(s, keys, title, col, "partitions per second", sparse=True))
    return "".join(parts)


# --- producer ids -------------------------------------------------------------------------------


def _producer_id_table(df: pd.DataFrame) -> str:
    def present(name: str) -> str | None:
        return name if name in df.columns else None

    return _table(
        df.head(TOP_ENTITIES),
        [
            ("user", present("user"), _text),
            ("new producer ids", _col(df, "new_ids"), fmt_num),
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
    hour, new = _col(h, "hour"), _col(h, "new_ids")
    if hour is None or new is None or "user" not in h.columns:
        return ""
    per_user = h.groupby("user")[new].sum().sort_values(ascending=False)
    top = list(per_user.index[:TOP_SERIES])
    if h[hour].nunique() < MIN_HOURS:
        if len(top) < MIN_BARS:
            return _note("New producer ids: one user only, its count is in the table above.")
        return _bar_plot(
            [str(u) for u in top],
            [float(per_user[u]) for u in top],
            "new producer ids, top users",
            "new producer ids over the capture",
        )
    fig = _figure()
    ax = fig.add_subplot()
    t0 = float(pd.to_numeric(h[hour], errors="coerce").min())
    points = 0
    for user in top:
        part = h[h["user"] == user].sort_values(hour)
        x = pd.to_numeric(part[hour], errors="coerce")
        if t0 > 1e6:  # epoch seconds: hours since the first
            x = (x - t0) / 3600.0
        ax.plot(x, part[new], marker="o", ms=3, lw=1, label=_cut(str(user)))
        points += len(part)
    ax.set_xlabel(f"hours since {fmt_time(t0 * 1000)}" if t0 > 1e6 else "hour")
    ax.set_ylabel("new producer ids")
    _count_axis(ax.xaxis)
    _count_axis(ax.yaxis)
    ax.set_title("new producer ids per hour, top users")
    ax.grid(alpha=0.3)
    _legend(ax, len(top))
    return _plot(fig, "new producer ids per hour", points)


def _producer_ids(tables: Mapping[str, Any]) -> str:
    found = _usable(tables, "producer_ids")
    if found is None:
        return _note("No producer ids in the capture (no idempotent or transactional producer).")
    df = found[1]
    hourly = _usable(tables, "producer_ids_hourly")
    if hourly is None and _col(df, "hour") is not None and "user" in df.columns:
        hourly = ("producer_ids", df)  # the brief's shape: (user, hour, new_ids)
        df = df.groupby("user")[_col(df, "new_ids") or "new_ids"].sum().reset_index()
    order = _col(df, "new_ids")
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
                f"{topic_label(t)} partition {_text(p)}"
                for t, p in zip(df["topic"], df["partition"], strict=True)
            ],
            index=df.index,
        )
    return df["topic"].map(topic_label)


def _topics(tables: Mapping[str, Any]) -> str:
    parts = []
    for name, title in (("topic_rates", "Topics"), ("partition_rates", "Partitions")):
        found = _usable(tables, name)
        if found is None:
            continue
        df = found[1].copy()
        labels = _topic_labels(df)
        if labels is None:
            continue
        df["_label"] = labels
        p99 = _col(df, "p99")
        if p99 is not None:
            df = df.sort_values(p99, ascending=False)
        parts.append(f"<h3>{_esc(title)}, the busiest {TOP_ENTITIES} by p99 of their 1-second rates</h3>")
        parts.append(_topic_table(df))
    return "".join(parts) or _note("no topic rates in this run")


def _topic_table(df: pd.DataFrame) -> str:
    return _table(
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
        f"<footer>{_note('written by kthrottle tune')}</footer></body></html>\n"
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
