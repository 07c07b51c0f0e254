"""The ``volume:`` section of the config: cluster-wide disk volume quotas (Strimzi proposal), validated.

Shape (YAML)::

    volume:
      enabled: false
      topic: __kthrottle_volume_usage          # compacted, keyed by broker id
      publish_interval_seconds: 10             # publish on start, then this often
      staleness_seconds: 60                    # snapshots older than this are ignored
      fail_safe: last_known                    # last_known | open | pause: while a broker is unknown
      last_known_seconds: 300                  # last_known: a stale broker's state counts this long
      max_throttle_delay_ms: 5000              # the produce delay at the hard limit
      soft_limit: {type: MinFreePercentage, value: 10}    # throttle past it
      hard_limit: {type: MinFreePercentage, value: 5}     # pause at it
      volumes:                                 # per-volume overrides, by volume name
        /var/lib/kafka/data-1: {hard_limit: {type: MinFreeBytes, value: 10737418240}}
      source:
        type: describe_log_dirs                # the brokers' DescribeLogDirs (KIP-827), gateway mode
        # type: statvfs                        # the mounted log dirs' file systems, sidecar mode
        # log_dirs: [/var/lib/kafka/data-0, /var/lib/kafka/data-1]

Limit types are the proposal's: ConsumedSpace (bytes used), MinFreeBytes, MinFreePercentage (of
the volume's capacity). The limits are published with the usage, so every proxy judges a broker by
the limits of that broker's publisher (quota/volume.py). This module imports nothing of
quota/config.py, so that one may import it.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quota.volume import FailSafe, LimitPolicy, VolumeOptions, VolumeOverride
from quota.volume_message import LimitDefinition, LimitType

DEFAULT_TOPIC = "__kthrottle_volume_usage"
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class _Strict(BaseModel):
    # As quota/config.py's: unknown keys are errors, the parsed config is immutable, and each
    # field's docstring is its description (docs/config.md is generated from them).
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True
    )


class LimitConfig(_Strict):
    """One limit: its type and the value at which it is reached."""

    type: LimitType
    """ConsumedSpace (bytes used), MinFreeBytes, or MinFreePercentage (of the volume's capacity)."""
    value: int | float = Field(gt=0)
    """Bytes (a whole number), or for MinFreePercentage a percentage between 0 and 100."""

    @field_validator("value", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("must be a number, not true/false")
        return value

    @model_validator(mode="after")
    def _in_range(self) -> LimitConfig:
        kind = self.type.value
        if self.type is LimitType.MIN_FREE_PERCENTAGE:
            if not 0 < self.value < 100:
                raise ValueError(f"{kind} value is a percentage between 0 and 100, got {self.value}")
        elif self.value != int(self.value):
            raise ValueError(f"{kind} value is a number of bytes, a whole number, got {self.value}")
        return self

    def definition(self) -> LimitDefinition:
        """The limit as the message carries it (byte counts as integers)."""
        level = self.value if self.type is LimitType.MIN_FREE_PERCENTAGE else int(self.value)
        return LimitDefinition(self.type, level)

    def describe(self) -> str:
        return f"{self.type.value} {self.value}"


def _check_soft_hard(soft: LimitConfig, hard: LimitConfig, where: str) -> None:
    """Soft must be reached before hard when both are of one type (else there is no throttle band)."""
    if soft.type is not hard.type:
        return  # compared per volume, on its capacity, when judged
    if soft.type is LimitType.CONSUMED_SPACE:
        ok, want = soft.value < hard.value, "less consumed space than"
    else:
        ok, want = soft.value > hard.value, "more free space than"
    if not ok:
        raise ValueError(
            f"{where}soft_limit ({soft.describe()}) must be less strict than hard_limit "
            f"({hard.describe()}): a soft limit of {soft.type.value} asks for {want} the hard one"
        )


def _default_soft() -> LimitConfig:
    return LimitConfig(type=LimitType.MIN_FREE_PERCENTAGE, value=10)


def _default_hard() -> LimitConfig:
    return LimitConfig(type=LimitType.MIN_FREE_PERCENTAGE, value=5)


class VolumeOverrideConfig(_Strict):
    """A volume's own limits; the one not given is the broker-wide one."""

    soft_limit: LimitConfig | None = None
    """This volume's soft limit; null: the broker-wide one."""
    hard_limit: LimitConfig | None = None
    """This volume's hard limit; null: the broker-wide one."""

    @model_validator(mode="after")
    def _something(self) -> VolumeOverrideConfig:
        if self.soft_limit is None and self.hard_limit is None:
            raise ValueError("a volume override needs soft_limit, hard_limit or both")
        return self


class VolumeSourceConfig(_Strict):
    """Where the publisher reads usage: the brokers' DescribeLogDirs, or statvfs of local log dirs.

    ``publish: false`` makes this proxy a reader only (other instances publish). With
    ``describe_log_dirs`` the proxy publishes for every live broker, or only ``brokers``; with
    ``statvfs`` for the one broker ``broker_id`` whose log dirs are mounted here (the sidecar).
    """

    type: Literal["describe_log_dirs", "statvfs"] = "describe_log_dirs"
    """describe_log_dirs: ask every broker (DescribeLogDirs v4, KIP-827; gateway); statvfs: the
    file systems of the log dirs mounted here (sidecar)."""
    publish: bool = True
    """false: this proxy is a reader only (other instances publish)."""
    log_dirs: list[str] = Field(default_factory=list)
    """statvfs: the mounted log dirs to measure (absolute paths)."""
    broker_id: int | None = Field(None, ge=0)
    """statvfs: the broker whose log dirs these are."""
    brokers: list[int] | None = None
    """describe_log_dirs: publish for these broker ids only; null: every live broker."""

    @field_validator("log_dirs")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path or not PurePosixPath(path).is_absolute():
                raise ValueError(f"log dir {path!r} must be an absolute path")
        dupes = sorted({p for p in value if value.count(p) > 1})
        if dupes:
            raise ValueError(f"log dirs listed twice: {', '.join(dupes)}")
        return value

    @model_validator(mode="after")
    def _dirs_for_statvfs(self) -> VolumeSourceConfig:
        if self.type == "statvfs" and not self.log_dirs:
            raise ValueError("source statvfs needs log_dirs: the mounted log dirs to measure")
        if self.type == "describe_log_dirs" and self.log_dirs:
            raise ValueError("log_dirs is for source statvfs; describe_log_dirs asks the brokers")
        if self.type == "statvfs" and self.publish and self.broker_id is None:
            raise ValueError("source statvfs needs broker_id: the broker whose log dirs these are")
        if self.type == "statvfs" and self.brokers is not None:
            raise ValueError("brokers is for source describe_log_dirs; statvfs publishes for broker_id")
        return self


class VolumeConfig(_Strict):
    """Cluster-wide disk volume limits: produce is throttled past a soft limit and paused at a
    hard one, on every proxy alike, from the usage every publisher shares through a topic."""

    enabled: bool = False
    """Measure, publish and enforce the volume limits. A change takes effect at restart."""
    topic: str = DEFAULT_TOPIC
    """The compacted usage topic, keyed by broker id (a Kafka topic name). A change takes effect
    at restart."""
    publish_interval_seconds: float = Field(10.0, gt=0, le=3600)
    """Usage is measured and published on start, then this often."""
    staleness_seconds: float = Field(60.0, gt=0, le=86400)
    """A snapshot older than this is stale: its broker's usage is unknown and fail_safe says what
    holds; longer than publish_interval_seconds."""
    fail_safe: FailSafe = FailSafe.LAST_KNOWN
    """What holds while a live broker's usage is unknown (missing, stale, undecodable, or stamped in
    the future). last_known: a stale broker's last snapshot still counts (the state it said,
    throttle included) for last_known_seconds past its staleness, then it counts as open, like a
    broker never heard from, while the others still decide: one broker whose publisher stopped
    does not stop every producer. open: an unknown broker counts as open at once. pause: the
    Strimzi proposal's choice, the strictest: every produce request in the cluster is parked
    while any live broker's usage is unknown."""
    last_known_seconds: float = Field(300.0, ge=0, le=86400)
    """fail_safe last_known: how long past its staleness a broker's last snapshot still counts."""
    max_throttle_delay_ms: int = Field(5000, ge=1, le=600_000)
    """The produce delay at the hard limit; it grows linearly from 0 at the soft limit."""
    soft_limit: LimitConfig = Field(default_factory=_default_soft)
    """Past it, every produce request is throttled (THROTTLE)."""
    hard_limit: LimitConfig = Field(default_factory=_default_hard)
    """At or past it, produce requests are parked (PAUSE); stricter than soft_limit."""
    volumes: dict[str, VolumeOverrideConfig] = Field(default_factory=dict)
    """Per-volume limits, by volume (log dir) name."""
    source: VolumeSourceConfig = Field(default_factory=VolumeSourceConfig)
    """Where usage is measured. A change takes effect at restart."""
    max_parked_bytes: int = Field(64 * 1024 * 1024, ge=0, le=2**40)
    """PAUSE parks produce requests (never forwarded while paused); memory for all of them is
    bounded by this, and past it a request is answered with a retriable error instead."""
    max_park_ms: int = Field(20_000, ge=0, le=600_000)
    """A request parked longer than this is answered with the retriable NOT_ENOUGH_REPLICAS and a
    throttle time."""

    @field_validator("topic")
    @classmethod
    def _topic_name(cls, value: str) -> str:
        if not _TOPIC_NAME.fullmatch(value) or value in (".", ".."):
            raise ValueError(
                f"{value!r} is not a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -, not . or ..)"
            )
        return value

    @field_validator("volumes")
    @classmethod
    def _volume_names(cls, value: dict[str, VolumeOverrideConfig]) -> dict[str, VolumeOverrideConfig]:
        if "" in value:
            raise ValueError("a volume name must not be empty")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> VolumeConfig:
        if self.staleness_seconds <= self.publish_interval_seconds:
            raise ValueError(
                f"staleness_seconds ({self.staleness_seconds:g}) must be longer than "
                f"publish_interval_seconds ({self.publish_interval_seconds:g}), or every snapshot "
                "goes stale before the next one is published"
            )
        _check_soft_hard(self.soft_limit, self.hard_limit, "")
        for name, override in self.volumes.items():
            soft = override.soft_limit or self.soft_limit
            hard = override.hard_limit or self.hard_limit
            _check_soft_hard(soft, hard, f"volumes.{name}: ")
        return self

    def policy(self) -> LimitPolicy:
        """The publisher's limits, as its messages carry them."""
        overrides = {
            name: VolumeOverride(
                o.soft_limit.definition() if o.soft_limit else None,
                o.hard_limit.definition() if o.hard_limit else None,
            )
            for name, o in self.volumes.items()
        }
        return LimitPolicy(self.soft_limit.definition(), self.hard_limit.definition(), overrides)

    def options(self) -> VolumeOptions:
        """The consumer's settings for quota.volume.VolumeQuotas."""
        return VolumeOptions(
            staleness_ms=self.staleness_seconds * 1000.0,
            fail_safe=self.fail_safe,
            max_delay_ms=self.max_throttle_delay_ms,
            last_known_ms=self.last_known_seconds * 1000.0,
        )
