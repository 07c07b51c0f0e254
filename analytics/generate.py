"""Synthetic capture files with realistic shapes and planted outliers, for tests and scale runs.

The traffic is what a shared cluster looks like through the proxy: many steady produce and fetch
clients (service users with a few client ids each, and ANONYMOUS ones), a few heavy outliers whose
ids are known, well-behaved admin clients creating topics now and then, one abusive admin client
creating hundreds of partitions a minute in bursts, and one user whose short-lived producers bring a
new producer id with every Produce request (a producer-id storm). The planted facts come back as a
``GeneratedTruth`` (also written as ``truth.json`` next to the files), so tests can check that the
tuning job finds them.

Everything is vectorised with numpy and written with pyarrow, one time slice per file, so memory
stays at one file's worth and 10M records take seconds, not minutes. Same seed, same files.

CLI: ``python -m analytics.generate --records N --output DIR [--seed S] [--span-s 3600]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

if not __package__:  # run as a plain script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quota.capture_schema import FIELD_NAMES, arrow_schema
from quota.keys import ANONYMOUS

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DEFAULT_ROWS_PER_FILE = 1_000_000
ROW_GROUP_ROWS = 256 * 1024  # several row groups per file: Spark can split files across cores

# API keys and the versions the generator gives them (recent clients).
PRODUCE, FETCH, OFFSET_COMMIT, METADATA, FIND_COORDINATOR, HEARTBEAT = 0, 1, 8, 3, 10, 12
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID, DESCRIBE_CONFIGS = 18, 19, 20, 22, 32
VERSIONS = {0: 9, 1: 13, 3: 12, 8: 8, 10: 4, 12: 4, 18: 3, 19: 7, 20: 6, 22: 4, 32: 4}
TOPIC_ALREADY_EXISTS = 36

STEADY_PRODUCE_BYTES = 8 * 1024  # median payload of a steady client's Produce request
STEADY_FETCH_BYTES = 16 * 1024  # median payload of a steady client's non-empty Fetch response


@dataclass
class GeneratedTruth:
    """What was planted, by entity: the tuning job should find exactly these."""

    records: int
    files: list[str]
    start_ms: int
    end_ms: int
    seed: int
    heavy_producers: list[tuple[str, str]]  # (user, client-id) far above everyone's produce rate
    heavy_consumers: list[tuple[str, str]]  # (user, client-id) far above everyone's fetch rate
    heavy_users: list[str]  # users heavy in total (many normal clients), produce
    hot_topics_produce: list[str]
    hot_topics_fetch: list[str]
    steady_pairs: list[tuple[str, str]]  # ordinary produce/fetch clients: the default must cover them
    steady_users: list[str]
    admin_clients: list[tuple[str, str]]  # well-behaved CreateTopics/DeleteTopics clients
    abusive_admin: tuple[str, str]  # creates partitions in long bursts
    storm_user: str  # brings a new producer id with every Produce
    storm_client: str
    counts: dict[str, int] = field(default_factory=dict)  # records per role

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> GeneratedTruth:
        data = json.loads(text)
        for key in ("heavy_producers", "heavy_consumers", "steady_pairs", "admin_clients"):
            data[key] = [tuple(p) for p in data[key]]
        data["abusive_admin"] = tuple(data["abusive_admin"])
        return cls(**data)


@dataclass
class _Actor:
    """One client instance: who it is, what it sends, how much and when."""

    user: str
    client_id: str
    role: str  # producer | consumer | storm | admin | abuser
    weight: float = 1.0  # share of the data requests
    payload: float = STEADY_PRODUCE_BYTES  # median payload bytes per Produce / Fetch
    topics: tuple[str, ...] = ()
    idempotent: bool = True
    pid_lifetime_s: float = 3600.0
    throttle_share: float = 0.0  # share of its produce/fetch requests the proxy throttled
    # filled in by the generator
    index: int = 0
    counts: np.ndarray | None = None  # requests per second of the span
    seq: int = 0  # requests generated so far (producer-id sequences run across files)


SERVICES = (
    "orders",
    "payments",
    "inventory",
    "shipping",
    "billing",
    "search",
    "accounts",
    "notifications",
    "fraud",
    "pricing",
    "catalog",
    "reviews",
    "ledger",
    "audit",
    "metrics",
    "recommendations",
    "checkout",
    "cart",
    "returns",
    "loyalty",
    "promotions",
    "tax",
    "invoicing",
    "identity",
    "sessions",
    "geo",
    "media",
    "thumbnails",
    "email",
    "sms",
    "webhooks",
    "scheduler",
    "reporting-api",
    "partners",
    "warehouse",
    "fleet",
    "support",
    "chat",
    "feeds",
    "ads",
)


def _spread(rng: np.random.Generator, sigma: float = 0.22) -> float:
    """A lognormal factor around 1: steady clients differ a little from each other."""
    return float(math.exp(rng.normal(0.0, sigma)))


def _topic_sizes(rng: np.random.Generator) -> dict[str, int]:
    """Partitions per topic: one topic per service, and the planted actors' own topics."""
    topics: dict[str, int] = {}
    for name in SERVICES:
        topics[name] = int(rng.choice([6, 12, 24]))
    topics.update({"clickstream": 6, "mirror-in": 4, "events-archive": 8, "reports": 24, "storm-events": 3})
    topics.update({"logs": 12, "connect-offsets": 25})
    return topics


def _service_actors(rng: np.random.Generator) -> list[_Actor]:
    """Each service user: one or two producers into its topic, one or two consumers of others."""
    actors: list[_Actor] = []
    svc_names = list(SERVICES)
    for name in SERVICES:
        user = f"svc-{name}"
        producers = 1 + int(rng.random() < 0.3)
        consumers = 1 + int(rng.random() < 0.3)
        for i in range(producers):
            actors.append(
                _Actor(
                    user,
                    f"{name}-producer-{i + 1}",
                    "producer",
                    _spread(rng),
                    STEADY_PRODUCE_BYTES * _spread(rng),
                    (name,),
                    idempotent=bool(rng.random() < 0.8),
                    pid_lifetime_s=float(rng.uniform(1200, 5400)),
                )
            )
        for i in range(consumers):
            read = tuple(str(t) for t in rng.choice(svc_names, size=int(rng.integers(1, 3)), replace=False))
            actors.append(
                _Actor(
                    user,
                    f"{name}-consumer-{i + 1}",
                    "consumer",
                    _spread(rng),
                    STEADY_FETCH_BYTES * _spread(rng),
                    read,
                )
            )
    return actors


def _ordinary_actors(rng: np.random.Generator) -> list[_Actor]:
    """ANONYMOUS clients and two steady clients of the users the heavies belong to."""
    anonymous = [
        ("rdkafka", "producer", ("logs",)),
        ("legacy-app-1", "producer", ("logs",)),
        ("console-consumer-41823", "consumer", ("logs",)),
        ("legacy-app-2", "consumer", ("orders", "logs")),
        ("kafka-connect-sink", "consumer", ("payments", "ledger")),
    ]
    actors: list[_Actor] = []
    for client_id, role, read in anonymous:
        base = STEADY_PRODUCE_BYTES if role == "producer" else STEADY_FETCH_BYTES
        actors.append(
            _Actor(ANONYMOUS, client_id, role, _spread(rng), base * _spread(rng), read, idempotent=False)
        )
    actors.append(
        _Actor("etl", "etl-monitor", "consumer", _spread(rng), STEADY_FETCH_BYTES * _spread(rng), ("logs",))
    )
    actors.append(
        _Actor(
            "analytics",
            "analytics-dashboard",
            "consumer",
            _spread(rng),
            STEADY_FETCH_BYTES * _spread(rng),
            ("metrics",),
        )
    )
    return actors


def _planted_actors(rng: np.random.Generator) -> list[_Actor]:
    """The outliers the job must find: heavy clients, a heavy user of many clients, the storm."""
    # Planted heavies: about 30x a steady client's byte rate.
    actors = [
        _Actor(
            "etl",
            "etl-bulk-loader",
            "producer",
            3.0,
            STEADY_PRODUCE_BYTES * 10,
            ("clickstream",),
            throttle_share=0.3,
            pid_lifetime_s=7200.0,
        ),
        _Actor(
            "analytics",
            "spark-reader",
            "consumer",
            3.0,
            STEADY_FETCH_BYTES * 10,
            ("events-archive",),
            throttle_share=0.2,
        ),
        _Actor(
            ANONYMOUS,
            "legacy-mirror",
            "producer",
            2.5,
            STEADY_PRODUCE_BYTES * 10,
            ("mirror-in",),
            idempotent=False,
        ),
    ]
    # A heavy user made of many ordinary clients: only its total stands out.
    for i in range(10):
        actors.append(
            _Actor(
                "reporting",
                f"reporting-job-{i}",
                "producer",
                _spread(rng, 0.1),
                STEADY_PRODUCE_BYTES * _spread(rng, 0.1),
                ("reports",),
                pid_lifetime_s=float(rng.uniform(1200, 5400)),
            )
        )
    actors.append(_Actor("storm", "flaky-producer", "storm", 1.0, 1024.0, ("storm-events",)))
    return actors


ADMINS = (
    ("ops", "terraform"),
    ("ci", "topic-provisioner"),
    ("platform", "strimzi-topic-operator"),
    ("svc-orders", "orders-admin"),
    ("svc-payments", "payments-admin"),
    ("svc-search", "search-admin"),
)


def _planted_truth(actors: list[_Actor]) -> dict[str, Any]:
    """The ``GeneratedTruth`` fields the cast decides: who is heavy, who is steady, who abuses."""
    truth: dict[str, Any] = {
        "heavy_producers": [("etl", "etl-bulk-loader"), (ANONYMOUS, "legacy-mirror")],
        "heavy_consumers": [("analytics", "spark-reader")],
        "heavy_users": ["reporting"],
        "hot_topics_produce": ["clickstream", "mirror-in"],
        "hot_topics_fetch": ["events-archive"],
        "admin_clients": list(ADMINS),
        "abusive_admin": ("chaos", "topic-spammer"),
        "storm_user": "storm",
        "storm_client": "flaky-producer",
    }
    heavy = {*truth["heavy_producers"], *truth["heavy_consumers"]}
    steady = [
        (a.user, a.client_id)
        for a in actors
        if a.role in ("producer", "consumer") and (a.user, a.client_id) not in heavy and a.user != "reporting"
    ]
    truth["steady_pairs"] = steady
    truth["steady_users"] = sorted({u for u, _ in steady if u not in ("etl", "analytics", ANONYMOUS)})
    return truth


def _actors(rng: np.random.Generator) -> tuple[list[_Actor], dict[str, int], dict[str, Any]]:
    """The cast: steady services, ANONYMOUS clients, planted heavies, admins, the storm."""
    topics = _topic_sizes(rng)
    actors = _service_actors(rng) + _ordinary_actors(rng) + _planted_actors(rng)
    actors += [_Actor(user, client_id, "admin", 0.0) for user, client_id in ADMINS]
    actors.append(_Actor("chaos", "topic-spammer", "abuser", 0.0))
    for i, actor in enumerate(actors):
        actor.index = i
    return actors, topics, _planted_truth(actors)


def _profile(rng: np.random.Generator, span_s: int, bursty: bool = False) -> np.ndarray:
    """Relative request intensity per second: a slow wave plus per-second jitter."""
    t = np.arange(span_s, dtype=np.float64)
    period = rng.uniform(900, 2400)
    wave = 1.0 + 0.25 * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi))
    jitter = rng.gamma(16.0, 1.0 / 16.0, span_s)
    w = wave * jitter
    if bursty:
        w *= 1.0 + 2.0 * (rng.random(span_s) < 0.02)
    return w


def _admin_events(
    rng: np.random.Generator, span_s: int, abusive: bool, budget: int
) -> tuple[np.ndarray, ...]:
    """(seconds as float, api_key, mutations) of an admin client's requests, at most ``budget``."""
    times: list[float] = []
    apis: list[int] = []
    muts: list[int] = []
    if abusive:
        # Bursts of CreateTopics every few hundred ms, each topic 20-50 partitions.
        bursts = max(1, round(span_s / 1200))
        per_burst = max(5, min(300, budget // bursts))
        for b in range(bursts):
            t0 = (b + 0.3 + 0.4 * rng.random()) * span_s / bursts
            gaps = rng.uniform(0.15, 0.45, per_burst)
            ts = t0 + np.cumsum(gaps)
            times += ts.tolist()
            apis += [CREATE_TOPICS] * per_burst
            muts += rng.integers(20, 51, per_burst).tolist()
    else:
        # Deployments every ~12 minutes: a few CreateTopics (or a DeleteTopics) seconds apart.
        deployments = max(2, int(rng.poisson(span_s / 720)))
        for t0 in np.sort(rng.uniform(0, span_s - 30, deployments)):
            n = int(rng.integers(1, 5))
            ts = t0 + np.cumsum(rng.uniform(0.2, 3.0, n))
            times += [float(t0) - 0.5, *ts.tolist()]
            apis += [METADATA, *(DELETE_TOPICS if rng.random() < 0.15 else CREATE_TOPICS for _ in range(n))]
            muts += [-1, *rng.integers(3, 13, n).tolist()]
    t = np.clip(np.array(times, dtype=np.float64), 0, span_s - 0.001)[:budget]
    return t, np.array(apis[: len(t)], dtype=np.int16), np.array(muts[: len(t)], dtype=np.int32)


class _Columns:
    """Column pieces of one file, concatenated and sorted by time at the end."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {}
        self.lists: dict[str, list[tuple[np.ndarray, dict[str, np.ndarray]]]] = {}

    def add(self, **cols: np.ndarray) -> None:
        for k, v in cols.items():
            self.parts.setdefault(k, []).append(v)

    def add_list(self, name: str, lengths: np.ndarray, children: dict[str, np.ndarray]) -> None:
        self.lists.setdefault(name, []).append((lengths, children))


_AdminPlan = dict[int, tuple[np.ndarray, ...]]  # actor index -> (seconds, api keys, mutations)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, sigma, n))


def _data_apis(rng: np.random.Generator, actor: _Actor, n: int) -> np.ndarray:
    """The api key of each of a produce/fetch/storm client's ``n`` requests."""
    role = actor.role
    if role == "producer":
        api = np.where(rng.random(n) < 0.93, PRODUCE, METADATA).astype(np.int16)
        if actor.idempotent:
            api[rng.random(n) < 0.002] = INIT_PRODUCER_ID
    elif role == "consumer":
        u = rng.random(n)
        api = np.select(
            [u < 0.88, u < 0.93, u < 0.96, u < 0.99],
            [FETCH, HEARTBEAT, OFFSET_COMMIT, METADATA],
            FIND_COORDINATOR,
        ).astype(np.int16)
    else:  # storm: short-lived producers, each an InitProducerId and one Produce
        u = rng.random(n)
        api = np.select([u < 0.5, u < 0.95], [PRODUCE, INIT_PRODUCER_ID], METADATA).astype(np.int16)
    return api


@dataclass
class _Partitions:
    """The partitions of a file's requests, flattened: ``k`` per request, then one row each."""

    k: np.ndarray  # partitions per request
    topic: np.ndarray  # topic index (into the sorted topic names)
    partition: np.ndarray
    bytes: np.ndarray
    records: np.ndarray
    sums: np.ndarray  # bytes per request


def _request_partitions(
    rng: np.random.Generator,
    actor: _Actor,
    api: np.ndarray,
    empty_fetch: np.ndarray,
    topics: dict[str, int],
    topic_ids: dict[str, int],
) -> _Partitions:
    """Partitions per request (1-4 for Produce, 1-6 for a non-empty Fetch) and their bytes."""
    n = len(api)
    is_produce, is_fetch = api == PRODUCE, api == FETCH
    k = np.where(is_produce, 1 + rng.binomial(3, 0.3, n), np.where(is_fetch, 1 + rng.binomial(5, 0.3, n), 0))
    k[empty_fetch] = 0
    payload = _lognormal(rng, actor.payload, 0.6, n)
    parent = np.repeat(np.arange(n), k)
    m = len(parent)
    req_topic = rng.integers(0, len(actor.topics), n)
    topic_names = np.array([topic_ids[t] for t in actor.topics], dtype=np.int32)
    child_topic = topic_names[req_topic][parent]
    nparts = np.array([topics[t] for t in actor.topics], dtype=np.int64)[req_topic][parent]
    first = np.repeat(np.cumsum(k) - k, k)
    within = np.arange(m) - first
    start = rng.integers(0, 1 << 30, n)[parent]
    child_partition = ((start + within) % nparts).astype(np.int32)
    child_bytes = np.maximum(
        64, payload[parent] / np.maximum(k[parent], 1) * rng.uniform(0.7, 1.3, m)
    ).astype(np.int64)
    child_records = np.maximum(1, child_bytes // int(rng.integers(300, 1200))).astype(np.int32)
    sums = np.bincount(parent, weights=child_bytes, minlength=n).astype(np.int64)
    return _Partitions(k, child_topic, child_partition, child_bytes, child_records, sums)


def _producer_id_values(actor: _Actor, secs: np.ndarray, is_produce: np.ndarray) -> np.ndarray:
    """Producer ids: long-lived idempotent producers restart now and then (a new id each time);
    the storm's producers live for one request; non-idempotent batches carry -1."""
    pid_base = (actor.index + 1) * 10_000_000
    if actor.role == "storm":
        pids = pid_base + actor.seq + np.cumsum(is_produce) - 1
        actor.seq += int(is_produce.sum())
        return pids
    if actor.idempotent:
        return pid_base + ((secs + actor.index * 97) // actor.pid_lifetime_s).astype(np.int64)
    return np.full(len(secs), -1, dtype=np.int64)


def _data_requests(
    rng: np.random.Generator,
    actor: _Actor,
    secs: np.ndarray,
    start_ms: int,
    topics: dict[str, int],
    topic_ids: dict[str, int],
    out: _Columns,
) -> None:
    """Requests of a produce/fetch/storm client at the given seconds (one entry per request)."""
    n = len(secs)
    ts = start_ms + secs * 1000 + rng.integers(0, 1000, n)
    api = _data_apis(rng, actor, n)
    version = np.vectorize(VERSIONS.get, otypes=[np.int16])(api) if n else np.zeros(0, np.int16)
    is_produce, is_fetch = api == PRODUCE, api == FETCH
    data = is_produce | is_fetch
    empty_fetch = is_fetch & (rng.random(n) < 0.1)
    parts = _request_partitions(rng, actor, api, empty_fetch, topics, topic_ids)
    k = parts.k
    small_req = rng.integers(40, 300, n)
    request_bytes = np.where(is_produce, 120 + parts.sums + 70 * k, small_req + np.where(is_fetch, 30 * k, 0))
    response_bytes = np.where(
        is_fetch,
        150 + parts.sums + 80 * k,
        np.where(api == METADATA, rng.integers(1500, 8000, n), rng.integers(20, 200, n)),
    )
    pids = _producer_id_values(actor, secs, is_produce)
    throttled = data & (rng.random(n) < actor.throttle_share)
    throttle_ms = np.where(throttled, rng.integers(1, 400, n), 0).astype(np.int32)
    upstream = np.where(
        is_fetch,
        np.where(empty_fetch, 500.0, _lognormal(rng, 5.0, 0.6, n)),
        _lognormal(rng, np.where(is_produce, 3.0, 1.0), 0.5, n),  # type: ignore[arg-type]
    )
    node = rng.integers(0, 3, n).astype(np.int32)
    out.add(
        ts_ms=ts.astype(np.int64),
        actor=np.full(n, actor.index, dtype=np.int32),
        node=node,
        conn=(actor.index * 16 + node).astype(np.int64),
        api_key=api,
        api_version=version,
        request_bytes=request_bytes.astype(np.int64),
        response_bytes=response_bytes.astype(np.int64),
        new_producer_ids=np.full(n, -1, dtype=np.int32),
        mutations=np.full(n, -1, dtype=np.int32),
        mutations_rejected=np.zeros(n, dtype=np.int32),
        throttle_ms=throttle_ms,
        broker_throttle_ms=np.where(data, 0, -1).astype(np.int32),
        upstream_ms=upstream.astype(np.float64),
    )
    children = {"topic": parts.topic, "partition": parts.partition, "bytes": parts.bytes}
    out.add_list("partitions", k.astype(np.int32), {**children, "records": parts.records})
    out.add_list("producer_ids", is_produce.astype(np.int32), {"values": pids[is_produce]})
    out.add_list("error_codes", np.zeros(n, dtype=np.int32), {"values": np.zeros(0, dtype=np.int16)})


def _admin_requests(
    rng: np.random.Generator,
    actor: _Actor,
    secs: np.ndarray,
    api: np.ndarray,
    muts: np.ndarray,
    start_ms: int,
    out: _Columns,
) -> None:
    n = len(secs)
    ts = (start_ms + np.floor(secs * 1000)).astype(np.int64)
    is_mut = muts > 0
    errors = is_mut & (rng.random(n) < (0.2 if actor.role == "abuser" else 0.02))
    out.add(
        ts_ms=ts,
        actor=np.full(n, actor.index, dtype=np.int32),
        node=np.full(n, -1, dtype=np.int32),
        conn=np.full(n, actor.index * 16, dtype=np.int64),
        api_key=api,
        api_version=np.vectorize(VERSIONS.get, otypes=[np.int16])(api) if n else np.zeros(0, np.int16),
        request_bytes=np.where(is_mut, 80 + 60 * np.maximum(muts, 0) // 8, 60).astype(np.int64),
        response_bytes=np.where(is_mut, 120, rng.integers(1500, 8000, n)).astype(np.int64),
        new_producer_ids=np.full(n, -1, dtype=np.int32),
        mutations=muts.astype(np.int32),
        mutations_rejected=np.zeros(n, dtype=np.int32),
        throttle_ms=np.zeros(n, dtype=np.int32),
        broker_throttle_ms=np.where(is_mut, 0, -1).astype(np.int32),
        upstream_ms=_lognormal(rng, 40.0, 0.5, n),
    )
    empty: dict[str, np.ndarray] = {
        "topic": np.zeros(0, np.int32),
        "partition": np.zeros(0, np.int32),
        "bytes": np.zeros(0, np.int64),
        "records": np.zeros(0, np.int32),
    }
    out.add_list("partitions", np.zeros(n, dtype=np.int32), empty)
    out.add_list("producer_ids", np.zeros(n, dtype=np.int32), {"values": np.zeros(0, dtype=np.int64)})
    out.add_list("error_codes", errors.astype(np.int32), {"values": np.full(int(errors.sum()), 36, np.int16)})


def _strings(indices: np.ndarray, vocab: list[str]) -> Any:
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(
        pa.array(indices, type=pa.int32()), pa.array(vocab, pa.string())
    ).cast(pa.string())


def _list_array(pieces: list[tuple[np.ndarray, dict[str, np.ndarray]]], order: np.ndarray, build: Any) -> Any:
    """A list column from per-actor pieces, rows reordered by ``order`` (the time sort)."""
    import pyarrow as pa

    lengths = np.concatenate([p[0] for p in pieces]).astype(np.int64)
    names = list(pieces[0][1])
    children = {c: np.concatenate([p[1][c] for p in pieces]) for c in names}
    starts = np.cumsum(lengths) - lengths
    lo = lengths[order]
    # child index of every element of the reordered rows
    take = np.repeat(starts[order] - (np.cumsum(lo) - lo), lo) + np.arange(int(lo.sum()))
    offsets = np.zeros(len(order) + 1, dtype=np.int32)
    np.cumsum(lo, out=offsets[1:])
    values = build({c: v[take] for c, v in children.items()})
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _admin_plan(rng: np.random.Generator, actors: list[_Actor], span_s: int, records: int) -> _AdminPlan:
    """Admin requests come first: their number does not grow with the traffic."""
    admin_budget = max(10, records // 50)
    admin: _AdminPlan = {}
    for actor in actors:
        if actor.role in ("admin", "abuser"):
            share = admin_budget // 2 if actor.role == "abuser" else admin_budget // 12
            admin[actor.index] = _admin_events(rng, span_s, actor.role == "abuser", max(3, share))
    return admin


def _data_plan(rng: np.random.Generator, actors: list[_Actor], span_s: int, requests: int) -> list[_Actor]:
    """The data clients, each given its requests per second (``counts``); the storm is 2%."""
    data_actors = [a for a in actors if a.role in ("producer", "consumer", "storm")]
    weights = np.array([a.weight for a in data_actors])
    storm = next(a for a in data_actors if a.role == "storm")
    weights[data_actors.index(storm)] = 0.0
    weights = weights / weights.sum() * 0.98  # the storm is 2% of the data requests
    weights[data_actors.index(storm)] = 0.02
    per_actor = rng.multinomial(requests, weights)
    for actor, n in zip(data_actors, per_actor, strict=True):
        p = _profile(rng, span_s)
        actor.counts = rng.multinomial(int(n), p / p.sum())
    return data_actors


def _file_bounds(
    data_actors: list[_Actor], admin: _AdminPlan, span_s: int, records: int, nfiles: int
) -> list[int]:
    """Second boundaries of time slices with about the same number of records each."""
    total_per_s = np.sum([a.counts for a in data_actors if a.counts is not None], axis=0)
    for t, _, _ in admin.values():
        total_per_s += np.bincount(t.astype(np.int64), minlength=span_s)
    cum = np.cumsum(total_per_s)
    bounds = [0, *[int(np.searchsorted(cum, records * i / nfiles)) + 1 for i in range(1, nfiles)], span_s]
    return sorted(set(min(b, span_s) for b in bounds))


@dataclass
class _Vocab:
    """The strings of the files, dictionary-encoded by actor index (or topic index)."""

    topics: list[str]
    users: list[str]
    clients: list[str]
    addrs: list[str]
    proxies: list[str]
    schema: Any  # the capture's Arrow schema

    @classmethod
    def of(cls, actors: list[_Actor], topics: list[str]) -> _Vocab:
        addrs = [
            f"10.{1 + a.index // 200}.{a.index % 200}.{10 + a.index % 50}:{40000 + a.index}" for a in actors
        ]
        users, clients = [a.user for a in actors], [a.client_id for a in actors]
        return cls(topics, users, clients, addrs, ["kthrottle-0", "kthrottle-1"], arrow_schema())


def _slice_columns(
    rng: np.random.Generator,
    actors: list[_Actor],
    data_actors: list[_Actor],
    admin: _AdminPlan,
    seconds: tuple[int, int],
    start_ms: int,
    topics: dict[str, int],
    topic_ids: dict[str, int],
    counts: dict[str, int],
) -> _Columns:
    """Every request of one time slice [s0, s1), per actor; ``counts`` gains them per role."""
    s0, s1 = seconds
    cols = _Columns()
    for actor in data_actors:
        assert actor.counts is not None
        c = actor.counts[s0:s1]
        if c.sum() == 0:
            continue
        secs = np.repeat(np.arange(s0, s1, dtype=np.int64), c)
        _data_requests(rng, actor, secs, start_ms, topics, topic_ids, cols)
        counts[actor.role] = counts.get(actor.role, 0) + len(secs)
    for idx, (t, api, muts) in admin.items():
        sel = (t >= s0) & (t < s1)
        if sel.any():
            _admin_requests(rng, actors[idx], t[sel], api[sel], muts[sel], start_ms, cols)
            counts[actors[idx].role] = counts.get(actors[idx].role, 0) + int(sel.sum())
    return cols


def _partition_structs(ch: dict[str, np.ndarray], vocab: _Vocab) -> Any:
    """The partitions' children as the capture schema's struct (topic names from the vocabulary)."""
    import pyarrow as pa

    return pa.StructArray.from_arrays(
        [
            _strings(ch["topic"], vocab.topics),
            pa.array(ch["partition"], pa.int32()),
            pa.array(ch["bytes"], pa.int64()),
            pa.array(ch["records"], pa.int32()),
        ],
        fields=list(vocab.schema.field("partitions").type.value_type),
    )


def _slice_table(cols: _Columns, vocab: _Vocab) -> Any:
    """One file's columns sorted by time, as a table of the capture schema."""
    import pyarrow as pa

    schema = vocab.schema
    flat = {k: np.concatenate(v) for k, v in cols.parts.items()}
    order = np.argsort(flat["ts_ms"], kind="stable")
    flat = {k: v[order] for k, v in flat.items()}
    who = flat.pop("actor")
    arrays = {
        **{k: pa.array(v, type=schema.field(k).type) for k, v in flat.items()},
        "proxy": _strings(who % 2, vocab.proxies),
        "client_addr": _strings(who, vocab.addrs),
        "principal": _strings(who, vocab.users),
        "client_id": _strings(who, vocab.clients),
        "partitions": _list_array(cols.lists["partitions"], order, partial(_partition_structs, vocab=vocab)),
        "producer_ids": _list_array(
            cols.lists["producer_ids"], order, lambda ch: pa.array(ch["values"], pa.int64())
        ),
        "error_codes": _list_array(
            cols.lists["error_codes"], order, lambda ch: pa.array(ch["values"], pa.int16())
        ),
        "dry_run": pa.array(np.zeros(len(order), dtype=bool)),
    }
    arrays["decided_throttle_ms"] = arrays["throttle_ms"]
    return pa.Table.from_arrays([arrays[name] for name in FIELD_NAMES], schema=schema)


def generate(
    out_dir: str | Path,
    records: int,
    seed: int = 0,
    start_ms: int = DEFAULT_START_MS,
    span_s: int = 3600,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
    min_files: int = 2,
) -> GeneratedTruth:
    """Write ``records`` capture records over ``span_s`` seconds as ``capture-gen-<n>.parquet`` files.

    Files are consecutive time slices (as the proxy's rolling files are), each sorted by time.
    """
    import pyarrow.parquet as pq

    if records < 100:
        raise ValueError("records: at least 100")
    if span_s < 60:
        raise ValueError("span_s: at least 60 seconds")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("capture-gen-*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    actors, topics, planted = _actors(rng)
    vocab = _Vocab.of(actors, sorted(topics))
    topic_ids = {t: i for i, t in enumerate(vocab.topics)}
    admin = _admin_plan(rng, actors, span_s, records)
    data_actors = _data_plan(rng, actors, span_s, records - sum(len(v[0]) for v in admin.values()))
    nfiles = max(min_files, math.ceil(records / rows_per_file))
    files: list[str] = []
    counts: dict[str, int] = {}
    for f, seconds in enumerate(
        itertools.pairwise(_file_bounds(data_actors, admin, span_s, records, nfiles))
    ):
        cols = _slice_columns(rng, actors, data_actors, admin, seconds, start_ms, topics, topic_ids, counts)
        if not cols.parts:
            continue
        path = out / f"capture-gen-{f:04d}.parquet"
        pq.write_table(_slice_table(cols, vocab), path, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        files.append(str(path))
    truth = GeneratedTruth(
        records=records,
        files=files,
        start_ms=start_ms,
        end_ms=start_ms + span_s * 1000,
        seed=seed,
        counts=counts,
        **planted,
    )
    (out / "truth.json").write_text(truth.to_json())
    return truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analytics.generate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--records", type=int, required=True, help="capture records to write")
    parser.add_argument(
        "--output", required=True, help="directory for capture-gen-<n>.parquet (and truth.json)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-ms", type=int, default=DEFAULT_START_MS)
    parser.add_argument("--span-s", type=int, default=3600, help="seconds of traffic (default: an hour)")
    parser.add_argument("--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        truth = generate(args.output, args.records, args.seed, args.start_ms, args.span_s, args.rows_per_file)
    except ValueError as exc:
        print(f"generate: {exc}", file=sys.stderr)
        return 2
    print(
        f"generate: {args.records} records in {len(truth.files)} files, {time.monotonic() - t0:.1f}s",
        file=sys.stderr,
    )
    print(truth.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
