"""KIP-936 producer-id quota: bloom sizing, filter rotation, counting and throttling in simulated time."""

from __future__ import annotations

import random
from typing import Any

import pytest

from quota.bloom import BloomFilter, TimedBloomFilter
from quota.cluster import ClusterLink
from quota.config import QuotaConfig
from quota.keys import DEFAULT
from quota.producer_ids import ProducerIdQuotas
from quota.rate import throttle_time_ms

HOUR_MS = 3_600_000.0
W = 10_000.0  # filter window in the small configs below: producer_ids.window.size_seconds = 10
SPAN_MS = 11 * W  # the rate's whole window (num x size)


def make_cfg(users: dict[str, Any] | None = None, **producer_ids: Any) -> QuotaConfig:
    """KIP-936's own windowed throttle unless ``shaping="steady"`` is given."""
    opts: dict[str, Any] = {"window": {"num": 11, "size_seconds": W / 1000}, "shaping": "kafka"}
    opts.update(producer_ids)
    return QuotaConfig.model_validate(
        {"users": users if users is not None else {"alice": {"producer_ids_rate": 1}}, "producer_ids": opts}
    )


def test_default_sizing() -> None:
    cfg = QuotaConfig()
    half = cfg.producer_ids.max_bytes_per_user // 2
    bloom = BloomFilter(half, cfg.producer_ids.false_positive_rate)
    assert (bloom.nbytes, bloom.bits, bloom.hashes, bloom.capacity) == (65_536, 524_288, 10, 36_465)
    timed = TimedBloomFilter(HOUR_MS, cfg.producer_ids.max_bytes_per_user, 0.001, 0)
    assert (timed.nbytes, timed.capacity, timed.hashes) == (65_536, 36_465, 10)


def test_bloom_has_no_false_negatives_and_its_rate_at_capacity() -> None:
    bloom = BloomFilter(4096, 0.01, seed=7)
    rng = random.Random(1)
    added = {rng.getrandbits(63) for _ in range(bloom.capacity)}
    for pid in added:
        bloom.add(pid)
    assert all(pid in bloom for pid in added)
    probes = [rng.getrandbits(63) for _ in range(50_000)]
    fp = sum(pid in bloom for pid in probes if pid not in added) / len(probes)
    assert fp < 2 * 0.01  # about p at capacity
    assert 0.4 < bloom.fill_ratio() < 0.6  # half the bits set at the optimum


def test_bloom_is_deterministic_given_its_seed() -> None:
    a, b, c = BloomFilter(256, 0.01, seed=3), BloomFilter(256, 0.01, seed=3), BloomFilter(256, 0.01, seed=4)
    assert a.positions(12345) == b.positions(12345) != c.positions(12345)
    assert len(set(a.positions(12345))) == a.hashes  # power-of-two bits and an odd stride: all distinct


def test_filters_rotate_every_half_window_and_drop_at_a_full_window() -> None:
    timed = TimedBloomFilter(W, 1024, 0.01, now_ms=0)
    assert timed.observe(1, 0) is True
    assert timed.observe(1, 1) is False
    assert [t for t, _ in timed.filters()] == [0]
    assert timed.observe(2, W / 2 - 1) is True  # still the first filter
    assert timed.observe(3, W / 2) is True  # the newest is half a window old: a second starts
    assert [t for t, _ in timed.filters()] == [0, W / 2]
    assert timed.nbytes == 1024
    assert timed.observe(1, 0.7 * W) is False  # only the old filter held 1: copied, not counted
    assert timed.observe(3, W - 1) is False
    assert timed.observe(4, W) is True  # first filter a window old: dropped, a third starts
    assert [t for t, _ in timed.filters()] == [W / 2, W]
    assert timed.observe(1, W + 1) is False  # kept alive by the copy at 0.7 W
    assert timed.observe(2, W + 1) is True  # only ever in the dropped filter: new again
    assert not timed.expired(2 * W - 1)
    assert timed.expired(2 * W)
    timed.expire(2 * W)
    assert timed.empty and timed.nbytes == 0
    assert timed.observe(2, 2 * W) is True  # a fresh filter after everything expired


def test_id_reused_every_half_window_is_counted_once_over_five_windows() -> None:
    timed = TimedBloomFilter(W, 1024, 0.01, now_ms=0)
    counts = [timed.observe(42, t * W / 2) for t in range(11)]
    assert counts == [True] + [False] * 10
    # Idle for a whole window after its last use: forgotten, as the KIP intends.
    assert timed.observe(42, 10 * W / 2 + W) is True


def test_reused_id_counted_once_by_the_quota() -> None:
    q = ProducerIdQuotas(make_cfg(users={"alice": {"producer_ids_rate": 100}}), 0)
    total = 0
    t = 0.0
    while t <= 5 * W:  # a producer sending every 0.3 windows for five windows, with -1 batches mixed in
        total += q.record("alice", [7, 7, -1], t).new_ids
        t += 0.3 * W
    assert total == 1
    assert q.state("alice", t)["new_ids_in_window"] == 1


def test_two_thousand_distinct_ids_counted_at_capacity() -> None:
    # Size each filter so that 2,000 ids fill it to capacity: the worst the configured rate allows.
    p = 0.001
    bytes_per_filter = 3600  # 28,800 bits: capacity 2,003 at p = 0.001
    q = ProducerIdQuotas(make_cfg(false_positive_rate=p, max_bytes_per_user=2 * bytes_per_filter), 0, seed=99)
    assert q.state("alice", 0)["filters"] == {
        "count": 0,
        "bytes": 0,
        "capacity": 2003,
        "hashes": 10,
        "live": [],
    }
    rng = random.Random(5)
    ids: set[int] = set()
    while len(ids) < 2000:
        ids.add(rng.getrandbits(40))
    counted = sum(q.record("alice", [pid], 1.0).new_ids for pid in ids)
    assert 2000 - 3 * p * 2000 <= counted <= 2000  # false positives only make ids look known
    assert sum(q.record("alice", [pid], 2.0).new_ids for pid in ids) == 0  # no false negatives


def test_memory_per_user_never_exceeds_the_bound() -> None:
    for max_bytes in (256, 1000, 1001):
        q = ProducerIdQuotas(
            make_cfg(users={DEFAULT: {"producer_ids_rate": 1e9}}, max_bytes_per_user=max_bytes), 0
        )
        pid = 0
        for step in range(400):
            now = step * W / 37  # crosses rotations at odd points
            for user in ("a", "b"):
                q.record(user, range(pid, pid + 50), now)
                pid += 50
                assert len(q.users[user].filters.filters()) <= 2
            for _, _, _, nbytes in q.snapshot(now):
                assert nbytes <= max_bytes
        assert q.memory_bytes() <= 2 * max_bytes


def test_throttle_above_quota_only() -> None:
    q = ProducerIdQuotas(make_cfg(users={"alice": {"producer_ids_rate": 1}}), 0)
    # The rate window is padded to (num - 1) x size = 100 s: 100 new ids is exactly 1 id/s.
    d = q.record("alice", range(100), 0)
    assert (d.new_ids, d.rate, d.throttle_ms) == (100, 1.0, 0)
    assert q.record("alice", [5], 0).throttle_ms == 0  # known id, still at the quota
    d = q.record("alice", [100], 0)
    assert d.new_ids == 1 and d.rate == pytest.approx(1.01)
    assert d.throttle_ms == throttle_time_ms(1.01, 1, 100_000) == 1000
    assert q.record("alice", [5], 0).throttle_ms == 1000  # the user is over: its next request too
    assert q.record("alice", [-1], 0).throttle_ms == 0  # non-idempotent requests are not charged
    assert q.state("alice", 0)["throttle_ms_total"] == 2000
    d = q.record("alice", range(200, 1200), 0)  # uncapped
    assert d.throttle_ms == round((1101 / 100 - 1) * 100_000)


def test_throttle_ends_as_the_window_moves_on() -> None:
    q = ProducerIdQuotas(make_cfg(users={"alice": {"producer_ids_rate": 1}}), 0)
    assert q.record("alice", range(150), 0).throttle_ms == 50_000
    assert q.record("alice", [1], 40_000).throttle_ms > 0
    assert q.record("alice", [1], SPAN_MS).throttle_ms == 0  # the samples have aged out


def test_users_without_quota_are_not_tracked() -> None:
    q = ProducerIdQuotas(make_cfg(users={"alice": {"producer_byte_rate": 1000}}), 0)
    assert not q.active
    d = q.record("alice", range(10_000), 0)
    assert (d.throttle_ms, d.new_ids, d.match) == (0, 0, None)
    assert q.users == {} and q.memory_bytes() == 0 and q.snapshot(0) == []
    assert q.state("alice", 0)["tracked"] is False


def test_default_user_quota_is_per_user() -> None:
    users = {DEFAULT: {"producer_ids_rate": 1}, "carol": {"producer_ids_rate": 2}}
    q = ProducerIdQuotas(make_cfg(users=users), 0)
    assert q.active
    a = q.record("alice", range(100), 0)
    b = q.record("bob", range(100), 0)  # the same ids, another user: new to bob's filters
    assert (a.new_ids, b.new_ids, a.throttle_ms, b.throttle_ms) == (100, 100, 0, 0)
    assert a.match is not None and (a.match.level, a.match.quota) == (6, 1)
    assert q.record("alice", [1000], 0).throttle_ms == 1000
    assert q.record("bob", [1], 0).throttle_ms == 0  # bob's own bucket
    c = q.record("carol", range(150), 0)
    assert c.match is not None and (c.match.level, c.throttle_ms) == (3, 0)
    assert {user for user, *_ in q.snapshot(0)} == {"alice", "bob", "carol"}


def test_minus_one_is_ignored() -> None:
    q = ProducerIdQuotas(make_cfg(), 0)
    d = q.record("alice", [-1, -1], 0)
    assert (d.new_ids, d.throttle_ms) == (0, 0) and d.match is not None
    assert q.users == {} and q.memory_bytes() == 0
    assert q.record("alice", [-1, 3, 3], 0).new_ids == 1


def test_expiry_frees_filters_then_idle_users() -> None:
    cfg = make_cfg(users={DEFAULT: {"producer_ids_rate": 10}}, max_bytes_per_user=1024)
    cfg = cfg.model_copy(update={"idle_expiry_seconds": 30.0})
    q = ProducerIdQuotas(cfg, 0)
    q.record("alice", [1, 2], 0)
    q.record("bob", [1], 0)
    assert q.memory_bytes() == 1024
    assert q.maybe_expire(W / 2 - 1) == 0
    q.record("bob", [1], 0.6 * W)  # bob stays busy (and this record ran an expiry pass)
    assert len(q.users["bob"].filters.filters()) == 2
    assert q.maybe_expire(W) == 0 and not q.users["alice"].filters.empty  # at most once per half window
    assert q.maybe_expire(1.1 * W) == 0
    assert q.users["alice"].filters.empty  # a window old: freed, the user (its rate) kept
    assert q.memory_bytes() == 512  # bob's newer filter
    # Alice is dropped once idle for the rate's whole window plus idle_expiry_seconds.
    idle_ms = SPAN_MS + 30_000
    assert q.maybe_expire(idle_ms - 1) == 0
    assert q.memory_bytes() == 0  # bob's filters too, long since a window old
    later = idle_ms + W / 2  # the next pass; bob (last seen at 0.6 W) is not yet idle long enough
    assert q.maybe_expire(later) == 1
    assert set(q.users) == {"bob"}
    assert q.state("alice", later)["tracked"] is False
    assert q.record("alice", [1], later).new_ids == 1  # starts afresh


def test_reconfigure_keeps_state_where_it_can() -> None:
    q = ProducerIdQuotas(
        make_cfg(users={"alice": {"producer_ids_rate": 1}, "bob": {"producer_ids_rate": 1}}), 0
    )
    q.record("alice", range(150), 0)
    q.record("bob", [1], 0)
    # A new quota value and new filter sizing: known ids stay known, the rate carries on.
    q.reconfigure(
        make_cfg(users={"alice": {"producer_ids_rate": 3}}, max_bytes_per_user=4096, false_positive_rate=0.01)
    )
    assert set(q.users) == {"alice"}  # bob has no quota any more
    d = q.record("alice", [0, 149], 0)
    assert d.new_ids == 0 and d.rate == pytest.approx(1.5) and d.throttle_ms == 0
    assert q.record("alice", [150], W / 2).new_ids == 1  # second filter: the new sizing
    assert [bloom.nbytes for _, bloom in q.users["alice"].filters.filters()] == [65_536, 2048]
    assert q.record("alice", [5], W / 2 + 1).new_ids == 0  # found in the old-sized filter
    # A new sample count resets the rates only; a new window size drops everything.
    q.reconfigure(make_cfg(users={"alice": {"producer_ids_rate": 3}}, window={"num": 5, "size_seconds": 10}))
    assert q.state("alice", W / 2 + 2)["new_ids_in_window"] == 0
    assert q.record("alice", [5], W / 2 + 2).new_ids == 0
    q.reconfigure(make_cfg(users={"alice": {"producer_ids_rate": 3}}, window={"num": 5, "size_seconds": 20}))
    assert q.users == {}
    assert q.record("alice", [5], W).new_ids == 1


def test_state_for_the_admin_endpoint() -> None:
    q = ProducerIdQuotas(make_cfg(max_bytes_per_user=1024), 0)
    q.record("alice", [1, 2, 3], 0)
    q.record("alice", [4], W / 2)
    s = q.state("alice", W / 2)
    assert (s["quota"], s["level"], s["tracked"], s["new_ids_in_window"]) == (1, 3, True, 4)
    assert s["rate"] == pytest.approx(4 / 105)  # the window: 5 s elapsed, padded by 10 samples of 10 s
    filters = s["filters"]
    assert isinstance(filters, dict)
    assert (filters["count"], filters["bytes"]) == (2, 1024)
    assert [f["ids"] for f in filters["live"]] == [3, 1]
    [(user, rate, throttled, nbytes)] = q.snapshot(W / 2)
    assert (user, throttled, nbytes) == ("alice", 0.0, 1024) and rate == pytest.approx(4 / 105)


def test_pending_throttle_reads_without_recording() -> None:
    cfg = QuotaConfig.model_validate(
        {
            "users": {"alice": {"producer_ids_rate": 1}},
            "producer_ids": {"window": {"num": 2, "size_seconds": 1}},
        }
    )
    quotas = ProducerIdQuotas(cfg, 0.0)
    assert quotas.pending_throttle_ms("alice", 0.0) == 0  # nothing seen yet
    quotas.record("alice", range(1, 4), 0.0)  # 3 ids over a padded 1 s window: 3/s against 1/s
    first = quotas.pending_throttle_ms("alice", 0.0)
    assert first == 2000  # (3 - 1) / 1 * 1000 ms
    assert quotas.pending_throttle_ms("alice", 0.0) == first  # reading twice changes nothing
    assert quotas.pending_throttle_ms("bob", 0.0) == 0  # no quota


# --- steady shaping (the default) ------------------------------------------------------------


def test_producers_started_together_are_spaced_out_at_the_quota() -> None:
    """Eight InitProducerIds at once from a user past its burst: each is charged before it goes
    on, so each waits one id (1 / quota) longer than the last; their answers settle the charge."""
    q = ProducerIdQuotas(make_cfg(window={"num": 3, "size_seconds": 2}, shaping="steady"), 0)
    q.record("alice", range(4), 0)  # the burst: quota x (num - 1) x size = 4 ids
    waits = [q.reserve("alice", 10) for _ in range(8)]
    assert waits == [1000 * (i + 1) - 10 for i in range(8)]
    assert q.settle("alice", 100, 20, reserved=True) == 0
    assert q.record("alice", [100], 30).new_ids == 0  # its Produce: already counted
    before = q.pending_throttle_ms("alice", 40)
    q.settle("alice", 2, 40, reserved=True)  # an id the user had already: the charge goes back
    assert q.pending_throttle_ms("alice", 40) == before - 1000


def test_a_replica_counts_an_id_once_whoever_saw_it_first() -> None:
    q = ProducerIdQuotas(make_cfg(shaping="steady"), 0)
    q.cluster = ClusterLink()
    q.record("alice", [1, 2], 0)
    assert q.take_claims() == [("alice", 1), ("alice", 2)]
    q.add_remote_claims("other", [("alice", 2), ("alice", 3), ("bob", 4)], 10)
    state = q.state("alice", 10)
    assert state["new_ids_in_window"] == 3  # 1, 2 and 3; bob has no quota here
    assert q.take_claims() == []  # the others' ids are not told again


def test_a_quota_set_on_a_busy_user_bites_at_once() -> None:
    """Under steady shaping the user's bucket starts from what its recent new ids leave."""
    q = ProducerIdQuotas(make_cfg(users={"alice": {"producer_ids_rate": 100}}, shaping="steady"), 0)
    for second in range(11):
        q.record("alice", range(second * 200, second * 200 + 200), second * 1000.0)  # 200/s
    q.reconfigure(make_cfg(users={"alice": {"producer_ids_rate": 10}}, shaping="steady"))
    assert q.record("alice", [99_999], 11_000.0).throttle_ms > 0
