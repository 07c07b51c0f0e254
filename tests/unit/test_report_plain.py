"""The report says plainly what it cannot draw, and draws nothing meaningless (analytics/report.py).

The tables are built with pandas in the shapes analytics/tune.py documents, no Spark: a small
capture made through the proxy by plaintext clients (every request from ANONYMOUS, one
CreateTopics of 7 partitions, a fetch topic known only by its id) and a busier one with enough
entities for every plot. ``busy_tables`` is also what tests/integration/test_report_browser.py
loads in Chromium.
"""

from __future__ import annotations

import html
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analytics.report import declutter, label_overlaps, render_report, topic_label

T0_S = 1_767_225_600  # 2026-01-01T00:00:00Z
SPAN_S = 240
TOPIC_ID = "4f2c9a1be0d34c7f8a6b5e4d3c2b1a09"
NOT_WRITTEN = "only 1 mutation request in 240 s; at least 10 are needed"


def _rates(entities: list[tuple[str, str, str, str]], rng: np.random.Generator) -> pd.DataFrame:
    """entity_rates rows for (level, user, client id, direction), rates lognormal around 50 KiB/s."""
    rows = []
    for level, user, client, direction in entities:
        p50 = float(rng.lognormal(np.log(50_000), 0.8))
        rows.append(
            {
                "level": level,
                "user": user,
                "client_id": client,
                "direction": direction,
                "active_s": SPAN_S - 10,
                "total_bytes": int(p50 * SPAN_S),
                "p50_bps": int(p50),
                "p95_bps": int(p50 * 2),
                "p99_bps": int(p50 * 3),
                "max_bps": int(p50 * 4),
                "throttle_ms": 0,
                "max_burst_s": 2,
                "bursts": 3,
                "mean_burst_s": 1.3,
                "mean_bps": p50 * 1.1,
                "throttled_share": 0.0,
                "quota_bps": 240_000.0 if level == "user-client" else None,
                "quota_level": 5 if level == "user-client" else None,
            }
        )
    df = pd.DataFrame(rows)
    df["quota_bps"] = df["quota_bps"].astype("Float64")
    df["quota_level"] = df["quota_level"].astype("Int64")
    return df


def _series(keys: list[dict[str, Any]], rng: np.random.Generator) -> pd.DataFrame:
    """One row per key and second with traffic (every second but a few)."""
    rows = []
    for key in keys:
        for s in range(SPAN_S):
            if rng.random() < 0.9:
                rows.append({**key, "sec": T0_S + s, "bytes": int(rng.lognormal(np.log(40_000), 0.7))})
    return pd.DataFrame(rows)


def _proposal(rows: list[dict[str, Any]]) -> pd.DataFrame:
    base = {"level": "", "user": "", "client_id": "", "topic": "", "basis": "", "note": "", "observed": None}
    return pd.DataFrame([{**base, **r} for r in rows])


def _entity_levels(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    users = sorted({u for u, _ in pairs})
    clients = sorted({c for _, c in pairs})
    return (
        [("user-client", u, c) for u, c in pairs]
        + [("user", u, "") for u in users]
        + [("client", "", c) for c in clients]
    )


def proxy_tables() -> dict[str, pd.DataFrame]:
    """A few minutes of plaintext clients through the proxy: ANONYMOUS only, one CreateTopics."""
    rng = np.random.default_rng(1)
    pairs = [("ANONYMOUS", "console-producer"), ("ANONYMOUS", "console-consumer")]
    levels = _entity_levels(pairs)
    rates = _rates([(lv, u, c, d) for lv, u, c in levels for d in ("produce", "fetch")], rng)
    series = _series(
        [{"level": lv, "user": u, "client_id": c, "direction": "produce"} for lv, u, c in levels], rng
    )
    topic_series = _series(
        [{"direction": "produce", "topic": "orders"}, {"direction": "fetch", "topic": TOPIC_ID}], rng
    )
    topics = pd.DataFrame(
        [
            {"direction": d, "topic": t, "active_s": 200, "total_bytes": 9e6, "p99_bps": 9e4, "partitions": 3}
            for d, t in (("produce", "orders"), ("fetch", TOPIC_ID))
        ]
    )
    admin = [
        ("user-client", "ANONYMOUS", "adminclient-1"),
        ("user", "ANONYMOUS", ""),
        ("client", "", "adminclient-1"),
    ]
    mutations = pd.DataFrame(
        [
            {"level": lv, "user": u, "client_id": c, "requests": 1, "mutations": 7, "active_s": 1}
            | {"max_per_s": 7, "max_window": 7, "peak_rate": 7 / 600, "mean_rate": 7.0, "well_behaved": True}
            for lv, u, c in admin
        ]
    )
    mutation_series = pd.DataFrame(
        [{"level": lv, "user": u, "client_id": c, "sec": T0_S + 117, "mutations": 7} for lv, u, c in admin]
    )
    proposal = _proposal(
        [
            {
                "kind": "default",
                "level": "user-client",
                "user": "<default>",
                "client_id": "<default>",
                "key": "producer_byte_rate",
                "value": 240_000.0,
                "observed": 160_000.0,
                "basis": "p99 of 1/1 entities x 1.5",
                "written": True,
                "requests": 2400,
                "seconds": 230,
                "entities": 1,
            },
            {
                "kind": "default",
                "level": "user-client",
                "user": "<default>",
                "client_id": "<default>",
                "key": "controller_mutation_rate",
                "value": 0.018,
                "observed": 0.0117,
                "basis": "peak 10-minute rate of 1/1 well-behaved entities x 1.5",
                "written": False,
                "note": NOT_WRITTEN,
                "requests": 1,
                "seconds": SPAN_S,
                "entities": 1,
            },
        ]
    )
    replay = pd.DataFrame(
        [
            {"quota": q, "user": u, "client_id": c, "topic": t, "partition": p, "level": lv, "quota_value": v}
            | {"requests": n, "throttled_requests": k, "throttle_ms_total": 40 * k, "max_throttle_ms": 90}
            | {"rejected_mutations": 0, "effective_throttle_ms_total": 40 * k}
            for q, u, c, t, p, lv, v, n, k in (
                ("producer_byte_rate", "ANONYMOUS", "console-producer", "", -1, 5, 240_000.0, 2400, 12),
                ("topic_consumer", "", "", TOPIC_ID, 0, None, 100_000.0, 800, 5),
            )
        ]
    )
    replay["level"] = replay["level"].astype("Int64")
    replay.attrs["replay"] = {"steps": {"units": 0.1}, "units": 1, "hot_buckets": 1, "pruned_buckets": 1}
    replay.attrs["replay"] |= {"replayed_rows": 2400, "seconds": 0.4}
    return {
        "entity_rates": rates,
        "entity_series": series,
        "topic_rates": topics,
        "topic_series": topic_series,
        "mutations": mutations,
        "mutation_series": mutation_series,
        "proposal": proposal,
        "replay": replay,
    }


def busy_tables() -> dict[str, pd.DataFrame]:
    """A shared cluster's few minutes: named users, enough entities, topics and admin requests for
    every plot of the report, and a proposal with evidence columns."""
    rng = np.random.default_rng(2)
    pairs = [(f"svc-{i}", f"svc-{i}-{role}") for i in range(12) for role in ("producer", "consumer")]
    pairs += [("ANONYMOUS", "legacy-app"), ("etl", "bulk-loader-with-a-rather-long-client-id-0001")]
    levels = _entity_levels(pairs)
    rates = _rates([(lv, u, c, d) for lv, u, c in levels for d in ("produce", "fetch")], rng)
    series = _series(
        [
            {"level": lv, "user": u, "client_id": c, "direction": d}
            for lv, u, c in levels[:: max(1, len(levels) // 10)]
            for d in ("produce", "fetch")
        ],
        rng,
    )
    topics = [f"topic-{i}" for i in range(6)] + [TOPIC_ID]
    topic_series = _series([{"direction": d, "topic": t} for t in topics for d in ("produce", "fetch")], rng)
    topic_rates = pd.DataFrame(
        [
            {
                "direction": d,
                "topic": t,
                "active_s": 200,
                "total_bytes": 1e7 * (i + 1),
                "p99_bps": 1e5 * (i + 1),
            }
            | {"p50_bps": 3e4, "p95_bps": 6e4, "max_bps": 2e5 * (i + 1), "partitions": 6}
            for i, t in enumerate(topics)
            for d in ("produce", "fetch")
        ]
    )
    admins = [("ops", "terraform"), ("ci", "provisioner"), ("chaos", "topic-spammer")]
    mutation_series = pd.DataFrame(
        [
            {"level": "user-client", "user": u, "client_id": c, "sec": T0_S + int(s), "mutations": int(m)}
            for u, c in admins
            for s, m in zip(rng.choice(SPAN_S, 6, replace=False), rng.integers(1, 40, 6), strict=True)
        ]
    )
    mutations = (
        mutation_series.groupby(["level", "user", "client_id"])["mutations"]
        .agg(["count", "sum", "max"])
        .reset_index()
        .rename(columns={"count": "requests", "sum": "mutations", "max": "max_per_s"})
    )
    mutations["max_window"] = mutations["mutations"]
    mutations["well_behaved"] = mutations["user"] != "chaos"
    hourly = pd.DataFrame(
        [
            {"user": u, "hour_start_s": T0_S, "covered_s": SPAN_S, "new_ids": n, "ids_per_s": n / SPAN_S}
            for u, n in (("storm", 278), ("svc-1", 3), ("svc-2", 2))
        ]
    )
    producer_ids = hourly.rename(columns={"ids_per_s": "peak_ids_per_s"}).drop(columns="hour_start_s")
    tables = proxy_tables()
    replay = tables["replay"].copy()
    proposal = tables["proposal"].copy()
    proposal.loc[0, ["requests", "seconds", "entities"]] = [52_000, 240, 26]
    return {
        "entity_rates": rates,
        "entity_series": series,
        "topic_rates": topic_rates,
        "topic_series": topic_series,
        "mutations": mutations,
        "mutation_series": mutation_series,
        "producer_ids": producer_ids,
        "producer_ids_hourly": hourly,
        "proposal": proposal,
        "replay": replay,
    }


def text_of(page: str) -> str:
    """The page's words, as a reader sees them (tags and images dropped, entities decoded)."""
    page = re.sub(r"<style>.*?</style>|<img[^>]*>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def figures(page: str) -> list[int]:
    return [int(n) for n in re.findall(r'<figure class="plot" data-points="(\d+)">', page)]


@pytest.fixture(scope="module")
def proxy_page() -> str:
    return render_report(proxy_tables(), "quotas:\n  users: {}\n", {"records": 2400, "span_s": SPAN_S})


def test_no_user_level_traffic_is_a_sentence_not_an_empty_plot(proxy_page: str) -> None:
    text = text_of(proxy_page)
    assert "No user-level traffic: every request came from an anonymous principal (ANONYMOUS)" in text
    for title in ("p99 per user", "Produce bytes per second, busiest users"):
        assert f'alt="{title}"' not in proxy_page  # no plot of the one user there is
    # one user and client-id pair per direction: the tables show it, a distribution would not
    assert "p99 per user and client id: left out, too few user and client-id pairs with traffic" in text
    assert all(n > 0 for n in figures(proxy_page)), figures(proxy_page)


def test_a_single_mutation_is_a_table_not_a_dot(proxy_page: str) -> None:
    text = text_of(proxy_page)
    assert 'alt="Partitions created or deleted per second"' not in proxy_page
    assert "Partitions created or deleted per second: only 1 second with data in the capture" in text
    assert "2026-01-01 00:01:57 UTC ANONYMOUS / adminclient-1 7" in text  # the one request, in words


def test_values_not_written_say_why_and_every_value_its_evidence(proxy_page: str) -> None:
    text = text_of(proxy_page)
    assert "1 proposed value written to quotas.yaml; 1 left out" in text
    assert "Left out of quotas.yaml, and why" in text
    assert f'<td class="t why">{NOT_WRITTEN}</td>' in proxy_page
    assert "1 mutation request over a 240 s capture from 1 user and client-id pair" in text
    assert "2,400 requests in 230 s of traffic from 1 user and client-id pair" in text
    assert "produce bytes/s (producer_byte_rate)" in text and "234.4 KiB/s (240,000)" in text


def test_internal_names_and_topic_ids_are_said_plainly(proxy_page: str) -> None:
    text = text_of(proxy_page)
    for internal in (
        "hot_buckets",
        "pruned_buckets",
        "units",
        "replayed_rows",
        "topic_consumer",
        "entity_rates",
    ):
        assert internal not in text, internal
    assert "1 were replayed request by request (2,400 requests)" in text
    assert f"topic id {TOPIC_ID} (name not captured) partition 0" in text
    assert f"fetch topic id {TOPIC_ID} (name not captured)" in text  # the topics table
    assert re.search(rf"(?<!topic id ){TOPIC_ID}(?! \(name not captured\))", text) is None
    assert topic_label("orders") == "orders"
    assert topic_label("0d6a4c1e-7f00-4b8b-9a3e-2c1d5e6f7a8b").endswith("(name not captured)")
    assert "the default per user and client id" in text  # the KIP-55 level, not its number


def test_a_busy_capture_draws_every_plot_with_data() -> None:
    page = render_report(busy_tables(), "quotas: {}\n", {"records": 60_000})
    counts = figures(page)
    assert len(counts) >= 12 and min(counts) >= 2, counts  # bars: 2 at least, lines: 3 seconds
    text = text_of(page)
    assert "could not be drawn" not in text and ": left out" not in text and "too few for a chart" not in text


def test_crowded_tick_labels_are_thinned_until_none_overlap() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 2), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.barh(range(40), range(40))
    ax.set_yticks(range(40), [f"a long label for bar {i}" for i in range(40)])
    ax.set_xticks(range(40), [f"{i * 1000:,} B/s" for i in range(40)])
    assert label_overlaps(fig) > 0
    assert declutter(fig) > 0
    assert label_overlaps(fig) == 0
