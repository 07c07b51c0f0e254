"""KIP-599 controller mutation quotas in simulated time: Kafka's own cases, precedence, state."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from quota.config import QuotaConfig
from quota.keys import CONTROLLER_MUTATION_RATE, DEFAULT
from quota.mutations import MutationQuotas
from quota.token_bucket import TokenBucket

T0 = 1_000_000.0
TEN_BY_ONE = {"num": 10, "size_seconds": 1}  # the window of Kafka's tests: burst = 10 s of quota


def _cfg(window: dict[str, Any] | None = None, **quotas: Any) -> QuotaConfig:
    data: dict[str, Any] = dict(quotas)
    if window is not None:
        data["controller_window"] = window
    return QuotaConfig.model_validate(data)


def _app(rate: float, window: dict[str, Any] | None = TEN_BY_ONE, **extra: Any) -> QuotaConfig:
    return _cfg(window, clients={"app": {CONTROLLER_MUTATION_RATE: rate}}, **extra)


# --- the bucket -----------------------------------------------------------------------------


def test_fresh_bucket_starts_full_and_refill_is_capped() -> None:
    tb = TokenBucket(rate=5, burst=50, now_ms=T0)
    assert tb.tokens(T0) == 50
    tb.record(30, T0)
    assert tb.tokens(T0) == 20
    assert tb.tokens(T0 + 2000) == pytest.approx(30)
    assert tb.tokens(T0 + 100_000) == 50  # never above the burst
    tb.record(-80, T0 + 100_000)  # giving back never goes past the burst either
    assert tb.tokens(T0 + 100_000) == 50


def test_zero_tokens_is_not_a_violation() -> None:
    tb = TokenBucket(rate=10, burst=100, now_ms=T0)
    tb.record(100, T0)
    assert tb.tokens(T0) == 0 and not tb.exceeded(T0) and tb.throttle_ms(T0) == 0
    tb.record(1, T0)
    assert tb.exceeded(T0) and tb.throttle_ms(T0) == 100


def test_throttle_rounds_half_up_and_is_uncapped() -> None:
    tb = TokenBucket(rate=16, burst=160, now_ms=T0)
    tb.record(161, T0)  # -1 token at 16/s: 62.5 ms, Math.round gives 63 (Python's round, 62)
    assert tb.throttle_ms(T0) == 63
    tb = TokenBucket(rate=1, burst=11, now_ms=T0)
    tb.record(1_000_011, T0)
    assert tb.throttle_ms(T0) == 1_000_000_000


def test_bucket_reconfigure_keeps_tokens_clamped() -> None:
    tb = TokenBucket(rate=10, burst=100, now_ms=T0)
    tb.record(100, T0)
    tb.reconfigure(20, 200, T0 + 1000)  # the first second refills at the old rate
    assert tb.tokens(T0 + 1000) == pytest.approx(10)
    assert tb.tokens(T0 + 2000) == pytest.approx(30)
    tb.reconfigure(1, 11, T0 + 2000)
    assert tb.tokens(T0 + 2000) == 11


# --- Kafka's cases (ControllerMutationQuotaManagerTest) ------------------------------------------


def test_kafka_strict_case() -> None:
    q = MutationQuotas(_app(10), T0)
    first = q.admit("u", "app", [90], strict=True, now_ms=T0)
    assert first.accepted == (True,) and first.throttle_ms == 0 and first.tokens == 10
    second = q.admit("u", "app", [90], strict=True, now_ms=T0)
    # Strict never throttles the request that empties the bucket, only one it refuses.
    assert second.accepted == (True,) and second.throttle_ms == 0 and second.tokens == -80
    third = q.admit("u", "app", [90], strict=True, now_ms=T0)
    assert third.accepted == (False,) and third.throttle_ms == 8000 and third.tokens == -80
    assert third.throttled and third.rejected == 1
    assert q.buckets[("", "app")].tokens.throttle_ms(T0 + 5000) == 3000
    assert q.state("u", "app", T0 + 5000)["throttle_ms"] == 3000


def test_kafka_permissive_case() -> None:
    q = MutationQuotas(_app(10), T0)
    throttles = [q.admit("u", "app", [90], strict=False, now_ms=T0).throttle_ms for _ in range(3)]
    assert throttles == [0, 8000, 17000]
    assert q.buckets[("", "app")].tokens.throttle_ms(T0 + 5000) == 12000


def test_kafka_quota_manager_case() -> None:
    """10 a second for 10 s, a spike of 110 accepted, the next refused for 1 s, then accepted."""
    q = MutationQuotas(_app(10), T0)
    now = T0
    for _ in range(10):
        assert q.admit("u", "app", [10], strict=True, now_ms=now).throttle_ms == 0
        now += 1000
    assert q.admit("u", "app", [110], strict=True, now_ms=now).throttle_ms == 0
    refused = q.admit("u", "app", [110], strict=True, now_ms=now)
    assert refused.accepted == (False,) and refused.throttle_ms == 1000
    now += refused.throttle_ms
    retried = q.admit("u", "app", [110], strict=True, now_ms=now)  # back at exactly 0 tokens
    assert retried.accepted == (True,) and retried.throttle_ms == 0


# --- strict and permissive, several topics ---------------------------------------------------------


def test_strict_refuses_topics_once_below_zero() -> None:
    q = MutationQuotas(_app(2), T0)  # burst 20
    adm = q.admit("u", "app", [30, 30], strict=True, now_ms=T0)
    assert adm.accepted == (True, False)
    assert adm.tokens == -10 and adm.throttle_ms == 5000  # the refusal's: 10 tokens at 2/s
    # Only what was charged counts in the rate (Kafka checks before it records either).
    ((_, _, rate, total),) = q.snapshot(T0)
    assert rate == pytest.approx(30 / 9)  # the window is padded to (num - 1) s
    assert total == 5000


def test_permissive_accepts_everything_and_throttles_after() -> None:
    q = MutationQuotas(_app(2), T0)
    adm = q.admit("u", "app", [30, 30], strict=False, now_ms=T0)
    assert adm.accepted == (True, True) and adm.tokens == -40 and adm.throttle_ms == 20000
    again = q.admit("u", "app", [1], strict=False, now_ms=T0 + 30_000)  # refilled to 20, then 19
    assert again.accepted == (True,) and again.throttle_ms == 0 and again.tokens == pytest.approx(19)
    ((_, _, rate, _),) = q.snapshot(T0 + 30_000)
    assert rate > 0


def test_default_controller_window_gives_a_burst_of_11_seconds() -> None:
    q = MutationQuotas(_cfg(clients={DEFAULT: {CONTROLLER_MUTATION_RATE: 3}}), T0)
    st = q.state("bob", "any", T0)
    assert st["burst"] == 33 and st["tokens"] == 33 and st["level"] == 8
    assert not q.buckets  # reading the state made none


# --- who shares a bucket ----------------------------------------------------------------------------


def test_precedence_and_buckets() -> None:
    cfg = _cfg(
        TEN_BY_ONE,
        users={
            "alice": {
                CONTROLLER_MUTATION_RATE: 5,
                "clients": {"app": {CONTROLLER_MUTATION_RATE: 1}},
            }
        },
        clients={"shared": {CONTROLLER_MUTATION_RATE: 2}},
    )
    q = MutationQuotas(cfg, T0)
    override = q.match("alice", "app")
    assert override is not None and override.level == 1 and override.bucket == ("alice", "app")
    user = q.match("alice", "other")
    assert user is not None and user.level == 3 and user.bucket == ("alice", "")
    # The (user, client-id) override has its own bucket of 10, beside the user's of 50.
    assert q.admit("alice", "app", [10], True, T0).tokens == 0
    assert q.admit("alice", "other", [20], True, T0).tokens == 30
    assert q.admit("alice", "third", [20], True, T0).tokens == 10  # all alice's other clients share
    # A client-id quota is shared by every user of that client id.
    assert q.admit("bob", "shared", [25], True, T0).accepted == (True,)
    carol = q.admit("carol", "shared", [1], True, T0)
    assert carol.accepted == (False,) and carol.bucket == ("", "shared") and carol.throttle_ms == 2500
    assert set(q.buckets) == {("alice", "app"), ("alice", ""), ("", "shared")}


def test_no_quota_creates_no_state() -> None:
    q = MutationQuotas(_cfg(users={"alice": {"producer_byte_rate": 100}}), T0)
    assert not q.active
    adm = q.admit("alice", "app", [10_000, 5], strict=True, now_ms=T0)
    assert adm.accepted == (True, True) and adm.throttle_ms == 0
    assert adm.bucket is None and adm.match is None and math.isinf(adm.tokens)
    assert not q.buckets and q.snapshot(T0) == []
    st = q.state("alice", "app", T0)
    assert st["quota"] is None and st["tokens"] is None and st["bucket"] == {"user": "", "client_id": "app"}


def test_active_when_any_level_has_the_quota() -> None:
    nested = _cfg(users={DEFAULT: {"clients": {"x": {CONTROLLER_MUTATION_RATE: 1}}}})
    assert MutationQuotas(nested, T0).active
    q = MutationQuotas(_cfg(), T0)
    assert not q.active
    q.reconfigure(nested)
    assert q.active


# --- refund, reconfigure, expiry, state ------------------------------------------------------------


def test_refund_gives_tokens_and_rate_back() -> None:
    q = MutationQuotas(_app(2), T0)
    adm = q.admit("u", "app", [15, 10], strict=True, now_ms=T0)
    assert adm.accepted == (True, True) and adm.tokens == -5 and adm.bucket is not None
    q.refund(adm.bucket, 10, T0)  # the broker refused the second topic (it already existed)
    assert q.state("u", "app", T0)["tokens"] == 5
    ((_, _, rate, _),) = q.snapshot(T0)
    assert rate == pytest.approx(15 / 9)
    q.refund(adm.bucket, 1000, T0)
    assert q.state("u", "app", T0)["tokens"] == 20  # never past the burst
    q.refund(("nobody", ""), 5, T0)  # a bucket gone (expired) is no error


def test_reconfigure_keeps_tokens() -> None:
    q = MutationQuotas(_app(10), T0)
    q.admit("u", "app", [90], strict=True, now_ms=T0)  # 10 left
    q.reconfigure(_app(20))
    st = q.state("u", "app", T0)
    assert st["tokens"] == 10 and st["burst"] == 200 and st["quota"] == 20
    # As in Kafka, the time since the bucket's last update refills at the new rate.
    assert q.state("u", "app", T0 + 1000)["tokens"] == pytest.approx(30)
    q.reconfigure(_app(1))  # burst 10: the tokens are clamped
    assert q.state("u", "app", T0 + 1000)["tokens"] == 10
    q.reconfigure(_app(1, window={"num": 5, "size_seconds": 1}))  # burst 5
    assert q.state("u", "app", T0 + 1000)["tokens"] == 5


def test_reconfigure_drops_a_bucket_its_entity_left() -> None:
    q = MutationQuotas(_app(10), T0)
    q.admit("u", "app", [90], strict=True, now_ms=T0)
    q.reconfigure(_cfg(TEN_BY_ONE, users={"u": {CONTROLLER_MUTATION_RATE: 10}}))
    assert not q.buckets
    assert q.admit("u", "app", [0], strict=True, now_ms=T0).tokens == 100  # a fresh, full bucket
    q.reconfigure(_cfg())
    assert not q.buckets and not q.active


def test_expiry_drops_idle_buckets() -> None:
    q = MutationQuotas(_app(10, idle_expiry_seconds=10), T0)
    adm = q.admit("u", "app", [150], strict=False, now_ms=T0)
    assert adm.throttle_ms == 5000
    assert q.maybe_expire(T0 + 500) == 0  # at most once a window
    assert q.maybe_expire(T0 + 5000) == 0  # not idle long enough
    assert q.maybe_expire(T0 + 5500) == 0  # not a window since the last run
    assert q.maybe_expire(T0 + 10_001) == 1
    assert not q.buckets and q.snapshot(T0 + 10_001) == []
    assert q.admit("u", "app", [0], strict=True, now_ms=T0 + 10_001).tokens == 100


def test_state_is_json_and_counts_throttle() -> None:
    q = MutationQuotas(_app(2), T0)
    q.admit("u", "app", [30, 30], strict=True, now_ms=T0)
    q.admit("u", "app", [1], strict=True, now_ms=T0 + 1000)  # still 8 tokens short: 4000 ms
    st = q.state("u", "app", T0 + 1000)
    assert json.loads(json.dumps(st)) == st
    assert st == {
        "quota": 2.0,
        "level": 7,
        "bucket": {"user": "", "client_id": "app"},
        "burst": 20.0,
        "tokens": pytest.approx(-8),
        "mutation_rate": pytest.approx(30 / 9),
        "throttle_ms": 4000,
        "throttle_ms_total": 9000.0,
    }


# --- a gateway replica deciding a cluster-wide quota alone ------------------------------------


def test_a_replica_that_never_read_the_replay_starts_its_part_with_no_burst() -> None:
    """Starting, before it read the exchange, a replica decides alone on its third of the quota.
    A fresh bucket of its own would hold a third of a burst the others may have spent (a rolling
    upgrade measured 1.31 times the mutation quota); it holds nothing until it refills."""
    from quota.cluster_mutations import Alone

    q = MutationQuotas(_app(3.0), T0)
    first = q.admit("u", "app", [2], True, T0, 1 / 3, Alone(T0, None))
    assert first.accepted == (True,)  # strict: charged when the bucket is not below zero
    second = q.admit("u", "app", [2], True, T0 + 100, 1 / 3, Alone(T0, None))
    assert second.accepted == (False,) and second.throttle_ms > 0
    alone = MutationQuotas(_app(3.0), T0)  # a single proxy: Kafka's burst
    assert all(alone.admit("u", "app", [2], True, T0, 1.0).accepted == (True,) for _ in range(5))


def test_a_replica_cut_off_holds_its_part_of_what_the_replay_left() -> None:
    """Cut off after it read the exchange, a replica's own bucket holds its part of the tokens
    the replicas' one bucket had (a debt stays a debt); a bucket the replay dropped was full."""
    from quota.cluster_mutations import Alone, MutationLog
    from quota.cluster_report import MutationRecord

    log = MutationLog()
    spent = MutationRecord("b", 1, "u", "app", ("", "app"), (27,), False, 3.0, 10.0)
    log.apply(spent, T0)  # 30 tokens less 27: 3 left
    q = MutationQuotas(_app(3.0), T0)
    decided = q.admit("u", "app", [1], True, T0, 1 / 3, Alone(T0, log))
    assert decided.tokens == pytest.approx(3 / 3 - 1)
    # Aligned once: from then on its own decisions alone count (3 s refilled at its part, 1/s),
    # until it is alone again.
    assert q.admit("u", "app", [1], True, T0 + 3000, 1 / 3, Alone(T0, log)).tokens == pytest.approx(2)
    again = q.admit("u", "app", [1], True, T0 + 3000, 1 / 3, Alone(T0 + 3000, log))
    assert again.tokens == pytest.approx(3 / 3 - 1)
    fresh = MutationQuotas(_app(3.0), T0)
    full = fresh.admit("u", "app", [1], True, T0, 1 / 3, Alone(T0, MutationLog()))
    assert full.tokens == pytest.approx(30 / 3 - 1)
