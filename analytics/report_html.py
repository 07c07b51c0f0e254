"""The report's HTML: the page and its pieces from templates, and the tables built from rows.

The page, a section and a plot's figure are ``string.Template`` files under analytics/templates/
(shipped as package data), so their markup is read and changed as HTML rather than as Python
strings. Every value put into them from the data is escaped here: user and client names are
whatever clients sent.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from importlib import resources
from string import Template
from typing import Any

import pandas as pd


@cache
def template(name: str) -> Template:
    """A template file of analytics/templates/ (read once); fragments lose their final newline."""
    text = resources.files("analytics").joinpath("templates", name).read_text(encoding="utf-8")
    return Template(text if name == "report.html" else text.removesuffix("\n"))


@cache
def stylesheet() -> str:
    """The page's CSS, inlined into its <style> so the report stands alone."""
    return resources.files("analytics").joinpath("templates", "report.css").read_text(encoding="utf-8")


def esc(value: Any) -> str:
    """Text from the data, safe inside an element or an attribute."""
    return html.escape("" if value is None else str(value), quote=True)


Column = tuple[str, str | None, Callable[[Any], str]]  # header, column name, formatter


def html_table(
    df: pd.DataFrame,
    columns: Sequence[Column],
    text_columns: Iterable[str] = (),
    classes: Mapping[str, str] | None = None,
) -> str:
    """An HTML table of the rows of ``df``, every cell escaped; columns the table lacks, or whose
    every cell would be empty, are left out."""
    cols = [(h, c, f) for h, c, f in columns if c is not None and c in df.columns]
    if not cols or df.empty:
        return html_note("no rows")
    cells = {h: [f(v) for v in df[c]] for h, c, f in cols}
    cols = [col for col in cols if any(cells[col[0]])] or cols
    left = set(text_columns)
    cls = {h: (classes or {}).get(h, "t" if h in left else "") for h, _, _ in cols}
    head = "".join(f'<th class="{"t" if h in left else ""}">{esc(h)}</th>' for h, _, _ in cols)
    body = []
    for i in range(len(df)):
        row = "".join(f'<td class="{cls[h]}">{esc(cells[h][i])}</td>' for h, _, _ in cols)
        body.append(f"<tr>{row}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def html_note(text: str, cls: str = "note") -> str:
    """A sentence in place of what could not be shown, or beside what is."""
    return f'<p class="{cls}">{esc(text)}</p>'


def html_section(anchor: str, title: str, body: str) -> str:
    """One section of the page: its anchor (for the navigation), heading and body."""
    return template("section.html").substitute(anchor=esc(anchor), title=esc(title), body=body)


def html_pairs(rows: Iterable[tuple[str, str]], right: bool = False) -> str:
    """A two-column table of (name, value) rows: the summary's facts, stage times, options."""
    cls = "" if right else "t"
    cells = "".join(f'<tr><th class="t">{esc(k)}</th><td class="{cls}">{esc(v)}</td></tr>' for k, v in rows)
    return f"<table>{cells}</table>"


def html_figure(png_base64: str, alt: str, points: int, caption: str = "") -> str:
    """A plot as an inline <img> in a <figure> that says how many points it draws."""
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return template("figure.html").substitute(points=int(points), alt=esc(alt), data=png_base64, caption=cap)


def html_page(title: str, nav: Sequence[tuple[str, str]], sections: Iterable[str], footer: str) -> str:
    """The whole page: title, navigation links (anchor, heading), the sections and a footer."""
    links = "".join(f'<a href="#{anchor}">{esc(heading)}</a>' for anchor, heading in nav)
    return template("report.html").substitute(
        title=esc(title), css=stylesheet(), nav=links, sections="".join(sections), footer=footer
    )
