"""The report's plots: matplotlib figures drawn on their own Agg canvas, inlined as PNG.

Why apart from the page: drawing is the slow, fiddly part of the report (axes in binary units,
tick labels that must not overlap, a table instead of a chart when there are too few points), and
it is checked on its own (``label_overlaps``, ``declutter``; tests/unit/test_report_plain.py).
Each function returns the HTML of one ``<figure class="plot" data-points="N">`` (analytics/
report_html.py), or a sentence saying why there is no picture.
"""

from __future__ import annotations

import base64
import io
import itertools
import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from analytics.report_html import html_figure, html_note, html_table
from analytics.report_text import (
    TOP_ENTITIES,
    as_text,
    counted,
    entity_label,
    find_col,
    fmt_num,
    fmt_rate,
    fmt_time,
    is_missing,
    topic_label,
)

TOP_SERIES = 8  # lines per rate-over-time plot
MIN_SECONDS = 3  # seconds with data a chart over time needs; fewer are listed in a table
MIN_DISTRIBUTION = 5  # entities a distribution needs; fewer are in the tables already
LABEL_CHARS = 40  # legend and bar labels are cut to this


def new_figure(width: float = 9.0, height: float = 3.6) -> Any:
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


def figure_html(fig: Any, alt: str, points: int, caption: str = "") -> str:
    """The figure, decluttered, as an inline PNG in a <figure> that says how many points it draws."""
    declutter(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return html_figure(base64.b64encode(buf.getvalue()).decode("ascii"), alt, points, caption)


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


def count_axis(axis: Any) -> None:
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


def legend(ax: Any, entries: int) -> None:
    """The legend beside the plot (never over data or the axes' labels), small enough to fit."""
    if entries:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def cut(label: str, chars: int = LABEL_CHARS) -> str:
    return label if len(label) <= chars else label[: chars - 1] + "…"


def _key_label(keys: Sequence[str], key: tuple[Any, ...]) -> str:
    named = dict(zip(keys, key, strict=True))
    if "user" in named or "client_id" in named:
        return entity_label(named.get("user"), named.get("client_id"))
    if "topic" in named:
        return topic_label(named["topic"], short=True)
    return " ".join(as_text(v) for v in key)


def _series_mask(series: pd.DataFrame, keys: Sequence[str], key: tuple[Any, ...]) -> pd.Series:
    mask = pd.Series(True, index=series.index)
    for k, v in zip(keys, key, strict=True):
        mask &= series[k].isna() if is_missing(v) else series[k] == v
    return mask


def _few_seconds(series: pd.DataFrame, keys: list[str], title: str, sec: str, val: str, unit: str) -> str:
    """Too few seconds for a chart: the seconds themselves, as a table and a sentence."""
    rows = series.sort_values(sec).head(TOP_ENTITIES).copy()
    rows["_when"] = [fmt_time(float(s) * 1000) for s in rows[sec]]
    rows["_who"] = [_key_label(keys, tuple(r[k] for k in keys)) for _, r in rows.iterrows()]
    fmt = fmt_rate if unit == "B/s" else fmt_num
    seconds = series[sec].nunique()
    sentence = html_note(
        f"{title}: only {counted(seconds, 'second')} with data in the capture, too few for a chart "
        f"(at least {MIN_SECONDS} are needed); here they are."
    )
    return sentence + html_table(
        rows,
        [("time", "_when", as_text), ("who", "_who", as_text), (unit, val, fmt)],
        text_columns=("time", "who"),
    )


def series_plot(
    series: pd.DataFrame,
    keys: list[str],
    title: str,
    value: str | None = None,
    unit: str = "B/s",
    sparse: bool = False,
) -> str:
    """Values over time, one line per key (the top ones by total); a few seconds are a table."""
    sec, val = find_col(series, "second"), value or find_col(series, "bytes")
    if sec is None or val is None or val not in series.columns or any(k not in series.columns for k in keys):
        return html_note(f"{title}: left out, the per-second table lacks its columns")
    series = series[pd.to_numeric(series[val], errors="coerce").fillna(0) > 0]
    if series.empty:
        return html_note(f"{title}: left out, no second in the capture had any")
    if series[sec].nunique() < MIN_SECONDS:
        return _few_seconds(series, keys, title, sec, val, unit)
    totals = series.groupby(keys, dropna=False)[val].sum().sort_values(ascending=False)
    top = [k if isinstance(k, tuple) else (k,) for k in totals.index[:TOP_SERIES]]
    x_all, xlabel = _time_axis(series[sec])
    fig = new_figure()
    ax = fig.add_subplot()
    points = 0
    for key in top:
        part = series[_series_mask(series, keys, key)].sort_values(sec)
        style = {"ls": "none", "marker": "o", "ms": 3} if sparse else {"lw": 1.0}
        ax.plot(x_all[part.index], part[val].astype(float), label=cut(_key_label(keys, key)), **style)
        points += len(part)
    ax.set_xlabel(xlabel)
    count_axis(ax.xaxis)
    if unit == "B/s":
        ax.set_ylabel("bytes per second")
        _rate_axis(ax.yaxis)
    else:
        ax.set_ylabel(unit)
        count_axis(ax.yaxis)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    legend(ax, len(top))
    caption = f"the {len(top)} with the most in all, of {len(totals)}" if len(totals) > len(top) else ""
    return figure_html(fig, title, points, caption)


def _p99s(rates: pd.DataFrame) -> dict[str, Any]:
    """Positive p99 values per direction (a rate of 0 has no place on a log axis)."""
    import numpy as np

    p99 = find_col(rates, "p99")
    if p99 is None:
        return {}
    groups = list(rates.groupby("direction")) if "direction" in rates.columns else [("all", rates)]
    out = {}
    for direction, part in groups:
        values = pd.to_numeric(part[p99], errors="coerce").dropna()
        out[str(direction)] = np.sort(values[values > 0].to_numpy(dtype=float))
    return out


def distribution_plot(rates: pd.DataFrame, title: str, plural: str = "entities") -> str:
    """Histogram and CDF of the per-entity p99, per direction with enough entities to show a shape;
    with fewer the tables above say it all, and a sentence says so."""
    import numpy as np

    values = _p99s(rates)
    if not values:
        return html_note(f"{title}: left out, the rates table has no p99 column")
    shown = {d: v for d, v in values.items() if v.size >= MIN_DISTRIBUTION}
    few = {d: v.size for d, v in values.items() if v.size < MIN_DISTRIBUTION}
    few_text = "; ".join(f"{d}: {counted(n, 'entity', 'entities')}" for d, n in few.items())
    if not shown:
        return html_note(
            f"{title}: left out, too few {plural} with traffic for a distribution ({few_text}; "
            f"at least {MIN_DISTRIBUTION} are needed). Their rates are in the tables above."
        )
    everything = np.concatenate(list(shown.values()))
    lo, hi = float(everything.min()), float(everything.max())
    if hi == lo:
        return html_note(
            f"{title}: left out, all {fmt_num(everything.size)} {plural} have the same p99, {fmt_rate(lo)}."
        )
    log = hi >= 10 * lo
    bins = np.logspace(math.log10(lo), math.log10(hi * 1.0001), 25) if log else min(25, everything.size)
    fig = new_figure(9.0, 3.4)
    hist, cdf = fig.subplots(1, 2)
    quota, dashed = find_col(rates, "quota"), False
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
    count_axis(hist.yaxis)
    hist.set_ylabel(plural)
    cdf.set_ylabel(f"share of {plural}")
    hist.set_title(f"{plural} per p99 range")
    cdf.set_title("share at or below each p99")
    caption = "Dashed: the median proposed quota. " if dashed else ""
    caption += f"Left out, too few to show a shape: {few_text}." if few else ""
    return figure_html(fig, title, sum(v.size for v in shown.values()), caption)


def bar_plot(labels: Sequence[str], values: Sequence[float], title: str, xlabel: str) -> str:
    """Horizontal bars, largest on top; log scale when the values span two decades or more."""
    from matplotlib.ticker import LogLocator, NullFormatter

    fig = new_figure(9.0, max(2.2, 0.28 * len(labels) + 1.2))
    ax = fig.add_subplot()
    ax.barh(range(len(labels)), values, color="#c0504d")
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) >= 100:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=6))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        count_axis(ax.xaxis)
    ax.set_yticks(range(len(labels)), [cut(lbl, 64) for lbl in labels], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return figure_html(fig, title, len(labels))


def hourly_lines(h: pd.DataFrame, hour: str, new: str, top: Sequence[Any]) -> str:
    """New producer ids per hour, one line per user of ``top``."""
    fig = new_figure()
    ax = fig.add_subplot()
    t0 = float(pd.to_numeric(h[hour], errors="coerce").min())
    points = 0
    for user in top:
        part = h[h["user"] == user].sort_values(hour)
        x = pd.to_numeric(part[hour], errors="coerce")
        if t0 > 1e6:  # epoch seconds: hours since the first
            x = (x - t0) / 3600.0
        ax.plot(x, part[new], marker="o", ms=3, lw=1, label=cut(str(user)))
        points += len(part)
    ax.set_xlabel(f"hours since {fmt_time(t0 * 1000)}" if t0 > 1e6 else "hour")
    ax.set_ylabel("new producer ids")
    count_axis(ax.xaxis)
    count_axis(ax.yaxis)
    ax.set_title("new producer ids per hour, top users")
    ax.grid(alpha=0.3)
    legend(ax, len(top))
    return figure_html(fig, "new producer ids per hour", points)
