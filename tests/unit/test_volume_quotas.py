"""Cluster-wide volume quotas in simulated time: states, delays, limit types, overrides, fail-safe."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.volume import (
    BrokerStatus,
    FailSafe,
    LimitPolicy,
    Reason,
    VolumeOptions,
    VolumeOverride,
    VolumeQuotas,
    VolumeState,
    evaluate_volume,
    threshold_bytes,
)
from quota.volume_message import LimitDefinition, LimitType, VolumeDetails, VolumeSnapshot, decode

T0 = 1_714_564_800_000  # epoch ms: SnapshotAt and now_ms share the wall clock
S = 30_000.0  # staleness
MAX = 1_000  # max throttle delay
CAP = 1_000  # bytes per volume in most cases: thresholds are easy to read

OPEN, THROTTLE, PAUSE = VolumeState.OPEN, VolumeState.THROTTLE, VolumeState.PAUSE
SOFT = LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 20)  # reached at 800 consumed of 1000
HARD = LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10)  # reached at 900 consumed of 1000


def snap(
    at: float,
    *consumed: int,
    soft: LimitDefinition = SOFT,
    hard: LimitDefinition = HARD,
    capacity: int = CAP,
) -> VolumeSnapshot:
    """A snapshot of volumes v0, v1, ... of ``capacity`` bytes with these consumed bytes."""
    vols = tuple(VolumeDetails(f"v{i}", capacity, c) for i, c in enumerate(consumed or (0,)))
    return VolumeSnapshot(int(at), soft, hard, vols)


def cluster(fail_safe: FailSafe = FailSafe.PAUSE, live: tuple[int, ...] = (1, 2, 3)) -> VolumeQuotas:
    """Three live brokers, each with one empty volume at T0."""
    q = VolumeQuotas(VolumeOptions(staleness_ms=S, fail_safe=fail_safe, max_delay_ms=MAX), T0)
    q.set_live_brokers(live, T0)
    for b in live:
        q.update(b, snap(T0, 0), T0)
    return q


def reading(q: VolumeQuotas, now: float) -> tuple[VolumeState, int, Reason]:
    v = q.evaluate(now)
    return v.state, v.delay_ms, v.reason


# --- states and delays -----------------------------------------------------------------------


def test_open_throttle_pause_and_back_as_free_space_moves() -> None:
    q = cluster()
    assert reading(q, T0) == (OPEN, 0, Reason.WITHIN_LIMITS)
    steps = [
        (500, (OPEN, 0, Reason.WITHIN_LIMITS)),
        (800, (OPEN, 0, Reason.WITHIN_LIMITS)),  # at the soft limit: not past it
        (801, (THROTTLE, 10, Reason.SOFT_LIMIT)),  # 1 % of the way: 10 ms
        (850, (THROTTLE, 500, Reason.SOFT_LIMIT)),
        (875, (THROTTLE, 750, Reason.SOFT_LIMIT)),
        (899, (THROTTLE, 990, Reason.SOFT_LIMIT)),
        (900, (PAUSE, MAX, Reason.HARD_LIMIT)),  # at the hard limit
        (990, (PAUSE, MAX, Reason.HARD_LIMIT)),
        (860, (THROTTLE, 600, Reason.SOFT_LIMIT)),  # space freed: back down
        (100, (OPEN, 0, Reason.WITHIN_LIMITS)),
    ]
    now = float(T0)
    for consumed, expected in steps:
        now += 1_000
        q.update(2, snap(now, consumed), now)
        assert reading(q, now) == expected, consumed
        assert q.state(now) is expected[0]
        assert q.produce_delay_ms(now) == expected[1]


def test_the_delay_is_the_largest_over_every_volume_of_every_broker() -> None:
    q = cluster()
    q.update(1, snap(T0, 810, 100), T0)  # 10 % of the way
    q.update(2, snap(T0, 100, 870), T0)  # 70 %
    q.update(3, snap(T0, 840), T0)  # 40 %
    v = q.evaluate(T0)
    assert (v.state, v.delay_ms) == (THROTTLE, 700)
    assert v.worst is not None
    assert (v.worst.broker_id, v.worst.name, v.worst.consumed) == (2, "v1", 870)
    assert v.fraction == pytest.approx(0.7)
    per_volume = sorted((e.broker_id, e.name, e.delay_ms(MAX)) for e in v.volumes)
    assert per_volume == [(1, "v0", 100), (1, "v1", 0), (2, "v0", 0), (2, "v1", 700), (3, "v0", 400)]
    q.update(3, snap(T0, 905), T0)  # one volume at its hard limit pauses the whole cluster
    assert reading(q, T0) == (PAUSE, MAX, Reason.HARD_LIMIT)


def test_a_throttle_never_rounds_to_zero() -> None:
    q = cluster()
    q.update(1, snap(T0, 800_001, capacity=1_000_000), T0)  # one millionth of the way past soft
    assert reading(q, T0) == (THROTTLE, 1, Reason.SOFT_LIMIT)


def test_delays_round_half_up() -> None:
    q = VolumeQuotas(VolumeOptions(staleness_ms=S, max_delay_ms=3), T0)
    q.set_live_brokers([1], T0)
    q.update(1, snap(T0, 850), T0)  # 3 * 0.5 = 1.5 -> 2
    assert q.produce_delay_ms(T0) == 2
    q.update(1, snap(T0, 816), T0)  # 3 * 0.16 = 0.48 -> at least 1
    assert q.produce_delay_ms(T0) == 1
    q.update(1, snap(T0, 883), T0)  # 3 * 0.83 = 2.49 -> 2
    assert q.produce_delay_ms(T0) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, CAP), min_size=2, max_size=20))
def test_delay_grows_with_consumed_space_and_matches_the_state(consumed: list[int]) -> None:
    evals = [evaluate_volume(1, VolumeDetails("v", CAP, c), SOFT, HARD) for c in sorted(consumed)]
    delays = [e.delay_ms(MAX) for e in evals]
    assert delays == sorted(delays)
    for e, d in zip(evals, delays, strict=True):
        assert (e.state is OPEN) == (d == 0) == (e.consumed <= 800)
        assert (e.state is PAUSE) == (e.consumed >= 900)
        if e.state is THROTTLE:
            assert 1 <= d < MAX or (d == MAX and e.consumed == 899)
            assert d == max(1, int((e.consumed - 800) * MAX / 100 + 0.5))


# --- limit types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("soft", "hard", "soft_at", "hard_at", "cases"),
    [
        (  # ConsumedSpace: bytes used
            LimitDefinition(LimitType.CONSUMED_SPACE, 600),
            LimitDefinition(LimitType.CONSUMED_SPACE, 800),
            600,
            800,
            [(600, OPEN, 0), (601, THROTTLE, 5), (700, THROTTLE, 500), (800, PAUSE, MAX)],
        ),
        (  # MinFreeBytes: free bytes falling to the level
            LimitDefinition(LimitType.MIN_FREE_BYTES, 300),
            LimitDefinition(LimitType.MIN_FREE_BYTES, 100),
            700,
            900,
            [(700, OPEN, 0), (750, THROTTLE, 250), (899, THROTTLE, 995), (900, PAUSE, MAX)],
        ),
        (  # MinFreePercentage of the capacity
            LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 25),
            LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 5),
            750,
            950,
            [(750, OPEN, 0), (800, THROTTLE, 250), (940, THROTTLE, 950), (950, PAUSE, MAX)],
        ),
        (  # mixed: soft as a percentage, hard as an absolute minimum
            LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 30),
            LimitDefinition(LimitType.MIN_FREE_BYTES, 50),
            700,
            950,
            [(700, OPEN, 0), (825, THROTTLE, 500), (949, THROTTLE, 996), (950, PAUSE, MAX)],
        ),
        (  # mixed: consumed-space soft with a free-percentage hard
            LimitDefinition(LimitType.CONSUMED_SPACE, 500),
            LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 12.5),
            500,
            875,
            [(500, OPEN, 0), (650, THROTTLE, 400), (874, THROTTLE, 997), (875, PAUSE, MAX)],
        ),
    ],
)
def test_each_limit_type(
    soft: LimitDefinition,
    hard: LimitDefinition,
    soft_at: float,
    hard_at: float,
    cases: list[tuple[int, VolumeState, int]],
) -> None:
    assert threshold_bytes(soft, CAP) == soft_at
    assert threshold_bytes(hard, CAP) == hard_at
    q = cluster()
    for consumed, state, delay in cases:
        q.update(3, snap(T0, consumed, soft=soft, hard=hard), T0)
        assert (q.state(T0), q.produce_delay_ms(T0)) == (state, delay), consumed


def test_a_hard_limit_below_the_soft_one_on_this_volume_pauses_without_throttling() -> None:
    # 10 % free of 1000 is 900 consumed for soft; hard at 500 consumed comes first
    soft = LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10)
    hard = LimitDefinition(LimitType.CONSUMED_SPACE, 500)
    q = cluster()
    q.update(1, snap(T0, 499, soft=soft, hard=hard), T0)
    assert reading(q, T0) == (OPEN, 0, Reason.WITHIN_LIMITS)
    q.update(1, snap(T0, 500, soft=soft, hard=hard), T0)
    assert reading(q, T0) == (PAUSE, MAX, Reason.HARD_LIMIT)
    v = q.evaluate(T0)
    assert v.worst is not None and v.worst.fraction == 1.0


def test_a_full_volume_with_zero_level_limits() -> None:
    soft = LimitDefinition(LimitType.MIN_FREE_BYTES, 100)
    hard = LimitDefinition(LimitType.MIN_FREE_BYTES, 0)
    e = evaluate_volume(1, VolumeDetails("v", CAP, 999), soft, hard)
    assert (e.state, e.delay_ms(MAX), e.free) == (THROTTLE, 990, 1)
    e = evaluate_volume(1, VolumeDetails("v", CAP, CAP), soft, hard)
    assert (e.state, e.delay_ms(MAX), e.free) == (PAUSE, MAX, 0)


# --- per-volume overrides --------------------------------------------------------------------


def test_a_volume_override_in_the_message_replaces_the_broker_wide_limit() -> None:
    q = cluster()
    vols = (
        VolumeDetails("data-0", CAP, 850),  # broker-wide: 50 % of the way
        VolumeDetails(
            "data-1",
            CAP,
            850,  # its own hard limit at 950: 850 is 25 % of the way from 800
            hard_limit=LimitDefinition(LimitType.MIN_FREE_BYTES, 50),
        ),
        VolumeDetails("data-2", CAP, 850, soft_limit=LimitDefinition(LimitType.CONSUMED_SPACE, 860)),
    )
    q.update(1, VolumeSnapshot(T0, SOFT, HARD, vols), T0)
    by_name = {e.name: e for e in q.evaluate(T0).volumes if e.broker_id == 1}
    assert (by_name["data-0"].hard_bytes, by_name["data-0"].delay_ms(MAX)) == (900, 500)
    assert (by_name["data-1"].hard_bytes, by_name["data-1"].delay_ms(MAX)) == (950, 333)
    assert (by_name["data-2"].soft_bytes, by_name["data-2"].state) == (860, OPEN)
    assert q.produce_delay_ms(T0) == 500


def test_the_publishers_policy_puts_overrides_on_their_volumes() -> None:
    policy = LimitPolicy(
        SOFT,
        HARD,
        {"/logs/b": VolumeOverride(hard=LimitDefinition(LimitType.MIN_FREE_BYTES, 50))},
    )
    assert policy.limits_for("/logs/a") == (SOFT, HARD)
    assert policy.limits_for("/logs/b") == (SOFT, LimitDefinition(LimitType.MIN_FREE_BYTES, 50))
    message = policy.snapshot([("/logs/a", CAP, 920), ("/logs/b", CAP, 920)], T0)
    assert message.volumes[0] == VolumeDetails("/logs/a", CAP, 920)
    assert message.volumes[1].hard_limit == LimitDefinition(LimitType.MIN_FREE_BYTES, 50)
    assert message.volumes[1].soft_limit is None
    q = cluster()
    q.update(2, decode(message.encode()), T0)
    v = q.evaluate(T0)
    assert (v.state, v.reason) == (PAUSE, Reason.HARD_LIMIT)  # /logs/a at 920 >= 900
    q.update(2, policy.snapshot([("/logs/a", CAP, 800), ("/logs/b", CAP, 920)], T0), T0)
    assert reading(q, T0) == (THROTTLE, 800, Reason.SOFT_LIMIT)  # /logs/b: (920 - 800) / 150


# --- staleness and the fail-safe -------------------------------------------------------------


def test_a_stale_snapshot_pauses_with_fail_safe_pause() -> None:
    q = cluster()
    assert reading(q, T0 + S) == (OPEN, 0, Reason.WITHIN_LIMITS)  # exactly the staleness: still fresh
    for b in (1, 3):
        q.update(b, snap(T0 + S, 0), T0 + S)
    v = q.evaluate(T0 + S + 1)  # broker 2 published last at T0
    assert (v.state, v.delay_ms, v.reason) == (PAUSE, MAX, Reason.UNKNOWN_BROKER)
    assert v.fail_safe is FailSafe.PAUSE
    assert v.undetermined == ((2, BrokerStatus.STALE),)
    assert [(b.broker_id, b.status) for b in v.brokers] == [
        (1, BrokerStatus.FRESH),
        (2, BrokerStatus.STALE),
        (3, BrokerStatus.FRESH),
    ]
    assert v.describe() == (
        "volume state pause (unknown_broker); delay 1000 ms; worst broker 1 volume v0: 0/1000 bytes used, "
        "0.0% of the way from soft (MinFreePercentage 20) to hard (MinFreePercentage 10); "
        "unknown brokers: 2 stale; fail-safe pause"
    )
    q.update(2, snap(T0 + S + 2, 0), T0 + S + 2)  # it publishes again
    v = q.evaluate(T0 + S + 2)
    assert (v.state, v.reason, v.fail_safe, v.undetermined) == (OPEN, Reason.WITHIN_LIMITS, None, ())


def test_the_default_fail_safe_holds_a_silent_brokers_last_state_for_a_bounded_time() -> None:
    """One broker's publisher stops: its last state (a throttle) still holds for last_known past
    its staleness, then it counts as open and the others decide; it never pauses the cluster."""
    assert VolumeOptions().fail_safe is FailSafe.LAST_KNOWN
    known = 60_000.0
    q = VolumeQuotas(VolumeOptions(staleness_ms=S, max_delay_ms=MAX, last_known_ms=known), T0)
    q.set_live_brokers([1, 2, 3], T0)
    q.update(2, snap(T0, 850), T0)  # broker 2 past its soft limit, then silent
    for b in (1, 3):
        q.update(b, snap(T0 + S, 0), T0 + S)
    v = q.evaluate(T0 + S + 1)
    assert (v.state, v.delay_ms, v.reason) == (THROTTLE, 500, Reason.SOFT_LIMIT)  # its last state holds
    assert (v.fail_safe, v.undetermined) == (FailSafe.LAST_KNOWN, ((2, BrokerStatus.STALE),))
    assert reading(q, T0 + S + known) == (THROTTLE, 500, Reason.SOFT_LIMIT)  # to the bound's end
    for b in (1, 3):
        q.update(b, snap(T0 + S + known, 0), T0 + S + known)
    v = q.evaluate(T0 + S + known + 1)  # past it: open, never paused
    assert (v.state, v.delay_ms, v.reason, v.fail_safe) == (
        OPEN,
        0,
        Reason.WITHIN_LIMITS,
        FailSafe.LAST_KNOWN,
    )


def test_a_broker_never_heard_from_counts_as_open_with_the_default_fail_safe() -> None:
    q = VolumeQuotas(VolumeOptions(staleness_ms=S, max_delay_ms=MAX), T0)
    q.set_live_brokers([1, 2], T0)
    q.update(1, snap(T0, 850), T0)
    v = q.evaluate(T0 + 1)
    assert (v.state, v.reason, v.undetermined) == (THROTTLE, Reason.SOFT_LIMIT, ((2, BrokerStatus.MISSING),))


def test_a_stale_snapshot_is_ignored_with_fail_safe_open() -> None:
    q = cluster(FailSafe.OPEN)
    q.update(2, snap(T0, 950), T0)  # broker 2 past its hard limit, then silent
    q.update(1, snap(T0 + 10_000, 850), T0 + 10_000)
    q.update(3, snap(T0 + 20_000, 0), T0 + 20_000)
    assert reading(q, T0 + S) == (PAUSE, MAX, Reason.HARD_LIMIT)
    v = q.evaluate(T0 + S + 1)  # broker 2's data is stale: it counts as open, broker 1 still throttles
    assert (v.state, v.delay_ms, v.reason) == (THROTTLE, 500, Reason.SOFT_LIMIT)
    assert (v.fail_safe, v.undetermined) == (FailSafe.OPEN, ((2, BrokerStatus.STALE),))
    v = q.evaluate(T0 + 10_000 + S + 1)  # broker 1 stale too
    assert (v.state, v.delay_ms, v.reason) == (OPEN, 0, Reason.WITHIN_LIMITS)
    assert v.undetermined == ((1, BrokerStatus.STALE), (2, BrokerStatus.STALE))
    assert v.describe().endswith("unknown brokers: 1 stale, 2 stale; fail-safe open")


def test_the_fail_safe_does_not_hide_a_hard_limit() -> None:
    q = cluster()
    q.update(1, snap(T0 + S, 950), T0 + S)
    v = q.evaluate(T0 + S + 1)  # brokers 2 and 3 stale, broker 1 paused by its data
    assert (v.state, v.reason, v.fail_safe) == (PAUSE, Reason.HARD_LIMIT, FailSafe.PAUSE)
    assert v.undetermined == ((2, BrokerStatus.STALE), (3, BrokerStatus.STALE))


def test_a_live_broker_with_no_snapshot_at_all() -> None:
    q = cluster()
    q.set_live_brokers([1, 2, 3, 4], T0 + 5)
    v = q.evaluate(T0 + 5)
    assert (v.state, v.delay_ms, v.reason) == (PAUSE, MAX, Reason.UNKNOWN_BROKER)
    assert v.undetermined == ((4, BrokerStatus.MISSING),)
    assert v.brokers[-1].snapshot_at_ms is None and v.brokers[-1].age_ms(T0) is None
    q.update(4, snap(T0 + 6, 0), T0 + 6)
    assert reading(q, T0 + 6) == (OPEN, 0, Reason.WITHIN_LIMITS)

    q = cluster(FailSafe.OPEN)
    q.set_live_brokers([1, 2, 3, 4], T0 + 5)
    v = q.evaluate(T0 + 5)
    assert (v.state, v.delay_ms, v.reason, v.fail_safe) == (OPEN, 0, Reason.WITHIN_LIMITS, FailSafe.OPEN)
    assert v.undetermined == ((4, BrokerStatus.MISSING),)


def test_a_snapshot_of_a_broker_no_longer_live_is_ignored() -> None:
    q = cluster(live=(1, 2, 3, 4))
    q.update(4, snap(T0, 950), T0)
    assert q.state(T0) is PAUSE
    q.set_live_brokers([1, 2, 3], T0 + 1)  # broker 4 leaves the cluster
    v = q.evaluate(T0 + 1)
    assert (v.state, v.reason, v.fail_safe) == (OPEN, Reason.WITHIN_LIMITS, None)
    assert {e.broker_id for e in v.volumes} == {1, 2, 3}
    view = v.brokers[-1]
    assert (view.broker_id, view.live, view.status) == (4, False, BrokerStatus.FRESH)
    assert view.worst is not None and view.worst.state is PAUSE  # still shown, not counted
    q.set_live_brokers([1, 2, 3, 4], T0 + 2)  # it comes back with its snapshot still fresh
    assert q.state(T0 + 2) is PAUSE


def test_a_stale_broker_no_longer_live_does_not_trigger_the_fail_safe_and_is_dropped() -> None:
    q = cluster(live=(1, 2, 3, 4, 5))
    for b in (1, 2, 3):
        q.update(b, snap(T0 + S, 0), T0 + S)
    q.update(5, snap(T0 + S, 0), T0 + S)
    q.reject(5, "bad", T0 + S)
    q.update(6, snap(T0 + S, 0), T0 + S)  # fresh, never live: kept
    v = q.evaluate(T0 + S + 1)
    assert (v.state, v.undetermined) == (PAUSE, ((4, BrokerStatus.STALE), (5, BrokerStatus.INVALID)))
    q.set_live_brokers([1, 2, 3], T0 + S + 1)
    v = q.evaluate(T0 + S + 1)
    assert (v.state, v.undetermined) == (OPEN, ())
    assert [b.broker_id for b in v.brokers] == [1, 2, 3, 6]  # 4 (stale) and 5 (invalid) dropped
    q.set_live_brokers([1, 2, 3, 4], T0 + S + 2)
    assert q.evaluate(T0 + S + 2).undetermined == ((4, BrokerStatus.MISSING),)


def test_before_the_live_brokers_are_known() -> None:
    default = VolumeQuotas(VolumeOptions(staleness_ms=S, max_delay_ms=MAX), T0)
    default.update(1, snap(T0, 850), T0)  # last_known: every fresh snapshot counts meanwhile
    assert reading(default, T0) == (THROTTLE, 500, Reason.SOFT_LIMIT)
    q = VolumeQuotas(VolumeOptions(staleness_ms=S, fail_safe=FailSafe.PAUSE, max_delay_ms=MAX), T0)
    q.update(1, snap(T0, 850), T0)
    v = q.evaluate(T0)
    assert (v.state, v.delay_ms, v.reason) == (PAUSE, MAX, Reason.NO_LIVE_BROKERS)
    assert v.fail_safe is FailSafe.PAUSE
    assert not v.live_known and v.undetermined == ()
    assert "live brokers unknown" in v.describe()
    q.set_live_brokers([], T0)  # told none: no better
    assert reading(q, T0) == (PAUSE, MAX, Reason.NO_LIVE_BROKERS)
    q.set_live_brokers([1], T0)
    assert reading(q, T0) == (THROTTLE, 500, Reason.SOFT_LIMIT)

    q = VolumeQuotas(VolumeOptions(staleness_ms=S, fail_safe=FailSafe.OPEN, max_delay_ms=MAX), T0)
    q.update(1, snap(T0, 850), T0)  # with fail-safe open every fresh snapshot counts meanwhile
    assert reading(q, T0) == (THROTTLE, 500, Reason.SOFT_LIMIT)
    assert q.evaluate(T0).fail_safe is FailSafe.OPEN


def test_a_snapshot_from_the_future_beyond_the_staleness_is_not_trusted() -> None:
    q = cluster()
    q.update(2, snap(T0 + S + 1, 0), T0)  # its clock runs more than the staleness ahead
    v = q.evaluate(T0)
    assert (v.state, v.undetermined) == (PAUSE, ((2, BrokerStatus.FUTURE),))
    assert v.brokers[1].age_ms(T0) == -(S + 1)
    assert q.state(T0 + 1) is OPEN  # now within the staleness
    q.update(2, snap(T0 + 1 + S, 0), T0 + 1)  # exactly the staleness ahead: accepted
    assert q.state(T0 + 1) is OPEN


def test_an_undecodable_record_makes_the_broker_unknown_until_a_good_one() -> None:
    q = cluster()
    q.reject(3, "Volumes[0].Capacity: must be an integer", T0 + 1)
    v = q.evaluate(T0 + 1)
    assert (v.state, v.undetermined) == (PAUSE, ((3, BrokerStatus.INVALID),))
    assert v.brokers[2].error == "Volumes[0].Capacity: must be an integer"
    assert v.brokers[2].snapshot_at_ms == T0  # the last good one, shown but not counted
    assert q.update(3, snap(T0 + 2, 0), T0 + 2) is BrokerStatus.FRESH
    assert q.state(T0 + 2) is OPEN


def test_a_tombstone_forgets_the_broker() -> None:
    q = cluster()
    q.forget(2)
    assert q.evaluate(T0).undetermined == ((2, BrokerStatus.MISSING),)
    q.forget(99)  # unknown: nothing happens
    assert q.state(T0) is PAUSE


def test_update_says_when_a_snapshot_arrives_stale() -> None:
    q = cluster()
    assert q.update(1, snap(T0, 0), T0 + S + 1) is BrokerStatus.STALE
    assert q.update(1, snap(T0, 0), T0 + S) is BrokerStatus.FRESH


def test_reconfigure_rejudges_what_is_held() -> None:
    q = cluster()
    q.update(1, snap(T0, 850), T0)
    assert q.produce_delay_ms(T0) == 500
    q.reconfigure(VolumeOptions(staleness_ms=S, max_delay_ms=4_000))
    assert q.produce_delay_ms(T0) == 2_000
    q.reconfigure(VolumeOptions(staleness_ms=1_000, fail_safe=FailSafe.OPEN, max_delay_ms=4_000))
    v = q.evaluate(T0 + 1_001)
    assert (v.state, v.fail_safe, len(v.undetermined)) == (OPEN, FailSafe.OPEN, 3)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="staleness_ms must be > 0"):
        VolumeOptions(staleness_ms=0)
    with pytest.raises(ValueError, match="max_delay_ms must be >= 1"):
        VolumeOptions(max_delay_ms=0)


# --- the cache and what metrics read ---------------------------------------------------------


def test_the_verdict_is_cached_until_a_snapshot_could_go_stale() -> None:
    q = cluster()
    q.update(2, snap(T0 + 500, 850), T0 + 500)
    v = q.evaluate(T0 + 600)
    assert q.evaluate(T0 + 700) is v
    assert q.evaluate(T0 + S) is v  # brokers 1 and 3 still fresh at exactly the staleness
    assert v.valid_until_ms == pytest.approx(T0 + S) and v.valid_until_ms > T0 + S
    later = q.evaluate(T0 + S + 1)
    assert later is not v and later.state is PAUSE
    assert later.valid_until_ms > T0 + 500 + S  # next change: broker 2 going stale
    assert q.evaluate(T0 + 100) is not later  # a clock that went back is not served the cache
    q.update(1, snap(T0 + S + 1, 0), T0 + S + 1)
    assert q.evaluate(T0 + S + 1).undetermined == ((3, BrokerStatus.STALE),)


def test_per_broker_freshness_and_the_admin_view() -> None:
    q = cluster()
    q.update(2, snap(T0 + 4_000, 850), T0 + 4_100)
    views = q.brokers(T0 + 5_000)
    assert [(b.broker_id, b.live, b.status, b.age_ms(T0 + 5_000), b.received_ms) for b in views] == [
        (1, True, BrokerStatus.FRESH, 5_000, T0),
        (2, True, BrokerStatus.FRESH, 1_000, T0 + 4_100),
        (3, True, BrokerStatus.FRESH, 5_000, T0),
    ]
    out = q.describe(T0 + 5_000)
    json.dumps(out)  # serialisable as is
    assert (out["state"], out["reason"], out["delay_ms"]) == ("throttle", "soft_limit", 500)
    assert out["fraction"] == 0.5
    assert out["live_brokers"] == [1, 2, 3]
    assert out["worst"] == {
        "broker_id": 2,
        "volume": "v0",
        "capacity": 1000,
        "consumed": 850,
        "free": 150,
        "soft": {"type": "MinFreePercentage", "level": 20, "bytes": 800.0},
        "hard": {"type": "MinFreePercentage", "level": 10, "bytes": 900.0},
        "pressure": 0.5,
        "fraction": 0.5,
        "state": "throttle",
    }
    brokers = out["brokers"]
    assert isinstance(brokers, list) and brokers[1]["age_ms"] == 1_000
    assert out["message"] == (
        "volume state throttle (soft_limit); delay 500 ms; worst broker 2 volume v0: 850/1000 bytes used, "
        "50.0% of the way from soft (MinFreePercentage 20) to hard (MinFreePercentage 10)"
    )


def test_severity_orders_the_states() -> None:
    assert [s.severity for s in (OPEN, THROTTLE, PAUSE)] == [0, 1, 2]
    assert [s.value for s in VolumeState] == ["open", "throttle", "pause"]
