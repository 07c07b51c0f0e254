"""One quota across connections: once an entity is throttled, every one of its connections waits
for the throttle to pass before its next Produce or Fetch is read (QuotaEnforcer.hold_ms)."""

from __future__ import annotations

from typing import Any

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.produce_scan import produce_partitions
from proxy.metrics import ProxyMetrics
from proxy.shared.throttling import QuotaEnforcer
from quota.config import QuotaConfig
from tests.unit.test_messages import _batch


def _produce(records: bytes) -> list[messages.PartitionBytes]:
    topic = {"name": "t", "partition_data": [{"index": 0, "records": records}]}
    req = {"transactional_id": None, "acks": -1, "timeout_ms": 1000, "topic_data": [topic]}
    return produce_partitions(9, messages.encode(ApiKey.PRODUCE, 9, req, response=False))


def _enforcer(now: list[float], **quotas: Any) -> QuotaEnforcer:
    cfg = QuotaConfig.model_validate({"hold_across_connections": True, **quotas})
    return QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])


def test_a_throttled_client_holds_its_other_connections_until_the_throttle_passes() -> None:
    now = [100.0]
    enforcer = _enforcer(now, clients={"app": {"producer_byte_rate": 1000}})
    assert enforcer.hold_ms(True, "ANONYMOUS", "app") == 0
    charge = enforcer.on_produce("ANONYMOUS", "app", 50_000, _produce(_batch(-1)))
    assert charge.throttle_ms > 0
    held = enforcer.hold_ms(True, "ANONYMOUS", "app")
    assert 0 < held <= charge.throttle_ms
    # Another client id, and the fetch direction, are not held.
    assert enforcer.hold_ms(True, "ANONYMOUS", "other") == 0
    assert enforcer.hold_ms(False, "ANONYMOUS", "app") == 0
    now[0] += charge.throttle_ms / 1000.0
    assert enforcer.hold_ms(True, "ANONYMOUS", "app") == 0


def test_a_user_quota_holds_every_client_id_of_the_user() -> None:
    now = [100.0]
    enforcer = _enforcer(now, users={"alice": {"producer_byte_rate": 1000}})
    assert enforcer.on_produce("alice", "one", 50_000, _produce(_batch(-1))).throttle_ms > 0
    assert enforcer.hold_ms(True, "alice", "two") > 0  # the same bucket: the user's
    assert enforcer.hold_ms(True, "bob", "one") == 0


def test_dry_run_and_topic_quotas_hold_nobody() -> None:
    now = [100.0]
    dry = _enforcer(now, dry_run=True, clients={"app": {"producer_byte_rate": 1000}})
    assert dry.on_produce("ANONYMOUS", "app", 50_000, _produce(_batch(-1))).throttle_ms > 0
    assert dry.hold_ms(True, "ANONYMOUS", "app") == 0
    topic = _enforcer(now, topics={"t": {"producer.byte.rate": 10}})
    assert topic.on_produce("ANONYMOUS", "app", 50_000, _produce(_batch(-1) * 100)).throttle_ms > 0
    assert topic.hold_ms(True, "ANONYMOUS", "app") == 0  # a partition's quota is no client's


def test_on_by_default_and_off_when_set() -> None:
    now = [100.0]
    for setting, held in (({}, True), ({"hold_across_connections": False}, False)):
        cfg = QuotaConfig.model_validate({"clients": {"app": {"producer_byte_rate": 1000}}, **setting})
        enforcer = QuotaEnforcer(cfg, ProxyMetrics(), clock=lambda: now[0])
        assert enforcer.on_produce("ANONYMOUS", "app", 50_000, _produce(_batch(-1))).throttle_ms > 0
        assert (enforcer.hold_ms(True, "ANONYMOUS", "app") > 0) is held


def test_holds_that_passed_are_swept() -> None:
    now = [100.0]
    enforcer = _enforcer(now, clients={"<default>": {"producer_byte_rate": 1000}})
    for i in range(50):
        enforcer.on_produce("ANONYMOUS", f"c{i}", 50_000, _produce(_batch(-1)))
    assert len(enforcer._holds) == 50
    now[0] += 3600
    enforcer.expire_idle()
    assert not enforcer._holds
