"""Plain words and numbers for the report: formats, labels and what a quota or a value means.

The report says quotas, levels and evidence as an operator would; these functions are the one place
each phrase is made, so the tables, plots and sentences of every section read alike. No HTML here:
the strings are escaped where they go into the page (analytics/report_html.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import pandas as pd

from quota.keys import DEFAULT

TOP_ENTITIES = 15  # rows per table of top entities

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
    "max_throttle_ms": "longest throttle",
    "client_id_prefixes": "client-id prefix quotas",
    "join_group_rate": "new-member group joins/s",
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
    "request_timeout_ms": "clients' request timeout a throttle should not outlast (ms)",
    "poll_interval_ms": "consumers' poll interval (ms)",
    "bound_share": "share of throttles over the timeout that calls for a bound",
    "prefix_min_ids": "fewest client ids of a family",
    "prefix_churn": "a family churns when its ids live at most this share of the capture",
    "join_loop_min": "fewest new-member joins of a join loop",
    "join_loop_interval_s": "a join loop's longest median interval between joins (s)",
    "join_every_s": "join_group_rate proposed: one new-member join per this many seconds",
}

BYTE_QUOTAS = {k for k, words in QUOTA_WORDS.items() if "bytes/s" in words}

_TOPIC_ID = re.compile(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")

# --- formatting -------------------------------------------------------------------------------


def is_missing(value: Any) -> bool:
    """None, NaN or NA: a cell the job left empty, shown as nothing rather than 'nan'."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def fmt_bytes(value: Any, suffix: str = "B") -> str:
    """1536 -> '1.5 KiB' (binary units: quotas are set in bytes)."""
    if is_missing(value):
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
    if is_missing(value):
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
    if is_missing(value):
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
    return "" if is_missing(value) else fmt_ms(float(value) * 1000)


def fmt_time(ms: Any) -> str:
    if is_missing(ms):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(ms) / 1000.0))


def counted(n: Any, one: str, many: str | None = None) -> str:
    """'1 request', '3 requests': counts in sentences read as English."""
    word = one if not is_missing(n) and float(n) == 1 else (many or f"{one}s")
    return f"{fmt_num(n)} {word}"


def as_text(value: Any) -> str:
    """A cell as text, empty when missing."""
    return "" if is_missing(value) else str(value)


def find_col(df: pd.DataFrame, logical: str) -> str | None:
    """The name ``df`` has for a logical column (the job's own, or an older spelling)."""
    for name in _NAMES.get(logical, (logical,)):
        if name in df.columns:
            return name
    return None


def column_or(df: pd.DataFrame, name: str, default: Any = "") -> pd.Series:
    """A column, or ``default`` for every row when the table lacks it."""
    return df[name] if name in df.columns else pd.Series([default] * len(df), index=df.index)


def entity_label(user: Any, client_id: Any) -> str:
    """How an entity reads: 'alice', 'client app-1', or 'alice / app-1'."""
    u, c = as_text(user), as_text(client_id)
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
    t = as_text(topic)
    if not _TOPIC_ID.fullmatch(t):
        return t
    return f"topic id {t[:8] + '…' if short else t} (name not captured)"


def quota_words(key: Any) -> str:
    """'produce bytes/s (producer_byte_rate)': the plain words, and the key to find in quotas.yaml."""
    k = as_text(key)
    words = QUOTA_WORDS.get(k)
    return f"{words} ({k})" if words else k


def quota_value(key: Any, value: Any) -> str:
    """A quota value in the unit of its key, byte rates also as the number quotas.yaml holds."""
    if is_missing(value):
        return ""
    k = as_text(key)
    if k in BYTE_QUOTAS:
        return f"{fmt_rate(value)} ({fmt_num(value)})"
    if k == "controller_mutation_rate":
        return f"{fmt_num(value)} /s"
    if k == "producer_ids_rate":
        return f"{fmt_num(value)} ids/s"
    if k == "max_throttle_ms":
        return f"{fmt_ms(value)} ({fmt_num(value)})"
    if k == "join_group_rate":
        return f"{fmt_num(value)} /s (a join every {fmt_seconds(1 / float(value))})"
    return fmt_num(value)


def quota_level_words(value: Any) -> str:
    """The quota that applied to an entity (a KIP-55 level number, or an entity level's name)."""
    if is_missing(value) or as_text(value) == "":
        return ""
    try:
        return QUOTA_LEVEL_WORDS.get(int(value), as_text(value))
    except (TypeError, ValueError):
        return LEVEL_WORDS.get(as_text(value), as_text(value))


def applies_to(row: Mapping[str, Any]) -> str:
    """Who a proposed value is for, in words ('user etl, client id etl-bulk-loader')."""
    kind, level = as_text(row.get("kind")), as_text(row.get("level"))
    user, client, topic = as_text(row.get("user")), as_text(row.get("client_id")), as_text(row.get("topic"))
    if kind == "window" or level == "controller":
        return "the controller (every admin client)"
    if kind == "bound":
        return "every throttle (byte rates, strict mutations)"
    if kind == "prefix":
        return f"client ids starting {client} (one bucket together)" if client else "families of client ids"
    if as_text(row.get("key")) == "join_group_rate" and not (user or client):
        return "consumers joining their group again and again"
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
    key = as_text(row.get("key"))
    if not is_missing(row.get("requests")):
        # What was counted: new producer ids for their rate, mutation requests for the controller's.
        one, many = {
            "producer_ids_rate": ("new producer id", "new producer ids"),
            "controller_mutation_rate": ("mutation request", "mutation requests"),
            "controller_window.num": ("mutation request", "mutation requests"),
            "max_throttle_ms": ("throttle over the request timeout", "throttles over the request timeout"),
            "join_group_rate": ("new-member join", "new-member joins"),
        }.get(key, ("request", "requests"))
        parts.append(counted(row["requests"], one, many))
    many_entities = not is_missing(row.get("entities")) and float(row["entities"]) > 1
    if not is_missing(row.get("seconds")):
        if key == "join_group_rate":  # the span of the entity's joins
            parts.append(f"over {fmt_num(row['seconds'])} s")
        elif key not in BYTE_QUOTAS:  # rates of events: counted over the whole capture
            parts.append(f"over a {fmt_num(row['seconds'])} s capture")
        elif as_text(row.get("kind")) == "prefix":  # a family's seconds, its ids together
            parts.append(f"in {fmt_num(row['seconds'])} s of traffic together")
        elif many_entities:  # a default: the median entity's seconds
            parts.append(f"in a median {fmt_num(row['seconds'])} s of traffic each")
        else:
            parts.append(f"in {fmt_num(row['seconds'])} s of traffic")
    if not is_missing(row.get("entities")):
        level = as_text(row.get("level"))
        if level == "controller":  # the controller window rests on the admin clients' bursts
            parts.append(f"from {counted(row['entities'], 'admin client')}")
            return " ".join(parts)
        if level == "proxy":  # the bound rests on the clients throttled past their timeout
            parts.append(f"from {counted(row['entities'], 'client')}")
            return " ".join(parts)
        one, many = {"user-client": ("user and client-id pair", "user and client-id pairs")}.get(
            level, (LEVEL_WORDS.get(level, level or "entity"), LEVEL_PLURAL.get(level, "entities"))
        )
        if level == "topic":
            one, many = "topic", "topics"
        parts.append(f"from {counted(row['entities'], one, many)}")
    return " ".join(parts)
