"""The report is one self-contained, well-formed HTML file, whatever tables it is given."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analytics.replay import replay_rows
from analytics.report import fmt_bytes, fmt_ms, write_report
from quota.config import QuotaConfig

T0_S = 1_767_225_600
EVIL = "<script>alert('x')</script>"
VOID = {"meta", "img", "br", "hr", "link", "input"}


class _Checker(HTMLParser):
    """Tags balanced, nothing fetched from outside, no script."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.images = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.errors.append("script element")
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith(("data:", "#")):
                self.errors.append(f"external {name}: {value[:60]}")
        if tag == "img":
            self.images += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unbalanced </{tag}> (open: {self.stack[-3:]})")
        else:
            self.stack.pop()


def check(path: Path) -> tuple[str, _Checker]:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert 'src="http' not in text and "src='http" not in text
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert not checker.errors, checker.errors[:5]
    assert not checker.stack, checker.stack
    return text, checker


def entity_tables() -> dict[str, pd.DataFrame]:
    """Tables in the shape analytics/tune.py hands over (a few rows each)."""
    entities = [
        ("user-client", "alice", "app"),
        ("user-client", "bob", EVIL),
        ("user", "alice", ""),
        ("client", "", "app"),
    ]
    rates = pd.DataFrame(
        [
            {
                "level": lv,
                "user": u,
                "client_id": c,
                "direction": d,
                "active_s": 600,
                "total_bytes": 6e8 * (i + 1),
                "p50_bps": 1e5 * (i + 1),
                "p95_bps": 2e5 * (i + 1),
                "p99_bps": 3e5 * (i + 1),
                "max_bps": 5e5 * (i + 1),
                "throttle_ms": 0,
                "max_burst_s": 3,
                "bursts": 2,
                "mean_burst_s": 1.5,
                "mean_bps": 1.1e5,
                "throttled_share": 0.0,
                "quota_bps": 4e5 if lv == "user-client" else None,
                "quota_level": "user-client" if lv == "user-client" else "",
            }
            for i, (lv, u, c) in enumerate(entities)
            for d in ("produce", "fetch")
        ]
    )
    series = pd.DataFrame(
        [
            {
                "level": lv,
                "user": u,
                "client_id": c,
                "direction": d,
                "sec": T0_S + s,
                "bytes": 1000 * (s % 7 + i),
            }
            for i, (lv, u, c) in enumerate(entities)
            for d in ("produce", "fetch")
            for s in range(60)
        ]
    )
    topic_series = pd.DataFrame(
        [
            {"direction": "produce", "topic": t, "sec": T0_S + s, "bytes": 500 * s}
            for t in ("a", "b")
            for s in range(30)
        ]
    )
    topics = pd.DataFrame(
        [
            {
                "direction": "produce",
                "topic": "a",
                "active_s": 30,
                "total_bytes": 1e6,
                "p50_bps": 1e4,
                "p95_bps": 2e4,
                "p99_bps": 3e4,
                "max_bps": 4e4,
                "partitions": 3,
                "partition_p99_max_bps": 2e4,
                "partition_max_bps": 3e4,
            }
        ]
    )
    partitions = pd.DataFrame(
        [
            {
                "direction": "produce",
                "topic": "a",
                "partition": p,
                "active_s": 30,
                "total_bytes": 1e5,
                "p50_bps": 1e3,
                "p95_bps": 2e3,
                "p99_bps": 3e3,
                "max_bps": 4e3,
            }
            for p in range(3)
        ]
    )
    mutations = pd.DataFrame(
        [
            {
                "level": "user-client",
                "user": "ops",
                "client_id": "terraform",
                "requests": 4,
                "mutations": 40,
                "active_s": 4,
                "max_per_s": 12,
                "max_window": 30,
                "peak_rate": 0.1,
                "mean_rate": 0.05,
                "well_behaved": True,
            }
        ]
    )
    mutation_series = pd.DataFrame(
        [
            {
                "level": "user-client",
                "user": "ops",
                "client_id": "terraform",
                "sec": T0_S + 10 * s,
                "mutations": 10,
            }
            for s in range(4)
        ]
    )
    pids = pd.DataFrame(
        [
            {
                "user": "storm",
                "new_ids": 2000,
                "hours": 1,
                "max_new_per_hour": 2000,
                "mean_new_per_hour": 2000,
                "peak_ids_per_s": 3.3,
                "over_quota": True,
            }
        ]
    )
    pid_hours = pd.DataFrame(
        [
            {
                "user": u,
                "hour_start_s": T0_S + 3600 * h,
                "covered_s": 3600,
                "new_ids": 10 * h + len(u),
                "ids_per_s": 0.01,
            }
            for u in ("storm", "calm")
            for h in range(4)
        ]
    )
    proposal = pd.DataFrame(
        [
            {
                "kind": "default",
                "level": "user-client",
                "user": "<default>",
                "client_id": "<default>",
                "topic": "",
                "key": "producer_byte_rate",
                "value": 400000,
                "observed": 300000,
                "basis": "p99 x 1.5",
                "written": True,
                "note": EVIL,
            }
        ]
    )
    return {
        "entity_rates": rates,
        "entity_series": series,
        "topic_rates": topics,
        "partition_rates": partitions,
        "topic_series": topic_series,
        "mutations": mutations,
        "mutation_series": mutation_series,
        "producer_ids": pids,
        "producer_ids_hourly": pid_hours,
        "proposal": proposal,
    }


def replay_table() -> pd.DataFrame:
    cfg = QuotaConfig.model_validate({"clients": {"app": {"producer_byte_rate": 500}}})
    rows = [
        {
            "ts_ms": T0_S * 1000 + i * 100,
            "principal": EVIL,
            "client_id": "app",
            "api_key": 0,
            "request_bytes": 400,
        }
        for i in range(50)
    ]
    return pd.DataFrame(replay_rows(rows, cfg, strict_from={19: 6, 20: 5, 37: 3}))


META: dict[str, Any] = {
    "input": "/captures/<prod>",
    "files": 2,
    "records": 200_000,
    "start_ms": T0_S * 1000,
    "end_ms": (T0_S + 600) * 1000,
    "span_s": 600,
    "stages": {"statistics": 20.5, "replay": 5.1},
    "options": {"headroom": 1.5},
    "notes": [EVIL],
}


def test_full_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    tables = {**entity_tables(), "replay": replay_table()}
    out = tmp_path / "report.html"
    write_report(out, tables, f"quotas:\n  users:\n    '{EVIL}': {{producer_byte_rate: 1}}\n", META)
    text, checker = check(out)
    assert "<script" not in text
    assert "&lt;script&gt;" in text  # names, notes and the YAML are shown, escaped
    assert checker.images >= 8  # series per level and direction, distributions, replay, mutations, ids
    for heading in (
        "Summary",
        "Proposal",
        "Top entities by level",
        "Rate over time",
        "Distributions",
        "Throttle under the proposal",
        "Partition mutations",
        "Producer ids",
    ):
        assert f">{heading}</h2>" in text
    assert "200,000" in text and "2026-01-01 00:00:00 UTC" in text and "25.6 s" in text  # summary
    assert "1 of 1 quota buckets would be throttled" in text
    assert "could not be drawn" not in text


def test_brief_column_names_are_understood(tmp_path: Path) -> None:
    """The first draft of the tables (entity_timeseries, p99, second, ...) draws the same plots."""
    rates = pd.DataFrame(
        [
            {
                "level": "user",
                "user": f"u{i}",
                "client_id": "",
                "direction": "produce",
                "p50": 10.0 * i,
                "p95": 20.0 * i,
                "p99": 30.0 * i + 1,
                "max": 40.0 * i + 1,
                "seconds_active": 60,
                "bytes_total": 600 * i,
                "throttled_ms": 0,
            }
            for i in range(20)
        ]
    )
    series = pd.DataFrame(
        [
            {
                "level": "user",
                "user": f"u{i}",
                "client_id": "",
                "direction": "produce",
                "second": T0_S + s,
                "bytes": s * i,
            }
            for i in range(3)
            for s in range(20)
        ]
    )
    tables = {
        "entity_rates": rates,
        "entity_timeseries": series,
        "topic_rates": pd.DataFrame(
            [{"topic": "t", "partition": 0, "direction": "fetch", "p50": 1, "p95": 2, "p99": 3, "max": 4}]
        ),
        "mutations": pd.DataFrame(
            [{"user": "ops", "client_id": "tf", "total": 9, "max_per_second": 3, "max_burst": 5}]
        ),
        "producer_ids": pd.DataFrame([{"user": "p", "hour": h, "new_ids": h * 3} for h in range(5)]),
    }
    out = tmp_path / "r.html"
    write_report(out, tables, "quotas: {}\n", {"records": 10})
    text, checker = check(out)
    assert checker.images == 3  # rate over time, distribution of p99, new ids per hour
    assert "could not be drawn" not in text
    assert "u19" in text and "ops / tf" in text


@pytest.mark.parametrize(
    "tables",
    [
        {},
        {"entity_rates": pd.DataFrame(), "replay": pd.DataFrame(), "entity_series": pd.DataFrame()},
        {
            "entity_rates": pd.DataFrame({"unexpected": [1, 2]}),
            "replay": pd.DataFrame({"quota": ["x"]}),
            "entity_series": pd.DataFrame({"sec": [1]}),
            "producer_ids": pd.DataFrame({"user": ["a"]}),
            "mutations": pd.DataFrame({"user": [None], "client_id": [float("nan")]}),
            "other": "not a frame",
        },
    ],
    ids=["none", "empty", "odd-columns"],
)
def test_missing_or_odd_tables_still_give_a_report(tmp_path: Path, tables: dict[str, Any]) -> None:
    out = tmp_path / "sub.html"
    write_report(str(out), tables, "", {})
    text, _ = check(out)
    assert re.search(r'class="note"', text)
    assert ">Throttle under the proposal</h2>" in text
    assert not list(tmp_path.glob(".*tmp"))  # written whole, then renamed


def test_formatting() -> None:
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(None) == "" and fmt_bytes(10) == "10 B"
    assert fmt_ms(2100) == "2.1 s" and fmt_ms(250) == "250 ms" and fmt_ms(float("nan")) == ""
