"""From traffic statistics to a quota proposal the proxy loads as is (``quotas_file:``).

Byte rates (KIP-13: a default for everyone, overrides for the top outliers):

- At each entity level (user; client-id; (user, client-id)) and direction, entities are ranked by
  the p99 of their active seconds. The level's default is the p99 that ``coverage`` of them stay at
  or under (the k-th smallest, k = floor(coverage x n), at least 1) times ``headroom``, rounded up
  to 3 significant digits. An entity is *covered* when its p99 is at most the default.
- Only one default can apply (KIP-55 precedence: the most specific quota matching a request wins),
  so the default is written at one level, ``default_level`` (``user-client``: ``users.<default>
  .clients.<default>``, each (user, client-id) its own bucket; ``user``: ``users.<default>``;
  ``client``: ``clients.<default>``); the others are reported and named in the file's header.
- Overrides go to the ``top_k`` uncovered entities of each level, at their own p99 x headroom:
  (user, client-id) as ``users.U.clients.C`` (level 1), users as ``users.U`` (level 3; a shared
  bucket for the user's clients), client ids as ``clients.C`` (level 7) only when the default is
  at the client level (under a <default> user quota a client-id quota never applies). A user or
  client id whose pairs all have overrides already gets none; unless the default is at the user
  level, neither does a user with some overridden pairs (its total counts their traffic, so as a
  cap on its other clients it would be loose; they keep the default). ANONYMOUS is left out of the user
  level: it is every unauthenticated client together, not a tenant.

Topic-partition quotas (KIP-1010, per partition): topics are ranked by the largest p99 of their
partitions; ``topics.<default>`` and the top-k topic overrides follow the same rule.

``controller_mutation_rate`` (KIP-599's token bucket: rate R, burst num x size x R): admin entities
at the default level are ranked by their largest burst (mutations in any controller window); the
top ``1 - coverage`` are the abusive ones and do not shape the quota (they get the default and are
throttled). R is the well-behaved entities' peak sustained rate (most mutations in any 10 minutes,
per second) x headroom; the burst B is the most tokens any of them ever needed at rate R (the
largest backlog of a token bucket refilled at R over its per-second mutations), x headroom; the
controller window is ``ceil(B / R)`` 1-second samples (at least Kafka's 11, at most 1000, where R
is raised instead), so that num x size x R >= B admits their observed bursts without throttling.

``producer_ids_rate`` (KIP-936, per user): users are ranked by their peak hourly rate of new
producer ids; the <default> user gets the covered share's peak x headroom. No overrides: a storm
is what this quota is for.

The proxy's operator controls, ``max_throttle_ms`` and ``client_id_prefixes``, and its
consumer-group guard rail ``join_group_rate`` have rules of their own in
analytics/propose_controls.py (a bound when decided throttles outlast the clients' request
timeout; a shared bucket for a family of churning generated client ids; a rate of new-member
joins for a consumer caught in a join loop).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import yaml

from analytics.stats import FETCH, PRODUCE, Stats
from quota.config import CONFIG_VERSION, QuotaConfig, WindowConfig
from quota.entities import resolve
from quota.keys import (
    ANONYMOUS,
    CONSUMER_BYTE_RATE,
    CONTROLLER_MUTATION_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    PRODUCER_IDS_RATE,
    TOPIC_CONSUMER_BYTE_RATE,
    TOPIC_PRODUCER_BYTE_RATE,
)

DEFAULT_LEVELS = ("user-client", "user", "client")
MAX_WINDOW_NUM = 1000  # quota.config.WindowConfig.num's bound
_KAFKA_WINDOW = WindowConfig()
BYTE_KEYS = (
    (PRODUCER_BYTE_RATE, TOPIC_PRODUCER_BYTE_RATE, PRODUCE),
    (CONSUMER_BYTE_RATE, TOPIC_CONSUMER_BYTE_RATE, FETCH),
)
TABLE_COLUMNS = [
    "kind",
    "level",
    "user",
    "client_id",
    "topic",
    "key",
    "value",
    "observed",
    "basis",
    "requests",  # the evidence the value rests on: requests (new ids for producer_ids_rate),
    "seconds",  # seconds of traffic (the median entity's for a byte-rate default; the capture's
    # span for the rates of mutations and producer ids),
    "entities",  # and how many entities (topics for topic quotas)
    "written",
    "note",
]


@dataclass(frozen=True)
class ProposeOptions:
    coverage: float = 0.95
    headroom: float = 1.5
    top_k: int = 5
    default_level: str = "user-client"
    min_window_num: int = _KAFKA_WINDOW.num  # controller window: never shorter than Kafka's default
    # An override grants an outlier more than the default, but at most this many times it: a client
    # that runs flat out (no rate of its own, only what the cluster gives it) is held, not blessed.
    max_override_factor: float = 10.0
    # Evidence: a value resting on fewer requests (mutation requests, new producer ids), or on fewer
    # seconds of traffic than this many byte-rate quota windows (Kafka's 11 x 1 s), is not written.
    min_requests: int = 10
    min_windows: float = 3.0
    # max_throttle_ms (analytics/propose_controls.py): the clients' timeouts a throttle must not
    # outlast (Kafka's request.timeout.ms and max.poll.interval.ms defaults), and the share of
    # throttled requests decided over the request timeout that calls for a bound.
    request_timeout_ms: int = 30_000
    poll_interval_ms: int = 300_000
    bound_share: float = 0.01
    # client_id_prefixes: a family has at least this many generated client ids, and churns when
    # their median lifetime is at most this share of the capture span.
    prefix_min_ids: int = 5
    prefix_churn: float = 0.5
    # join_group_rate: a join loop is at least this many new-member joins of one entity at a
    # median interval of at most this many seconds; the rate proposed is one join per join_every_s.
    join_loop_min: int = 10
    join_loop_interval_s: float = 60.0
    join_every_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.coverage <= 1:
            raise ValueError("coverage must be in (0, 1]")
        if self.headroom < 1:
            raise ValueError("headroom must be at least 1")
        if self.max_override_factor < 1:
            raise ValueError("max-override-factor must be at least 1")
        if self.top_k < 0:
            raise ValueError("top-k must be 0 or more")
        if self.min_requests < 1 or self.min_windows < 0:
            raise ValueError("min-requests must be at least 1 and min-windows 0 or more")
        if self.request_timeout_ms < 1 or self.poll_interval_ms < 1:
            raise ValueError("request-timeout-ms and poll-interval-ms must be at least 1")
        if not 0 < self.bound_share <= 1 or not 0 < self.prefix_churn <= 1:
            raise ValueError("bound-share and prefix-churn must be in (0, 1]")
        if self.prefix_min_ids < 2:
            raise ValueError("prefix-min-ids must be at least 2")
        if self.join_loop_min < 2:
            raise ValueError("join-loop-min must be at least 2")
        if self.join_loop_interval_s <= 0 or self.join_every_s <= 0:
            raise ValueError("join-loop-interval-s and join-every-s must be above 0")
        if self.default_level not in DEFAULT_LEVELS:
            raise ValueError(f"default level must be one of {', '.join(DEFAULT_LEVELS)}")


@dataclass
class Proposal:
    quotas: dict[str, Any]  # the mapping under `quotas:`, as written
    config: QuotaConfig  # the same, validated as the proxy validates it
    table: pd.DataFrame  # one row per proposed value (written or not) and why
    yaml: str  # quotas.yaml, header comment included
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Evidence:
    """What a proposed value rests on; ``missing`` says why it is too little (empty: enough)."""

    requests: int | None
    seconds: int
    entities: int
    missing: str = ""

    @property
    def enough(self) -> bool:
        return not self.missing

    def columns(self) -> dict[str, Any]:
        return {"requests": self.requests, "seconds": self.seconds, "entities": self.entities}


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}" if n == 1 else f"{n:,} {thing}s"


def evidence(
    opts: ProposeOptions,
    seconds: float,
    entities: int,
    requests: float | None = None,
    what: str = "request",
    need_seconds: bool = True,
    need_requests: bool = True,
    median: bool = False,
) -> Evidence:
    """The evidence of a value and, when below ``opts``' thresholds, why it is too little;
    ``median``: ``seconds`` is the median entity's (a default rests on typical entities)."""
    window_s = _KAFKA_WINDOW.num * _KAFKA_WINDOW.size_seconds
    min_seconds = math.ceil(opts.min_windows * window_s)
    reqs = None if requests is None else int(requests)
    secs = int(seconds)
    short = []
    if need_requests and reqs is not None and reqs < opts.min_requests:
        short.append(f"{_count(reqs, what)}; at least {opts.min_requests} are needed")
    if need_seconds and secs < min_seconds:
        each = " per entity (median)" if median else ""
        short.append(
            f"{secs:,} s of traffic{each}; at least {min_seconds} s ({opts.min_windows:g} quota windows of"
            f" {window_s:g} s) are needed"
        )
    return Evidence(reqs, secs, entities, "only " + " and ".join(short) if short else "")


def nice_up(value: float, digits: int = 3) -> float:
    """Round up to ``digits`` significant digits (a quota must not end below what it covers)."""
    if value <= 0 or not math.isfinite(value):
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    out = math.ceil(value / step - 1e-9) * step
    return round(out, max(0, -math.floor(math.log10(step))))


def nice_bytes(value: float) -> int:
    return max(1, int(nice_up(value, 3)))


def cover(values: pd.Series, coverage: float) -> tuple[float, int, int]:
    """The value that floor(coverage x n) of ``values`` (at least one) are at or under; k; n."""
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    k = max(1, math.floor(coverage * n + 1e-9))
    return ordered[k - 1], k, n


class _Builder:
    """The quotas mapping and the table of proposals, built side by side."""

    def __init__(self) -> None:
        self.quotas: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []

    def set(self, path: tuple[str, ...], key: str, value: float) -> None:
        node = self.quotas
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value

    def row(self, **kw: Any) -> None:
        self.rows.append({c: kw.get(c) for c in TABLE_COLUMNS})


def _requests(ents: pd.DataFrame) -> int | None:
    """Requests behind these entity rows (None for tables from before the column existed)."""
    return int(ents["requests"].sum()) if "requests" in ents else None


def _requests_of(row: Any) -> int | None:
    value = getattr(row, "requests", None)
    return None if value is None or pd.isna(value) else int(value)


def _entity_path(level: str, user: str, client_id: str) -> tuple[str, ...]:
    if level == "user-client":
        return ("users", user, "clients", client_id)
    if level == "user":
        return ("users", user)
    return ("clients", client_id)


def _default_path(level: str) -> tuple[str, ...]:
    return _entity_path(level, DEFAULT, DEFAULT)


def _byte_rates(b: _Builder, stats: Stats, opts: ProposeOptions) -> dict[str, dict[str, int]]:
    """Defaults and overrides for producer_byte_rate and consumer_byte_rate; the defaults per level."""
    rates = stats.tables["entity_rates"]
    defaults: dict[str, dict[str, int]] = {}
    for key, _, direction in BYTE_KEYS:
        er = rates[rates["direction"] == direction]
        pair_rows = er[er["level"] == "user-client"]
        overridden: set[tuple[str, str]] = set()
        for level in ("user-client", "user", "client"):
            ents = er[er["level"] == level]
            if level == "user":
                ents = ents[ents["user"] != ANONYMOUS]
            if ents.empty:
                continue
            default = _byte_default(b, opts, key, level, ents)
            defaults.setdefault(level, {})[key] = default
            _byte_overrides(b, opts, key, level, ents, default, pair_rows, overridden)
    return defaults


def _byte_default(b: _Builder, opts: ProposeOptions, key: str, level: str, ents: pd.DataFrame) -> int:
    """The default of one level: the covered entities' p99 with headroom; written at the default
    level when the median entity's seconds are enough to rest on."""
    base, k, n = cover(ents["p99_bps"], opts.coverage)
    default = nice_bytes(base * opts.headroom)
    # A default rests on typical entities: the median entity's seconds must be enough.
    ev = evidence(opts, ents["active_s"].median(), n, _requests(ents), need_requests=False, median=True)
    written = level == opts.default_level and ev.enough
    if written:
        b.set(_default_path(level), key, default)
    note = "" if written else f"not set: the default is at the {opts.default_level} level"
    if level == opts.default_level and not ev.enough:
        note = ev.missing
    b.row(
        kind="default",
        level=level,
        user=DEFAULT if level != "client" else "",
        client_id=DEFAULT if level != "user" else "",
        key=key,
        value=default,
        observed=base,
        basis=f"p99 of {k}/{n} entities x {opts.headroom:g}",
        **ev.columns(),
        written=written,
        note=note,
    )
    return default


def _level_conflict(
    opts: ProposeOptions,
    level: str,
    user: str,
    client_id: str,
    pair_rows: pd.DataFrame,
    overridden: set[tuple[str, str]],
) -> str:
    """Why a user or client-id override would not be written given the pairs' overrides ('' if none)."""
    if level == "user":
        mine = [(user, c) in overridden for c in pair_rows[pair_rows["user"] == user]["client_id"]]
        if all(mine):
            return "its (user, client-id) pairs all have overrides"
        if any(mine) and opts.default_level != "user":
            # Its total includes the overridden pairs: as a cap on the others it would be loose.
            return "some of its (user, client-id) pairs have overrides"
    elif level == "client":
        pairs = pair_rows[pair_rows["client_id"] == client_id]
        if all((u, client_id) in overridden for u in pairs["user"]):
            return "its (user, client-id) pairs all have overrides"
        if opts.default_level != "client":
            return "client-id quotas never apply under a <default> user quota"
    return ""


def _byte_overrides(
    b: _Builder,
    opts: ProposeOptions,
    key: str,
    level: str,
    ents: pd.DataFrame,
    default: int,
    pair_rows: pd.DataFrame,
    overridden: set[tuple[str, str]],
) -> None:
    """Overrides for the entities of one level above its default, busiest first, at most top_k;
    (user, client-id) overrides written go into ``overridden`` for the levels after."""
    uncovered = ents[ents["p99_bps"] > default].sort_values("p99_bps", ascending=False)
    chosen = 0
    for r in uncovered.itertuples(index=False):
        user, client_id, p99 = str(r.user), str(r.client_id), float(r.p99_bps)
        value = nice_bytes(p99 * opts.headroom)
        note = ""
        cap = nice_bytes(default * opts.max_override_factor)
        if value > cap:
            value, note = cap, f"capped at {opts.max_override_factor:g} x the default"
        conflict = _level_conflict(opts, level, user, client_id, pair_rows, overridden)
        note, written = (conflict, False) if conflict else (note, True)
        ev = evidence(opts, float(r.active_s), 1, _requests_of(r), need_requests=False)
        if written and not ev.enough:
            note, written = ev.missing, False
        if written and chosen >= opts.top_k:
            note, written = f"beyond the top {opts.top_k}: held to the default", False
        if written:
            chosen += 1
            b.set(_entity_path(level, user, client_id), key, value)
            if level == "user-client":
                overridden.add((user, client_id))
        b.row(
            kind="override",
            level=level,
            user=user,
            client_id=client_id,
            key=key,
            value=value,
            observed=p99,
            basis=f"own p99 x {opts.headroom:g}",
            **ev.columns(),
            written=written,
            note=note,
        )


def _topics(b: _Builder, stats: Stats, opts: ProposeOptions) -> None:
    rates = stats.tables["topic_rates"]
    if rates.empty:
        return
    for _, alias, direction in BYTE_KEYS:
        tr = rates[rates["direction"] == direction]
        if tr.empty:
            continue
        base, k, n = cover(tr["partition_p99_max_bps"], opts.coverage)
        default = nice_bytes(base * opts.headroom)
        ev = evidence(opts, tr["active_s"].median(), n, median=True)
        if ev.enough:
            b.set(("topics", DEFAULT), alias, default)
        b.row(
            kind="default",
            level="topic",
            topic=DEFAULT,
            key=alias,
            value=default,
            observed=base,
            basis=f"largest partition p99 of {k}/{n} topics x {opts.headroom:g}",
            **ev.columns(),
            written=ev.enough,
            note=ev.missing,
        )
        uncovered = tr[tr["partition_p99_max_bps"] > default]
        uncovered = uncovered.sort_values("partition_p99_max_bps", ascending=False)
        chosen = 0
        for r in uncovered.itertuples(index=False):
            observed = float(r.partition_p99_max_bps)
            value = nice_bytes(observed * opts.headroom)
            ev = evidence(opts, float(r.active_s), 1)
            written = ev.enough and chosen < opts.top_k
            note = ev.missing or ("" if written else f"beyond the top {opts.top_k}: held to the default")
            if written:
                chosen += 1
                b.set(("topics", str(r.topic)), alias, value)
            b.row(
                kind="override",
                level="topic",
                topic=str(r.topic),
                key=alias,
                value=value,
                observed=observed,
                basis=f"largest partition p99 x {opts.headroom:g}",
                **ev.columns(),
                written=written,
                note=note,
            )


def token_backlog(seconds: list[int], mutations: list[int], rate: float) -> float:
    """The most tokens a bucket refilled at ``rate`` per second would have been short of.

    A bucket of burst B starting full admits these per-second mutations without a throttle when B
    is at least this (Kafka lets tokens go negative after a request and throttles the next one).
    """
    backlog = best = 0.0
    last: int | None = None
    for sec, m in zip(seconds, mutations, strict=True):
        if last is not None:
            backlog = max(0.0, backlog - rate * (sec - last))
        backlog += m
        best = max(best, backlog)
        last = sec
    return best


def _mutations(b: _Builder, stats: Stats, opts: ProposeOptions) -> None:
    ms = stats.tables["mutations"]
    level = opts.default_level
    ents = ms[ms["level"] == level] if not ms.empty else ms
    if level == "user" and not ents.empty:
        ents = ents[ents["user"] != ANONYMOUS]
    if ents.empty:
        b.row(
            kind="default",
            level=level,
            key=CONTROLLER_MUTATION_RATE,
            written=False,
            note="no partition mutations in the capture: no quota proposed",
        )
        return
    base, _, n = cover(ents["max_window"], opts.coverage)
    good = ents[ents["max_window"] <= base]
    rate = nice_up(float(good["peak_rate"].max()) * opts.headroom, 2)
    series = stats.tables["mutation_series"]
    series = series[series["level"] == level]
    need = 0.0
    for r in good.itertuples(index=False):
        s = series[(series["user"] == r.user) & (series["client_id"] == r.client_id)].sort_values("sec")
        need = max(need, token_backlog(s["sec"].tolist(), s["mutations"].tolist(), rate))
    burst = need * opts.headroom
    num = max(opts.min_window_num, math.ceil(burst / rate - 1e-9))
    if num > MAX_WINDOW_NUM:  # the window cannot grow further: a higher rate gives the burst instead
        num = MAX_WINDOW_NUM
        rate = nice_up(burst / num, 2)
    # A rate is mutations over time: it rests on the requests seen, over the whole capture.
    # The rate rests on the well-behaved entities' requests (the abusive ones do not shape it).
    ev = evidence(
        opts, stats.span_s, len(good), good["requests"].sum(), "mutation request", need_seconds=False
    )
    if ev.enough:
        b.set(_default_path(level), CONTROLLER_MUTATION_RATE, rate)
        b.quotas["controller_window"] = {"num": num, "size_seconds": 1.0}
    elif ev.requests:
        ev = Evidence(ev.requests, ev.seconds, ev.entities, f"{ev.missing} (in {stats.span_s:,} s)")
    b.row(
        kind="default",
        level=level,
        user=DEFAULT if level != "client" else "",
        client_id=DEFAULT if level != "user" else "",
        key=CONTROLLER_MUTATION_RATE,
        value=rate,
        observed=float(good["peak_rate"].max()),
        basis=f"peak 10-minute rate of {len(good)}/{n} well-behaved entities x {opts.headroom:g}",
        **ev.columns(),
        written=ev.enough,
        note=f"burst {num} x 1 s x {rate:g} = {num * rate:g} >= {burst:.0f} needed"
        if ev.enough
        else ev.missing,
    )
    b.row(
        kind="window",
        level="controller",
        key="controller_window.num",
        value=num,
        observed=need,
        basis=f"largest token backlog at rate {rate:g} x {opts.headroom:g} / rate",
        **ev.columns(),
        written=ev.enough,
        note="" if ev.enough else "goes with controller_mutation_rate, which is not written",
    )
    for r in ents[ents["max_window"] > base].itertuples(index=False):
        b.row(
            kind="excluded",
            level=level,
            user=str(r.user),
            client_id=str(r.client_id),
            key=CONTROLLER_MUTATION_RATE,
            observed=float(r.max_window),
            basis=f"burst of {int(r.max_window)} mutations above the covered {base:.0f}",
            written=False,
            note="abusive: held to the default" if ev.enough else "abusive; no default is written",
        )


def _producer_ids(b: _Builder, stats: Stats, opts: ProposeOptions) -> None:
    users = stats.tables["producer_ids"]
    if users.empty:
        b.row(
            kind="default",
            level="user",
            key=PRODUCER_IDS_RATE,
            written=False,
            note="no producer ids in the capture: no quota proposed",
        )
        return
    base, k, n = cover(users["peak_ids_per_s"], opts.coverage)
    rate = nice_up(base * opts.headroom, 2)
    covered = users[users["peak_ids_per_s"] <= base]  # a storm's ids do not shape the default
    ev = evidence(opts, stats.span_s, k, covered["new_ids"].sum(), "new producer id", need_seconds=False)
    if ev.enough:
        b.set(("users", DEFAULT), PRODUCER_IDS_RATE, rate)
    b.row(
        kind="default",
        level="user",
        user=DEFAULT,
        key=PRODUCER_IDS_RATE,
        value=rate,
        observed=base,
        basis=f"peak hourly new ids/s of {k}/{n} users x {opts.headroom:g}",
        **ev.columns(),
        written=ev.enough,
        note=ev.missing,
    )
    for r in users[users["peak_ids_per_s"] > rate].itertuples(index=False):
        b.row(
            kind="excluded",
            level="user",
            user=str(r.user),
            key=PRODUCER_IDS_RATE,
            observed=float(r.peak_ids_per_s),
            basis=f"{int(r.max_new_per_hour)} new ids in its peak hour",
            written=False,
            note="above the default: would be throttled",
        )


def _ordered(quotas: dict[str, Any]) -> dict[str, Any]:
    """Readable order: settings first (controller window, bound), then users, clients, client-id
    prefixes, topics; <default> first in each."""

    def entities(d: dict[str, Any]) -> dict[str, Any]:
        out = {k: d[k] for k in sorted(d, key=lambda k: (k != DEFAULT, k))}
        for k, v in out.items():
            if isinstance(v, dict) and "clients" in v:
                v = dict(v)
                v["clients"] = entities(v.pop("clients"))
                out[k] = v
        return out

    out: dict[str, Any] = {}
    for key in ("controller_window", "max_throttle_ms", "users", "clients", "client_id_prefixes", "topics"):
        if key in quotas:
            grouped = key in ("users", "clients", "client_id_prefixes", "topics")
            out[key] = entities(quotas[key]) if grouped else quotas[key]
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:g}"


def _too_little(rows: list[dict[str, Any]]) -> list[str]:
    """Header lines for the values left out for lack of evidence."""
    out = []
    for r in rows:
        if not r["written"] and str(r["note"] or "").startswith("only "):
            who = "/".join(str(r[c]) for c in ("user", "client_id", "topic") if r[c]) or r["level"]
            out.append(f"  {r['key']} ({r['kind']}, {who}): {r['note']}")
    return out


def _header(
    stats: Stats,
    opts: ProposeOptions,
    defaults: dict[str, dict[str, int]],
    source: str,
    rows: list[dict[str, Any]],
) -> str:
    start = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(stats.start_s))
    end = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(stats.end_s + 1))
    lines = [
        "kthrottle quotas proposed by `kthrottle tune` (analytics/tune.py), "
        + time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        f"from {stats.records:,} capture records, {start} to {end} ({stats.span_s:,} s), input: {source}",
        f"Byte-rate defaults: the p99 1-second rate {opts.coverage:.0%} of entities stay under"
        f" x {opts.headroom:g} headroom, at the {opts.default_level} level;",
        f"overrides for the top {opts.top_k} outliers of each level at their own p99 x {opts.headroom:g}.",
    ]
    others = [
        lvl for lvl in ("user-client", "user", "client") if lvl != opts.default_level and lvl in defaults
    ]
    if others:
        lines.append(
            "Not set (KIP-55: only the most specific default applies), the defaults of the other levels:"
        )
        lines += [
            f"  {lvl}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in defaults[lvl].items()) for lvl in others
        ]
    from analytics.propose_controls import header_lines  # it builds on this module

    lines += header_lines(rows)
    left_out = _too_little(rows)
    if left_out:
        lines.append("Not written, too little evidence to rest a quota on:")
        lines += left_out
    lines += [
        "controller_mutation_rate: token bucket of burst controller_window.num x size x rate, sized to admit",
        "the observed bursts of well-behaved admin clients; producer_ids_rate: new producer ids per second.",
        "Review, then load it with `quotas_file: quotas.yaml` in the proxy config (hot-reloaded).",
    ]
    return "".join(f"# {line}\n" for line in lines)


def _annotate(stats: Stats, cfg: QuotaConfig, opts: ProposeOptions) -> None:
    """Add what the proposal means for each entity to the stats tables (for the report)."""
    er = stats.tables["entity_rates"]
    quota: list[float | None] = []
    level: list[int | None] = []
    for r in er.itertuples(index=False):
        match = None
        if r.level == "user-client":
            key = PRODUCER_BYTE_RATE if r.direction == PRODUCE else CONSUMER_BYTE_RATE
            match = resolve(cfg, str(r.user), str(r.client_id), key)
        quota.append(match.quota if match else None)
        level.append(match.level if match else None)
    er["quota_bps"] = pd.array(quota, dtype="Float64")
    er["quota_level"] = pd.array(level, dtype="Int64")
    ms = stats.tables["mutations"]
    if not ms.empty:
        well = pd.Series(True, index=ms.index)
        for _, ents in ms.groupby("level"):
            base, _, _ = cover(ents["max_window"], opts.coverage)
            well[ents.index] = ents["max_window"] <= base
        ms["well_behaved"] = well
    users = stats.tables["producer_ids"]
    if not users.empty:
        default = cfg.users.get(DEFAULT)
        limit = default.producer_ids_rate if default else None
        users["over_quota"] = users["peak_ids_per_s"] > limit if limit else False


def propose(stats: Stats, opts: ProposeOptions | None = None, source: str = "") -> Proposal:
    """The proposal for these statistics; also annotates the stats tables with its effect."""
    from analytics.propose_controls import propose_controls  # it builds on this module

    opts = opts or ProposeOptions()
    b = _Builder()
    defaults = _byte_rates(b, stats, opts)
    _topics(b, stats, opts)
    _mutations(b, stats, opts)
    _producer_ids(b, stats, opts)
    propose_controls(b, stats, opts, defaults)
    quotas = _ordered(b.quotas)
    cfg = QuotaConfig.model_validate(quotas)
    body = yaml.safe_dump(
        {"config_version": CONFIG_VERSION, "quotas": quotas},
        sort_keys=False,
        default_flow_style=None,
        width=110,
    )
    text = _header(stats, opts, defaults, source, b.rows) + body
    table = pd.DataFrame(b.rows, columns=TABLE_COLUMNS)
    for column in ("requests", "seconds", "entities"):  # counts, blank where not counted (not 240.0)
        table[column] = table[column].astype("Int64")
    _annotate(stats, cfg, opts)
    return Proposal(quotas=quotas, config=cfg, table=table, yaml=text)
