"""Proposals for the proxy's operator controls, from the capture's evidence (policy; no Spark).

``max_throttle_ms`` (docs/quotas.md, bounded throttles): a Kafka client gives up on a request
after ``request.timeout.ms`` (30 s for the Java producer and consumer), and a consumer that has
not polled for ``max.poll.interval.ms`` (300 s) leaves its group; Kafka's byte-rate throttles have
no bound. The decided throttles of Produce and Fetch (``throttle_times``, analytics/
stats_controls.py) call for one when at least ``bound_share`` of the throttled requests were
decided over ``request_timeout_ms``, or any fetch over ``poll_interval_ms``, resting on at least
``min_requests`` throttles over the timeout. The bound is ``request_timeout_ms / headroom``
rounded down to 2 significant digits (20 s for 30 s and 1.5), never below one byte-rate quota
window (11 s): a shorter bound protects no timeout further and only brings throttled clients
back sooner to owe again. Otherwise nothing is written, and the row says what was seen.

``client_id_prefixes`` (docs/quotas.md, groups and prefixes): a family of client ids generated
per process (``client_families``) gets one shared bucket when it has at least ``prefix_min_ids``
ids and they churn: their median lifetime is at most ``prefix_churn`` of the capture span
(stable replicas, ``worker-1`` ... ``worker-6``, keep a bucket each). Its byte rates are derived
as an override's (analytics/propose.py): the family's own p99 (the bytes per second of all its
ids together) x ``headroom``, rounded up, capped at ``max_override_factor`` x the client-id
default. Other client ids the prefix would take in (``app-admin``) are named in its row: their
bytes are not in that p99. A prefix is matched at the client-id level (7), after any <default>
user quota, so it is written only when ``default_level`` is client; once written, its members'
own overrides are retracted (their rows say so): an exact client-id or (user, client-id) entry
comes first and would give a member a full bucket of its own again.

``join_group_rate`` (docs/quotas.md, consumer-group guard rails): a consumer that crash-loops
joins its group as a new member on every start, from a new connection, and every join
rebalances the group. An entity is in a *join loop* when ``group_joins`` (analytics/
stats_controls.py) shows at least ``join_loop_min`` new-member joins at a median interval of at
most ``join_loop_interval_s``; it gets ``join_group_rate``, one join per ``join_every_s`` (120 s:
0.0083, rounded to 2 significant digits): a healthy consumer joins once per start, far less
often, and the loop is held to it (a loop whose median interval is longer than one join at that
rate would not be: its note says so). Placed as a byte-rate override is (analytics/propose.py):
the client id (``clients.C``, level 7, one bucket for the id across users) with ``default_level``
client, else the (user, client-id) pair (``users.U.clients.C``, level 1). The entities of at
least two joins that are no loop are listed, each with why, in a row that is not written.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from analytics.propose import (
    BYTE_KEYS,
    ProposeOptions,
    _Builder,
    _count,
    _entity_path,
    _fmt,
    evidence,
    nice_bytes,
)
from analytics.stats import FETCH, Stats
from analytics.stats_controls import JOIN_COLUMNS, stem, step_percentile
from quota.config import WindowConfig
from quota.keys import JOIN_GROUP_RATE

if TYPE_CHECKING:
    from collections.abc import Iterable

MAX_THROTTLE_MS = "max_throttle_ms"
PREFIXES = "client_id_prefixes"
TOP_LISTED = 5  # entities named in the row of those with no join loop
WINDOW_MS = int(WindowConfig().num * WindowConfig().size_seconds * 1000)  # the proposal keeps Kafka's


def nice_down(value: float, digits: int = 2) -> int:
    """Round down to ``digits`` significant digits (a bound must not end above what it protects)."""
    if value < 1 or not math.isfinite(value):
        return 0
    step = 10 ** max(0, math.floor(math.log10(value)) - digits + 1)
    return int(math.floor(value / step + 1e-9) * step)


def bound_value(opts: ProposeOptions) -> int:
    """The proposed max_throttle_ms: the request timeout with headroom, at least one quota window."""
    return max(WINDOW_MS, nice_down(opts.request_timeout_ms / opts.headroom))


# --- max_throttle_ms -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throttles:
    """What the decided throttles of a capture say about a bound (times in ms, to a step)."""

    requests: int  # Produce and Fetch requests decided a throttle
    over_timeout: int  # of those, decided over the request timeout
    fetches_over_poll: int  # fetches decided over the poll interval
    entities_over: int  # (user, client-id) entities with a throttle over the timeout
    p50_ms: int
    p99_ms: int
    longest_ms: int

    @property
    def share(self) -> float:
        return self.over_timeout / self.requests if self.requests else 0.0


def throttles(times: pd.DataFrame, opts: ProposeOptions) -> Throttles:
    """The ``throttle_times`` table read against the clients' timeouts in ``opts``."""
    both = times.groupby("throttle_ms", as_index=False)["requests"].sum().sort_values("throttle_ms")
    over = times[times["throttle_ms"] > opts.request_timeout_ms]
    poll = times[(times["direction"] == FETCH) & (times["throttle_ms"] > opts.poll_interval_ms)]
    return Throttles(
        int(both["requests"].sum()),
        int(over["requests"].sum()),
        int(poll["requests"].sum()),
        int(over["longest_for"].sum()),
        step_percentile(both["throttle_ms"], both["requests"], 0.5),
        step_percentile(both["throttle_ms"], both["requests"], 0.99),
        int(both["throttle_ms"].max()),
    )


def _seen(t: Throttles, opts: ProposeOptions) -> str:
    poll = f"{t.fetches_over_poll:,} fetches over the {opts.poll_interval_ms / 1000:g} s poll interval"
    return (
        f"{t.share:.1%} ({t.over_timeout:,}) of {t.requests:,} throttled requests decided over the"
        f" {opts.request_timeout_ms / 1000:g} s request timeout, {poll};"
        f" p50 {t.p50_ms:,} ms, p99 {t.p99_ms:,} ms, longest {t.longest_ms:,} ms"
    )


def _bound(b: _Builder, stats: Stats, opts: ProposeOptions) -> None:
    """max_throttle_ms when the decided throttles would park clients past their timeouts."""
    times = stats.tables.get("throttle_times")
    value = bound_value(opts)
    basis = (
        f"request timeout {opts.request_timeout_ms:,} ms / {opts.headroom:g}, rounded down;"
        f" at least one {WINDOW_MS / 1000:g} s quota window"
    )
    if times is None or times.empty or int(times["requests"].sum()) == 0:
        b.row(
            kind="bound",
            level="proxy",
            key=MAX_THROTTLE_MS,
            value=value,
            basis=basis,
            written=False,
            note="not needed: no Produce or Fetch throttle decided in the capture",
        )
        return
    t = throttles(times, opts)
    needed = t.share >= opts.bound_share or t.fetches_over_poll > 0
    ev = evidence(opts, stats.span_s, t.entities_over, t.over_timeout, "long throttle", need_seconds=False)
    written = needed and ev.enough
    if written:
        b.quotas[MAX_THROTTLE_MS] = value
        note = f"{_seen(t, opts)}: unbounded, they would time out (what the bound leaves is carried over)"
    elif needed:
        note = f"{ev.missing} ({_seen(t, opts)})"
    else:
        note = f"not needed: {_seen(t, opts)} (a bound from {opts.bound_share:.0%} over the timeout)"
    b.row(
        kind="bound",
        level="proxy",
        key=MAX_THROTTLE_MS,
        value=value,
        observed=t.p99_ms,
        basis=basis,
        **ev.columns(),
        written=written,
        note=note,
    )


# --- client_id_prefixes ----------------------------------------------------------------------------


def _others(b: _Builder, stats: Stats, prefix: str, direction: str, key: str) -> list[str]:
    """Client ids of the capture the prefix would also take in, not of its family (``app-admin``
    for ``app-``; a longer family's not written): their bytes are not in its p99. An id with a
    client-id quota of its own is left out: the exact entry comes first."""
    rates = stats.tables["entity_rates"]
    ids = rates[(rates["level"] == "client") & (rates["direction"] == direction)]["client_id"]
    longer = [p for p in b.quotas.get(PREFIXES, {}) if len(p) > len(prefix)]
    own = {c for c, q in b.quotas.get("clients", {}).items() if key in q}
    return sorted(
        c
        for c in map(str, ids)
        if c.startswith(prefix)
        and stem(c) != prefix
        and c not in own
        and not any(c.startswith(p) for p in longer)
    )


def _describe(b: _Builder, stats: Stats, r: Any, key: str) -> str:
    """A family in words: its ids, how many at once, how long each lived, who else it takes in."""
    out = (
        f"{int(r.client_ids):,} generated client ids, at most {int(r.peak_ids):,} at once,"
        f" median lifetime {float(r.median_life_s):g} s of a {stats.span_s:,} s capture"
    )
    others = _others(b, stats, str(r.prefix), str(r.direction), key)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        out += f"; it would also take in {_count(len(others), 'other client id')} ({shown})"
    return out


def _refusal(r: Any, span_s: int, opts: ProposeOptions) -> str:
    """Why a family gets no shared bucket ('' when it should have one)."""
    if float(r.median_life_s) > opts.prefix_churn * span_s:
        return f"its ids stay (a family churns when they live at most {opts.prefix_churn:.0%} of the capture)"
    if opts.default_level != "client":
        return (
            f"client-id prefixes never apply under a <default> user quota (the default is at the"
            f" {opts.default_level} level; --default-level client)"
        )
    return ""


def _unset(quotas: dict[str, Any], path: tuple[str, ...], key: str) -> None:
    """Drop ``key`` at ``path``, and the mappings that leaves empty."""
    nodes = [quotas]
    for part in path:
        nodes.append(nodes[-1][part])
    del nodes[-1][key]
    for parent, part, node in reversed(list(zip(nodes[:-1], path, nodes[1:], strict=True))):
        if node:
            break
        del parent[part]


def _retract(b: _Builder, prefix: str, key: str) -> int:
    """Members' own overrides of ``key`` taken out: the family's bucket holds them. How many."""
    retracted = 0
    for row in b.rows:
        cid = str(row["client_id"] or "")
        if row["kind"] != "override" or not row["written"] or row["key"] != key or stem(cid) != prefix:
            continue
        if row["level"] not in ("client", "user-client"):
            continue
        path = ("clients", cid) if row["level"] == "client" else ("users", str(row["user"]), "clients", cid)
        _unset(b.quotas, path, key)
        row["written"] = False
        row["note"] = f"shares the bucket of client_id_prefixes {prefix}"
        retracted += 1
    return retracted


def _prefix(b: _Builder, stats: Stats, opts: ProposeOptions, r: Any, key: str, default: int | None) -> None:
    """One family's byte rate of one direction: written, or the row says why not."""
    p99 = float(r.p99_bps)
    value = nice_bytes(p99 * opts.headroom)
    extra = ""
    if default and value > nice_bytes(default * opts.max_override_factor):
        value = nice_bytes(default * opts.max_override_factor)
        extra = f"; capped at {opts.max_override_factor:g} x the client-id default"
    ev = evidence(opts, float(r.active_s), int(r.client_ids), int(r.requests), need_requests=False)
    why_not = _refusal(r, stats.span_s, opts) or ev.missing
    if not why_not:
        b.set((PREFIXES, str(r.prefix)), key, value)
        retracted = _retract(b, str(r.prefix), key)
        if retracted:
            extra += f"; replaces {retracted} of its ids' own overrides"
    family = _describe(b, stats, r, key)
    b.row(
        kind="prefix",
        level="client",
        client_id=str(r.prefix),
        key=key,
        value=value,
        observed=p99,
        basis=f"the family's p99 (its ids together) x {opts.headroom:g}",
        **ev.columns(),
        written=not why_not,
        note=f"{why_not}; {family}" if why_not else f"one bucket for {family}{extra}",
    )


def _prefixes(b: _Builder, stats: Stats, opts: ProposeOptions, defaults: dict[str, int]) -> None:
    """client_id_prefixes for the families with enough ids; the longest prefixes first, so a
    member's override is retracted by the prefix the proxy would match it to."""
    fams = stats.tables.get("client_families")
    if fams is not None and not fams.empty:
        fams = fams[fams["client_ids"] >= opts.prefix_min_ids]
    if fams is None or fams.empty:
        b.row(
            kind="prefix",
            level="client",
            key=PREFIXES,
            written=False,
            note=f"not needed: no family of {opts.prefix_min_ids} or more client ids told apart only by a"
            " generated suffix (app-7f9c1a, app-0b31e2)",
        )
        return
    order = sorted(set(fams["prefix"]), key=lambda p: (-len(p), p))
    for prefix in order:
        rows = fams[fams["prefix"] == prefix]
        for key, _, direction in BYTE_KEYS:
            for r in rows[rows["direction"] == direction].itertuples(index=False):
                _prefix(b, stats, opts, r, key, defaults.get(key))


# --- join_group_rate -------------------------------------------------------------------------------


def join_rate(opts: ProposeOptions) -> float:
    """The proposed join_group_rate: one new-member join per ``join_every_s``, 2 significant digits."""
    return float(f"{1 / opts.join_every_s:.2g}")


def join_level(opts: ProposeOptions) -> str:
    """Where join_group_rate goes: as a byte-rate override, the client id only when the defaults
    are at the client level, else the (user, client-id) pair."""
    return "client" if opts.default_level == "client" else "user-client"


def _who(r: Any) -> str:
    return f"{r.user}/{r.client_id}" if r.user else str(r.client_id)


def _utc(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))


def _joined(r: Any) -> str:
    """An entity's joins in words: how many, when, how fast."""
    interval = float(r.median_interval_s)
    return (
        f"{_count(int(r.joins), 'new-member join')} (one per connection) from {_utc(int(r.first_ms))}"
        f" to {_utc(int(r.last_ms))} ({_fmt(float(r.span_s))} s), at most {int(r.peak_per_min):,} in a"
        f" minute" + (f", median interval {_fmt(interval)} s" if not math.isnan(interval) else "")
    )


def _no_loop(r: Any, opts: ProposeOptions) -> str:
    """Why an entity's joins are no join loop ('' when they are one)."""
    if int(r.joins) < opts.join_loop_min:
        return f"fewer than {opts.join_loop_min} joins"
    if float(r.median_interval_s) > opts.join_loop_interval_s:
        return f"a median interval over {opts.join_loop_interval_s:g} s"
    return ""


def _loop(b: _Builder, opts: ProposeOptions, r: Any, basis: str) -> None:
    """join_group_rate for one entity in a join loop, written, with its evidence."""
    value = join_rate(opts)
    b.set(_entity_path(str(r.level), str(r.user), str(r.client_id)), JOIN_GROUP_RATE, value)
    note = f"join loop: {_joined(r)}"
    if float(r.median_interval_s) * value >= 1:  # a join per interval passes a bucket of this rate
        note += (
            f"; at its median interval the rate would not hold it back (a join every {1 / value:.3g} s"
            f" passes): a --join-every-s over {_fmt(float(r.median_interval_s))} would"
        )
    b.row(
        kind="override",
        level=str(r.level),
        user=str(r.user),
        client_id=str(r.client_id),
        key=JOIN_GROUP_RATE,
        value=value,
        observed=int(r.peak_per_min),
        basis=basis,
        requests=int(r.joins),
        seconds=int(r.span_s),
        entities=1,
        written=True,
        note=note,
    )


def _not_loops(
    b: _Builder, opts: ProposeOptions, level: str, others: pd.DataFrame, loops: int, joined: bool
) -> None:
    """The row that says why no other entity gets join_group_rate: those of at least two joins,
    the most joins first, each with why it is no loop (at most ``TOP_LISTED``)."""
    shown = [f"{_who(r)}: {_joined(r)}, {_no_loop(r, opts)}" for r in others.head(TOP_LISTED).itertuples()]
    if len(others) > TOP_LISTED:
        shown.append(f"and {_count(len(others) - TOP_LISTED, 'other')}")
    rule = (
        f"{opts.join_loop_min} or more new-member joins of one entity at a median interval of at"
        f" most {opts.join_loop_interval_s:g} s"
    )
    head = f"no join loop for any other entity ({rule})" if loops else f"not needed: no join loop ({rule})"
    none = "no entity has 2 new-member joins or more" if joined else "no JoinGroup in the capture"
    seen = "; ".join(shown) if shown else none
    b.row(
        kind="override",
        level=level,
        key=JOIN_GROUP_RATE,
        value=join_rate(opts),
        entities=len(others),
        written=False,
        note=f"{head}: {seen}",
    )


def _joins(b: _Builder, stats: Stats, opts: ProposeOptions) -> None:
    """join_group_rate for the entities in a join loop; a row for the others of two joins or more."""
    joins = stats.tables.get("group_joins")
    level = join_level(opts)
    if joins is None:
        joins = pd.DataFrame(columns=JOIN_COLUMNS)
    at_level = joins[joins["level"] == level]
    ents = at_level[at_level["joins"] >= 2]
    ents = ents.sort_values(["joins", "user", "client_id"], ascending=[False, True, True])
    is_loop = pd.Series([not _no_loop(r, opts) for r in ents.itertuples()], index=ents.index, dtype=bool)
    loops, others = ents[is_loop], ents[~is_loop]
    basis = (
        f"a join loop ({opts.join_loop_min}+ new-member joins, median interval at most"
        f" {opts.join_loop_interval_s:g} s): one join per {opts.join_every_s:g} s, to 2 significant digits"
    )
    for r in loops.itertuples():
        _loop(b, opts, r, basis)
    if loops.empty or not others.empty:
        _not_loops(b, opts, level, others, len(loops), not at_level.empty)


def propose_controls(
    b: _Builder, stats: Stats, opts: ProposeOptions, defaults: dict[str, dict[str, int]]
) -> None:
    """The controls and the join guard rail into the builder; ``defaults``: the byte-rate
    defaults per level (propose.py)."""
    _prefixes(b, stats, opts, defaults.get("client", {}))
    _bound(b, stats, opts)
    _joins(b, stats, opts)


def header_lines(rows: Iterable[dict[str, Any]]) -> list[str]:
    """quotas.yaml header lines for the controls written, each with its reason."""
    out = []
    for r in rows:
        if r["written"] and r["kind"] == "bound":
            out.append(f"max_throttle_ms: {r['note']}.")
        elif r["written"] and r["kind"] == "prefix":
            out.append(f"client_id_prefixes {r['client_id']} ({r['key']}): {r['note']}.")
        elif r["written"] and r["key"] == JOIN_GROUP_RATE:
            who = "/".join(str(r[c]) for c in ("user", "client_id") if r[c])
            out.append(f"join_group_rate {r['value']:g} ({who}): {r['note']}.")
    return out
