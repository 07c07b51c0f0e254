"""The report's parts alone: its words, its HTML templates and its plots (analytics/report_*.py)."""

from __future__ import annotations

import pandas as pd

from analytics.report_html import esc, html_page, html_section, html_table, template
from analytics.report_plots import bar_plot, series_plot
from analytics.report_text import counted, evidence, find_col, fmt_rate, quota_words, topic_label


def test_words_and_numbers() -> None:
    assert fmt_rate(1536) == "1.5 KiB/s"
    assert counted(1, "request") == "1 request" and counted(3, "request") == "3 requests"
    assert quota_words("producer_byte_rate") == "produce bytes/s (producer_byte_rate)"
    assert topic_label("0123456789abcdef0123456789abcdef", short=True).startswith("topic id 01234567…")
    assert find_col(pd.DataFrame(columns=["p99"]), "p99") == "p99"
    row = {"key": "producer_byte_rate", "requests": 9, "seconds": 80, "entities": 3, "level": "user"}
    assert evidence(row) == "9 requests in a median 80 s of traffic each from 3 users"


def test_the_page_comes_from_its_template_with_every_value_escaped() -> None:
    section = html_section("a<b", "Title & more", "<p>body</p>")
    assert section == '<section id="a&lt;b"><h2>Title &amp; more</h2><p>body</p></section>'
    page = html_page("t<", [("s", "S&")], [section], "<p>foot</p>")
    assert page.startswith('<!DOCTYPE html>\n<html lang="en">') and page.endswith("</html>\n")
    assert "<title>t&lt;</title>" in page and '<a href="#s">S&amp;</a>' in page
    assert "border-collapse" in page  # the stylesheet, inlined
    assert "$" not in template("report.html").safe_substitute(
        title="", css="", nav="", sections="", footer=""
    )
    table = html_table(pd.DataFrame({"who": ["<x>"]}), [("who", "who", str)], text_columns=("who",))
    assert '<td class="t">&lt;x&gt;</td>' in table and esc(None) == ""


def test_plots_say_how_many_points_they_draw() -> None:
    html = bar_plot(["a", "b"], [1.0, 2.0], "title", "x")
    assert html.startswith('<figure class="plot" data-points="2"><img alt="title"')
    series = pd.DataFrame(
        {"sec": [1, 2, 3, 1, 2, 3], "user": ["u"] * 3 + ["v"] * 3, "bytes": [1, 2, 3, 4, 5, 6]}
    )
    assert 'data-points="6"' in series_plot(series, ["user"], "rates")
    few = series_plot(series[series["sec"] == 1], ["user"], "rates")
    assert "too few for a chart" in few and "<table>" in few
