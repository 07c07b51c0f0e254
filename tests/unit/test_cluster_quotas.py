"""One quota across gateway replicas, in simulated time (dev/cluster_sim.py runs the real quota code
of every replica; time, the topic and the clients are simulated)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from dev.cluster_sim import Simulation
from proxy.config import parse_config
from proxy.ratelog import RateLimitedLog
from proxy.server import ProxyServer
from proxy.shared import cluster_quotas
from proxy.shared.cluster_quotas import REPORT_DIRECTIONS, ClusterQuotaService
from quota.cluster import ClusterMembership, ClusterMode, ProbeOutcome
from quota.cluster_report import (
    FETCH_PARTITION,
    PRODUCE,
    PRODUCE_PARTITION,
    PRODUCER_ID,
    MutationRecord,
    ReportError,
    UsageReport,
    decode_record,
)

QUOTA = 3 * 1024 * 1024
OFFERED = 4 * 1024 * 1024  # per connection: three of them would get 9 MiB/s per replica


def sample_modes(sim: Simulation, times: list[float]) -> dict[float, list[ClusterMode]]:
    """Every replica's mode at each of ``times`` (filled in as the simulation runs)."""
    seen: dict[float, list[ClusterMode]] = {}
    for t in times:
        sim.at(
            t,
            cast(
                "Callable[[], None]",
                lambda t=t: seen.__setitem__(t, [node.membership.mode(t) for node in sim.nodes]),
            ),
        )
    return seen


def spread(replicas: int = 3, **kwargs: object) -> tuple[Simulation, list[int]]:
    """One client id whose connections land one on each replica."""
    sim = Simulation(replicas=replicas, quota=QUOTA, window={"num": 11, "size_seconds": 1}, **kwargs)  # type: ignore[arg-type]
    return sim, [sim.connect(0, r, OFFERED) for r in range(replicas)]


def test_three_replicas_hold_one_client_to_the_quota_exactly() -> None:
    """Each replica adds the others' usage into the same bucket: the three together get the
    quota, not three times it, over every 10 s after the first burst."""
    sim, _conns = spread()
    sim.run(80_000)
    spans = [sim.rate(0, a, a + 10_000) / QUOTA for a in range(20_000, 70_000, 5_000)]
    assert min(spans) >= 0.98 and max(spans) <= 1.02, spans


def test_connections_that_start_apart_share_the_quota_alike() -> None:
    """One client's connections reach three replicas 3 s apart. Each replica's view of the shared
    bucket is fed the same usage, but the views the first two built alone stay apart from the
    third's while the bucket is in debt; without the replicas' fair parts, the replica with the
    highest view kept 99% of the quota and the third's connection got nothing. Each now gets its
    third, soon after it comes."""
    sim = Simulation(replicas=3, quota=QUOTA, request_bytes=16 * 1024, window={"num": 11, "size_seconds": 1})
    conns = [sim.connect(0, r, OFFERED, at_ms=3000.0 * r) for r in range(3)]
    sim.mark(15_000)
    sim.mark(40_000)
    sim.run(40_000)
    shares = [sim.connection_rate(c, 15_000, 40_000) / QUOTA for c in conns]
    assert all(share == pytest.approx(1 / 3, rel=0.05) for share in shares), shares
    assert sim.rate(0, 15_000, 40_000) == pytest.approx(QUOTA, rel=0.02)


@pytest.mark.parametrize("lag_ms", [10.0, 400.0])
def test_the_exchange_lag_changes_nothing_over_time(lag_ms: float) -> None:
    sim, _conns = spread(lag_ms=lag_ms)
    sim.run(60_000)
    assert sim.rate(0, 20_000, 60_000) == pytest.approx(QUOTA, rel=0.02)


def test_when_two_of_three_producers_stop_the_one_left_gets_the_whole_quota_at_once() -> None:
    sim, conns = spread()

    def stop_two() -> None:
        sim.stop(conns[1])
        sim.stop(conns[2])

    sim.at(40_000, stop_two)
    sim.run(70_000)
    after = sim.reached_quota_after(0, 40_000, 70_000)
    assert after is not None and after <= 1.0, after
    assert sim.rate(0, 45_000, 70_000) == pytest.approx(QUOTA, rel=0.02)


def test_a_killed_replicas_client_reconnects_elsewhere_and_the_quota_holds() -> None:
    """SIGKILL: its usage stops, its client reconnects to another replica; the quota is the
    quota throughout (nothing waits for the dead replica's part to be handed over)."""
    sim, _conns = spread()

    def kill() -> None:
        sim.kill(2)
        sim.connect(0, 0, OFFERED, at_ms=sim.now_ms + 300)

    sim.at(40_000, kill)
    sim.run(70_000)
    after = sim.reached_quota_after(0, 40_000, 70_000)
    assert after is not None and after <= 3.0, after
    assert sim.rate(0, 42_000, 70_000) == pytest.approx(QUOTA, rel=0.03)
    assert all(node.membership.mode(70_000).instances == 2 for node in sim.nodes[:2])


def test_exchange_down_every_replica_holds_its_part_alone_then_recovers() -> None:
    """The topic is unreachable for all: after the staleness each holds quota / 3 on its own
    clients (in steady state the three together are the quota); back within 3 s of its return."""
    sim, _conns = spread()
    for r in range(3):
        sim.at(30_000, cast("Callable[[], None]", lambda r=r: sim.cut(r)))
        sim.at(70_000, cast("Callable[[], None]", lambda r=r: sim.cut(r, False)))
    modes = sample_modes(sim, [60_000, 73_000])
    sim.run(100_000)
    assert sim.rate(0, 40_000, 70_000) <= QUOTA * 1.05
    assert sim.rate(0, 40_000, 70_000) == pytest.approx(QUOTA, rel=0.05)
    assert all(m.local_only and m.multiplier == pytest.approx(1 / 3) for m in modes[60_000]), modes
    assert not any(m.fallback for m in modes[73_000]), modes
    assert sim.rate(0, 75_000, 100_000) == pytest.approx(QUOTA, rel=0.03)


def test_one_replica_cut_off_keeps_its_part_and_the_others_share_the_rest() -> None:
    """Replica 2 cannot reach the topic but serves its client: it holds quota / 3 alone; the
    others ask it whether it is alive (it is), set its part aside and share the rest."""
    sim, _conns = spread()
    sim.at(30_000, lambda: sim.cut(2))
    sim.at(70_000, lambda: sim.cut(2, False))
    modes = sample_modes(sim, [60_000, 73_000])
    sim.run(100_000)
    assert sim.rate(0, 40_000, 70_000) == pytest.approx(QUOTA, rel=0.05)
    assert sim.rate(0, 40_000, 70_000) <= QUOTA * 1.05
    cut = modes[60_000][2]
    assert cut.local_only and cut.multiplier == pytest.approx(1 / 3)
    others = modes[60_000][:2]
    assert all(m.multiplier == pytest.approx(2 / 3) and m.cut_off == ("r002",) for m in others), others
    assert not any(m.fallback for m in modes[73_000]), modes


def test_fifty_replicas_ten_thousand_entities_load_shifting() -> None:
    """10,000 active client ids over 50 replicas (each on one replica, under its quota), and 100
    greedy ones with a connection on each of three replicas; at 12 s the greedy ones' load moves:
    two of their three connections stop and a new one opens on another replica. Every greedy
    one is held within 5% of its quota, and gets all of it again within 3 s of the move."""
    quota = 100 * 1024
    sim = Simulation(replicas=50, quota=quota, request_bytes=quota // 2, window={"num": 3, "size_seconds": 1})
    rnd = random.Random(5)
    for entity in range(100, 10_100):
        sim.connect(entity, rnd.randrange(50), quota * 0.6)
    greedy: dict[int, list[int]] = {}
    small = quota // 20  # twenty requests a second at the quota: the rates are read to about 1%
    for entity in range(100):
        greedy[entity] = [
            sim.connect(entity, r, 2 * quota, request_bytes=small) for r in rnd.sample(range(50), 3)
        ]

    def shift() -> None:
        for entity, conns in greedy.items():
            sim.stop(conns[1])
            sim.stop(conns[2])
            sim.connect(entity, rnd.randrange(50), 2 * quota, request_bytes=small)

    sim.at(12_000, shift)
    sim.run(18_000)
    # The first burst (each replica lets the bucket's burst through before it has heard of the
    # others) is paid back by 5 s; after it, and after the move:
    errors = [abs(sim.rate(e, 6_000, 12_000) / quota - 1) for e in greedy]
    errors += [abs(sim.rate(e, 14_000, 18_000) / quota - 1) for e in greedy]
    assert max(errors) <= 0.05, sorted(errors)[-5:]
    rebalanced = [sim.reached_quota_after(e, 12_000, 18_000) for e in greedy]
    assert all(r is not None and r <= 3.0 for r in rebalanced), sorted(r or 99 for r in rebalanced)[-5:]
    quiet = [sim.rate(e, 3_000, 18_000) / (quota * 0.6) for e in range(100, 10_100, 97)]
    assert min(quiet) >= 0.9, min(quiet)  # under their quota: never held back


# --- membership ------------------------------------------------------------------------------


def report(instance: str, seq: int, **kwargs: object) -> UsageReport:
    return UsageReport(instance, seq, 1000.0 * seq, **kwargs)  # type: ignore[arg-type]


def test_usage_is_added_once_and_only_after_the_history_was_read() -> None:
    m = ClusterMembership("me", replicas=3, staleness_ms=3000.0, now_ms=0.0)
    assert m.accept(report("a", 1), 100.0) is None  # still reading the topic's history
    m.caught_up = True
    assert m.accept(report("a", 2), 200.0) == 1.0
    assert m.accept(report("a", 2), 300.0) is None  # read again after a reconnection
    assert m.accept(report("a", 1), 300.0) is None
    assert m.accept(report("a", 3, fallback=True), 400.0) is None  # it holds its part alone
    assert m.accept(report("a", 4, leaving=True), 500.0) is None
    assert "a" not in m.peers


def test_a_version_1_report_counts_its_rates_over_the_time_since_the_previous() -> None:
    m = ClusterMembership("me", replicas=1, staleness_ms=3000.0, now_ms=0.0)
    m.caught_up = True
    legacy = decode_record(b'{"v":1,"instance":"old","at_ms":1000,"rates":[["p","","c",500.0]]}')
    assert isinstance(legacy, UsageReport) and legacy.legacy_rates
    assert m.accept(legacy, 100.0) is None  # its first: nothing to measure the time from
    later = decode_record(b'{"v":1,"instance":"old","at_ms":1500,"rates":[["p","","c",500.0]]}')
    assert isinstance(later, UsageReport)
    assert m.accept(later, 600.0) == pytest.approx(0.5)  # 500 B/s x 0.5 s


def test_mode_follows_own_reports_and_silent_peers() -> None:
    m = ClusterMembership("me", replicas=4, staleness_ms=3000.0, now_ms=0.0)
    start = m.mode(100.0)
    assert start.local_only and start.multiplier == pytest.approx(1 / 4)  # assumed, until told
    m.caught_up = True
    m.published(1, 100.0)
    m.accept(report("me", 1), 150.0)
    for name in ("a", "b"):
        m.accept(UsageReport(name, 1, 0.0, address=f"{name}:1"), 150.0)
    normal = m.mode(1000.0)
    assert (normal.fallback, normal.instances, normal.multiplier) == (False, 3, 1.0)
    assert m.round_trip_ms == 50.0
    m.published(2, 2000.0)
    m.accept(report("me", 2), 2050.0)
    m.accept(UsageReport("a", 2, 0.0, address="a:1"), 2050.0)
    assert m.probes_due(4000.0) == [("b", "b:1")]  # b silent past the staleness: ask it
    assert m.probes_due(4100.0) == []  # one question a second
    assert m.mode(4000.0).cut_off == ("b",)  # until it answers, it keeps its part
    m.probe_result("b", ProbeOutcome.ALIVE, 4200.0)
    degraded = m.mode(4200.0)
    assert degraded.multiplier == pytest.approx(2 / 3) and not degraded.local_only
    m.probe_result("b", ProbeOutcome.GONE, 4300.0)
    assert m.mode(4300.0).multiplier == 1.0 and m.mode(4300.0).instances == 2
    alone = m.mode(9000.0)  # our own reports stopped coming back
    assert alone.local_only and alone.multiplier == pytest.approx(1 / 2)  # the count last seen


def test_an_unreachable_peer_is_taken_as_gone_after_the_grace() -> None:
    m = ClusterMembership("me", replicas=2, staleness_ms=3000.0, now_ms=0.0, peer_grace_ms=10_000.0)
    m.caught_up = True
    m.accept(UsageReport("a", 1, 0.0, address="a:1"), 0.0)
    m.probe_result("a", ProbeOutcome.UNREACHABLE, 5000.0)
    for t in (5000.0, 9000.0):
        m.published(int(t), t)
        m.accept(report("me", int(t)), t)
        assert m.mode(t).cut_off == ("a",)
    m.published(11_000, 11_000.0)
    m.accept(report("me", 11_000), 11_000.0)
    assert m.mode(11_000.0).instances == 1


# --- the records ---------------------------------------------------------------------------


def test_usage_report_round_trip() -> None:
    r = UsageReport("a-1", 7, 1234.0, "10.0.0.7:9000", fallback=True)
    r.add(PRODUCE, "alice", "app-Ω", 1.5)
    r.add(PRODUCE, "", "reader\x00with nul", 20.0)
    r.add(PRODUCER_ID, "alice", "123456789", 1.0)
    back = decode_record(r.encode())
    assert isinstance(back, UsageReport)
    assert back.entries() == r.entries()
    assert (back.instance, back.seq, back.at_ms, back.address, back.fallback) == (
        "a-1",
        7,
        1234.0,
        "10.0.0.7:9000",
        True,
    )
    empty = decode_record(UsageReport("b", 1, 1.0).encode())
    assert isinstance(empty, UsageReport) and len(empty) == 0


def test_ten_thousand_entries_are_small() -> None:
    r = UsageReport("proxy-7f9c-1234", 1, 1.0, "10.1.2.3:9000")
    for i in range(10_000):
        r.add(PRODUCE, "", f"client-{i:05d}-app", 123456.0 + i)
    data = r.encode()
    assert len(data) < 15 * 10_000, len(data)
    back = decode_record(data)
    assert isinstance(back, UsageReport) and back.entries() == r.entries()


def test_mutation_record_round_trip() -> None:
    m = MutationRecord("a", 3, "alice", "admin", ("alice", ""), (3, 0, 12), True, 2.0, 11.0)
    assert decode_record(m.encode()) == m


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"nope", "too short|not a record"),
        (b"KTX\x09\x00\x00\x00\x02{}", "newer than this release"),
        (b'{"v": 9}', "version 1"),
        (b'{"v": 1, "instance": "", "at_ms": 1, "rates": []}', "instance"),
        (b'{"v": 1, "instance": "x", "at_ms": 1, "rates": [["q", "", "", 1]]}', r"rates\[0\]"),
        (b"KTX\x02\x00\x00\x00\x02{}", "instance"),
    ],
)
def test_unreadable_records_say_why(data: bytes, why: str) -> None:
    with pytest.raises(ReportError, match=why):
        decode_record(data)


def _numbered(kind: str, second: str) -> bytes:
    r = UsageReport("a", 1, 1.0)
    r.add(PRODUCE, "", "c", 1.0)
    r.add(kind, "t", second, 1.0)
    return r.encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        # Read whole or not at all: these once passed the decoder and failed half-applied.
        (_numbered(PRODUCE_PARTITION, "x"), r"body: 'x' is not a partition or producer id"),
        (_numbered(FETCH_PARTITION, "1.5"), r"body: '1.5' is not a partition or producer id"),
        (_numbered(PRODUCER_ID, ""), r"body: '' is not a partition or producer id"),
        (UsageReport("a", 1, 10**400).encode(), "unusable: int too large"),
        (
            MutationRecord("a", 1, "u", "c", ("u", ""), (1,), True, float("inf"), 1.0).encode(),
            "quota: must be finite",
        ),
        (
            MutationRecord("a", 1, "u", "c", ("u", ""), (1,), True, 10**400, 1.0).encode(),
            "unusable: int too large",
        ),
        (
            MutationRecord("a", 1, "u", "c", ("u", ""), (1,), True, 1e200, 1e200).encode(),
            r"quota x burst_seconds: must be finite",  # each finite, their bucket not
        ),
        (
            b'{"v": 1, "instance": "x", "at_ms": 1, "rates": [["p", "", "", 1' + b"0" * 400 + b"]]}",
            "unusable",
        ),
        (b"KTX\x02\x00\x01\x86\xa0" + b"[" * 100_000, "unusable|unreadable head"),
    ],
)
def test_records_a_reader_could_not_apply_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(ReportError, match=why):
        decode_record(data)


def test_partitions_and_producer_ids_are_read_as_written() -> None:
    r = UsageReport("a", 1, 1.0)
    r.add(PRODUCE_PARTITION, "t", "-1", 2.0)  # a client may name any partition
    r.add(PRODUCER_ID, "u", str(2**63 - 1), 1.0)
    back = decode_record(r.encode())
    assert isinstance(back, UsageReport) and back.entries() == r.entries()


def test_a_damaged_report_body_is_refused() -> None:
    r = UsageReport("a", 1, 1.0)
    r.add(PRODUCE, "", "c", 1.0)
    data = bytearray(r.encode())
    data[-3] ^= 0xFF
    with pytest.raises(ReportError, match="body"):
        decode_record(bytes(data))


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "{enabled: true, publish_interval_seconds: 2, full_interval_seconds: 1}",
            "full_interval_seconds must",
        ),
        ("{enabled: true, hot_interval_seconds: 3}", "hot_interval_seconds must"),
        ("{enabled: true, staleness_seconds: 4}", "staleness_seconds must"),
    ],
)
def test_exchange_intervals_that_cannot_work_are_refused_with_the_line(section: str, expected: str) -> None:
    from proxy.config import ConfigError, parse_config

    text = (
        "mode: gateway\ngateway:\n  upstream_bootstrap: [127.0.0.1:9092]\ncluster_quotas: " + section + "\n"
    )
    with pytest.raises(ConfigError, match=rf"k\.yaml:4: cluster_quotas: .*{expected}"):
        parse_config(text, "k.yaml")
    defaults = parse_config(text.replace(section, "{enabled: true}"), "k.yaml").cluster_quotas
    assert (defaults.publish_interval_seconds, defaults.full_interval_seconds) == (2.0, 10.0)


# --- the records read from the topic, as the service takes them ----------------------------------

CLUSTER = """
gateway: {upstream_bootstrap: ["127.0.0.1:9"], broker_port_base: 9100}
cluster_quotas: {enabled: true, instance: here}
quotas:
  clients:
    spread: {producer_byte_rate: 1000}
"""


def _reports(server: ProxyServer) -> dict[str, float | None]:
    return {
        d: server.metrics.registry.get_sample_value("kthrottle_cluster_quota_reports_total", {"direction": d})
        for d in REPORT_DIRECTIONS
    }


def _cluster_service(monkeypatch: pytest.MonkeyPatch) -> tuple[ProxyServer, ClusterQuotaService, list[Any]]:
    """The service of one replica whose history was read, and the reports it adds (``_apply``)."""
    monkeypatch.setattr(cluster_quotas, "skip_log", RateLimitedLog(cluster_quotas.log))
    server = ProxyServer(parse_config(CLUSTER))
    service = server.cluster_quotas
    assert service is not None
    service.membership.caught_up = True
    added: list[Any] = []
    real = service._apply

    def apply(*a: Any) -> None:
        added.append(a[0])
        real(*a)

    monkeypatch.setattr(service, "_apply", apply)
    return server, service, added


def test_cluster_records_are_counted_and_bad_ones_change_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every record read from the exchange topic is counted under its direction; one that cannot
    be read changes nothing (no replica, no usage, no mutation) and is logged."""
    server, service, added = _cluster_service(monkeypatch)
    assert _reports(server) == dict.fromkeys(REPORT_DIRECTIONS, 0.0)  # each series from the start
    now_ms = time.time() * 1000
    bad_partition = UsageReport("peer", 1, now_ms)
    bad_partition.add(PRODUCE, "", "spread", 100.0)
    bad_partition.add(PRODUCE_PARTITION, "t", "x", 100.0)
    bad_mutation = MutationRecord("peer", 1, "", "spread", ("", "spread"), (1,), True, float("inf"), 1.0)
    with caplog.at_level(logging.WARNING, logger="proxy.shared.cluster_quotas"):
        service._on_record(b"peer", None, 0)
        service._on_record(b"peer", b"nope", 0)
        service._on_record(b"peer", bad_partition.encode(), 0)
        service._on_record(b"m/peer", bad_mutation.encode(), 0)
        service._on_record(b"peer", UsageReport("peer", 1, 10**400).encode(), 0)
    assert service.membership.peers == {} and added == []
    assert server.enforcer.mutation_log.applied == 0
    assert _reports(server) == {**dict.fromkeys(REPORT_DIRECTIONS, 0.0), "unreadable": 5.0}
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(skipped) == 5 and all(" skipped" in line for line in skipped)
    assert skipped[0] == "cluster quotas: record b'peer' without a value skipped"
    assert skipped[2] == "cluster quotas: record b'peer' skipped: body: 'x' is not a partition or producer id"

    good = UsageReport("peer", 1, now_ms, incarnation="p1")
    good.add(PRODUCE, "", "spread", 100.0)
    service._on_record(b"peer", good.encode(), 0)  # another replica's usage: added here
    service._on_record(b"peer", good.encode(), 0)  # read again: added once
    own = UsageReport("here", 1, now_ms, incarnation=service.incarnation)
    service._on_record(b"here", own.encode(), 0)  # this replica's own, read back
    mutation = MutationRecord("peer", 1, "", "spread", ("", "spread"), (1,), True, 5.0, 1.0)
    service._on_record(b"m/peer", mutation.encode(), 0)
    assert [r.instance for r in added] == ["peer"]
    assert list(service.membership.peers) == ["peer"]
    assert server.enforcer.mutation_log.applied == 1
    assert _reports(server) == {
        "published": 0.0,
        "unsent": 0.0,
        "applied": 1.0,
        "skipped": 1.0,
        "own": 1.0,
        "mutation": 1.0,
        "unreadable": 5.0,
    }


def test_a_flood_of_unreadable_cluster_records_is_counted_in_full_and_logged_in_part(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, service, added = _cluster_service(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="proxy.shared.cluster_quotas"):
        for i in range(500):
            service._on_record(f"r{i}".encode(), b"KTX\x09junk", 0)
    assert _reports(server)["unreadable"] == 500.0
    assert added == [] and service.membership.peers == {}
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 5  # five per 10 s
