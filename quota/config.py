"""The quota section of the config: Kafka's entities, key names and defaults, validated.

Shape (YAML)::

    quotas:
      window: {num: 11, size_seconds: 1}       # quota.window.num / quota.window.size.seconds
      dry_run: false                           # compute and report throttles, apply none
      users:
        alice:                                 # /config/users/alice
          producer_byte_rate: 1048576
          clients:
            app-1: {consumer_byte_rate: 2097152}   # /config/users/alice/clients/app-1
            <default>: {producer_byte_rate: 524288}
        <default>: {...}                       # /config/users/<default> (and its clients)
      clients:
        app-2: {producer_byte_rate: 1048576}   # /config/clients/app-2
        <default>: {consumer_byte_rate: ...}
      topics:
        orders: {producer.byte.rate: 2097152}  # per partition of topic orders (KIP-1010)
        <default>: {consumer.byte.rate: ...}
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from quota.keys import TOPIC_CONSUMER_BYTE_RATE, TOPIC_PRODUCER_BYTE_RATE
from quota.rate import QuotaWindow

Rate = float


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ClientQuotas(_Strict):
    """Quota values for one entity; unset means 'no quota of this kind at this level'."""

    producer_byte_rate: Rate | None = Field(None, gt=0)
    consumer_byte_rate: Rate | None = Field(None, gt=0)
    request_percentage: Rate | None = Field(None, gt=0)
    controller_mutation_rate: Rate | None = Field(None, gt=0)
    producer_ids_rate: Rate | None = Field(None, gt=0)

    def get(self, key: str) -> Rate | None:
        value: Rate | None = getattr(self, key)
        return value


class UserQuotas(ClientQuotas):
    clients: dict[str, ClientQuotas] = Field(default_factory=dict)


class TopicQuotas(_Strict):
    producer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_PRODUCER_BYTE_RATE)
    consumer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_CONSUMER_BYTE_RATE)


class WindowConfig(_Strict):
    num: int = Field(11, ge=1, le=1000)
    size_seconds: float = Field(1.0, gt=0, le=3600)

    def quota_window(self) -> QuotaWindow:
        return QuotaWindow(self.num, self.size_seconds * 1000.0)


class QuotaConfig(_Strict):
    window: WindowConfig = Field(default_factory=WindowConfig)
    dry_run: bool = False
    users: dict[str, UserQuotas] = Field(default_factory=dict)
    clients: dict[str, ClientQuotas] = Field(default_factory=dict)
    topics: dict[str, TopicQuotas] = Field(default_factory=dict)
    # Entity and partition state unused this long is dropped (Kafka: one hour).
    idle_expiry_seconds: float = Field(3600.0, gt=0)
    # Per-entity and per-partition metric series; the rest are summed under "__other__".
    metrics_max_series: int = Field(500, ge=1, le=100_000)
