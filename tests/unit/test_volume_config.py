"""The ``volume:`` config section: defaults, validation messages, and what it hands the quotas."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from quota.volume import FailSafe, LimitPolicy, VolumeOptions, VolumeOverride, VolumeQuotas, VolumeState
from quota.volume_config import DEFAULT_TOPIC, VolumeConfig
from quota.volume_message import LimitDefinition, LimitType, decode

T0 = 1_714_564_800_000

EXAMPLE = """
enabled: true
topic: ops.volume-usage
publish_interval_seconds: 5
staleness_seconds: 20
fail_safe: open
max_throttle_delay_ms: 2000
soft_limit: {type: MinFreePercentage, value: 20}
hard_limit: {type: MinFreeBytes, value: 1073741824}
volumes:
  /var/lib/kafka/data-1:
    soft_limit: {type: ConsumedSpace, value: 5.0e+9}
source:
  type: statvfs
  log_dirs: [/var/lib/kafka/data-0, /var/lib/kafka/data-1]
  broker_id: 2
"""


def parse(text: str) -> VolumeConfig:
    return VolumeConfig.model_validate(yaml.safe_load(text))


def test_defaults() -> None:
    cfg = VolumeConfig()
    assert not cfg.enabled
    assert cfg.topic == DEFAULT_TOPIC == "__kthrottle_volume_usage"
    assert cfg.fail_safe is FailSafe.LAST_KNOWN and cfg.last_known_seconds == 300
    assert (cfg.publish_interval_seconds, cfg.staleness_seconds, cfg.max_throttle_delay_ms) == (10, 60, 5000)
    assert cfg.source.type == "describe_log_dirs" and cfg.source.log_dirs == []
    assert cfg.policy() == LimitPolicy(
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10), LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 5)
    )
    assert cfg.options() == VolumeOptions(
        staleness_ms=60_000, fail_safe=FailSafe.LAST_KNOWN, max_delay_ms=5000, last_known_ms=300_000
    )


def test_a_full_section() -> None:
    cfg = parse(EXAMPLE)
    assert cfg.enabled and cfg.topic == "ops.volume-usage"
    assert cfg.options() == VolumeOptions(staleness_ms=20_000, fail_safe=FailSafe.OPEN, max_delay_ms=2000)
    policy = cfg.policy()
    assert policy.soft == LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 20)
    assert policy.hard == LimitDefinition(LimitType.MIN_FREE_BYTES, 1_073_741_824)
    assert policy.overrides == {
        "/var/lib/kafka/data-1": VolumeOverride(soft=LimitDefinition(LimitType.CONSUMED_SPACE, 5_000_000_000))
    }
    level = policy.overrides["/var/lib/kafka/data-1"].soft
    assert level is not None and type(level.level) is int  # bytes written as an integer
    assert cfg.source.type == "statvfs"
    assert cfg.source.log_dirs == ["/var/lib/kafka/data-0", "/var/lib/kafka/data-1"]


def test_config_to_message_to_state() -> None:
    """What the publisher writes from its config is what every consumer judges by."""
    cfg = parse(EXAMPLE)
    gib = 1 << 30
    volumes = [("/var/lib/kafka/data-0", 10 * gib, 2 * gib), ("/var/lib/kafka/data-1", 10 * gib, 6 * gib)]
    raw = cfg.policy().snapshot(volumes, T0).encode()
    q = VolumeQuotas(cfg.options(), T0)
    q.set_live_brokers([0], T0)
    q.update(0, decode(raw), T0)
    v = q.evaluate(T0)
    # data-1: soft at 5e9 consumed, hard at 9 GiB consumed: (6 GiB - 5e9) / (9 GiB - 5e9) of 2000 ms
    expected = round(2000 * (6 * gib - 5e9) / (9 * gib - 5e9))
    assert (v.state, v.delay_ms) == (VolumeState.THROTTLE, expected) == (VolumeState.THROTTLE, 619)
    assert v.worst is not None and v.worst.name == "/var/lib/kafka/data-1"


def errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        VolumeConfig.model_validate(data)
    return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.value.errors()]


PCT = "MinFreePercentage"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"soft_limit": {"type": PCT, "value": 100}},
            "soft_limit: Value error, MinFreePercentage value is a percentage between 0 and 100, got 100",
        ),
        (
            {"hard_limit": {"type": PCT, "value": 0}},
            "hard_limit.value: Input should be greater than 0",
        ),
        (
            {"hard_limit": {"type": "MinFreeBytes", "value": -5}},
            "hard_limit.value: Input should be greater than 0",
        ),
        (
            {"soft_limit": {"type": "ConsumedSpace", "value": 10.5}},
            "soft_limit: Value error, ConsumedSpace value is a number of bytes, a whole number, got 10.5",
        ),
        (
            {"soft_limit": {"type": "MinFreeBytes", "value": True}},
            "soft_limit.value: Value error, must be a number, not true/false",
        ),
        (
            {"soft_limit": {"type": "MaxUsed", "value": 1}},
            "soft_limit.type: Input should be 'ConsumedSpace', 'MinFreeBytes' or 'MinFreePercentage'",
        ),
        ({"soft_limit": {"type": PCT}}, "soft_limit.value: Field required"),
        (
            {"soft_limit": {"type": PCT, "value": 20, "unit": "%"}},
            "soft_limit.unit: Extra inputs are not permitted",
        ),
        (
            {"soft_limit": {"type": PCT, "value": 5}, "hard_limit": {"type": PCT, "value": 10}},
            ": Value error, soft_limit (MinFreePercentage 5) must be less strict than hard_limit "
            "(MinFreePercentage 10): a soft limit of MinFreePercentage asks for more free space than the "
            "hard one",
        ),
        (
            {
                "soft_limit": {"type": "MinFreeBytes", "value": 100},
                "hard_limit": {"type": "MinFreeBytes", "value": 100},
            },
            ": Value error, soft_limit (MinFreeBytes 100) must be less strict than hard_limit "
            "(MinFreeBytes 100): a soft limit of MinFreeBytes asks for more free space than the hard one",
        ),
        (
            {
                "soft_limit": {"type": "ConsumedSpace", "value": 900},
                "hard_limit": {"type": "ConsumedSpace", "value": 800},
            },
            ": Value error, soft_limit (ConsumedSpace 900) must be less strict than hard_limit "
            "(ConsumedSpace 800): a soft limit of ConsumedSpace asks for less consumed space than the "
            "hard one",
        ),
        (
            {"volumes": {"/d1": {"hard_limit": {"type": PCT, "value": 15}}}},
            ": Value error, volumes./d1: soft_limit (MinFreePercentage 10) must be less strict than "
            "hard_limit (MinFreePercentage 15): a soft limit of MinFreePercentage asks for more free space "
            "than the hard one",
        ),
        (
            {"volumes": {"/d1": {}}},
            "volumes./d1: Value error, a volume override needs soft_limit, hard_limit or both",
        ),
        (
            {"volumes": {"": {"hard_limit": {"type": PCT, "value": 1}}}},
            "volumes: Value error, a volume name must not be empty",
        ),
        ({"fail_safe": "ignore"}, "fail_safe: Input should be 'last_known', 'pause' or 'open'"),
        (
            {"staleness_seconds": 10, "publish_interval_seconds": 10},
            ": Value error, staleness_seconds (10) must be longer than publish_interval_seconds (10), "
            "or every snapshot goes stale before the next one is published",
        ),
        ({"staleness_seconds": 0}, "staleness_seconds: Input should be greater than 0"),
        ({"max_throttle_delay_ms": 0}, "max_throttle_delay_ms: Input should be greater than or equal to 1"),
        (
            {"topic": "volume usage"},
            "topic: Value error, 'volume usage' is not a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, "
            "not . or ..)",
        ),
        ({"topic": ".."}, "topic: Value error, '..' is not a Kafka topic name"),
        ({"topic": "x" * 250}, "topic: Value error, "),
        (
            {"source": {"type": "statvfs"}},
            "source: Value error, source statvfs needs log_dirs: the mounted log dirs to measure",
        ),
        (
            {"source": {"log_dirs": ["/data"]}},
            "source: Value error, log_dirs is for source statvfs; describe_log_dirs asks the brokers",
        ),
        (
            {"source": {"type": "statvfs", "log_dirs": ["data"]}},
            "source.log_dirs: Value error, log dir 'data' must be an absolute path",
        ),
        (
            {"source": {"type": "statvfs", "log_dirs": ["/a", "/b", "/a"]}},
            "source.log_dirs: Value error, log dirs listed twice: /a",
        ),
        ({"source": {"type": "jmx"}}, "source.type: Input should be 'describe_log_dirs' or 'statvfs'"),
        ({"enable": True}, "enable: Extra inputs are not permitted"),
    ],
)
def test_validation_messages(data: dict[str, Any], expected: str) -> None:
    found = errors(data)
    assert len(found) == 1, found
    assert found[0].startswith(expected), found[0]


def test_soft_and_hard_of_different_types_are_left_to_each_volume() -> None:
    cfg = VolumeConfig.model_validate(
        {"soft_limit": {"type": "ConsumedSpace", "value": 10}, "hard_limit": {"type": PCT, "value": 50}}
    )
    assert cfg.policy().soft.type is LimitType.CONSUMED_SPACE


def test_a_volume_override_may_loosen_or_tighten_when_consistent() -> None:
    cfg = VolumeConfig.model_validate(
        {
            "volumes": {
                "/a": {"soft_limit": {"type": PCT, "value": 30}, "hard_limit": {"type": PCT, "value": 20}},
                "/b": {"hard_limit": {"type": PCT, "value": 2}},
            }
        }
    )
    policy = cfg.policy()
    assert policy.limits_for("/a") == (
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 30),
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 20),
    )
    assert policy.limits_for("/b") == (
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 10),
        LimitDefinition(LimitType.MIN_FREE_PERCENTAGE, 2),
    )
    assert policy.limits_for("/c") == (policy.soft, policy.hard)


def test_the_section_is_immutable() -> None:
    cfg = VolumeConfig()
    with pytest.raises(ValidationError):
        cfg.enabled = True  # type: ignore[misc]
