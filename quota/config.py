"""The quota section of the config: Kafka's entities, key names and defaults, validated.

Shape (YAML)::

    quotas:
      window: {num: 11, size_seconds: 1}       # quota.window.num / quota.window.size.seconds
      dry_run: false                           # compute and report throttles, apply none
      produce_shaping: steady                  # or kafka (QuotaConfig.produce_shaping)
      fetch_shaping: steady                    # or kafka (QuotaConfig.fetch_shaping)
      hold_across_connections: true            # QuotaConfig.hold_across_connections
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
      ips:                                     # KIP-612 connection_creation_rate per client IP
        <default>: {connection_creation_rate: 20}
        10.0.0.7: {connection_creation_rate: 100}
      controller_window: {num: 11, size_seconds: 1}   # controller.quota.window.* (KIP-599 burst)
      mutations: {charge_validate_only: true}
      producer_ids:                            # KIP-936 tracking of producer ids per user
        window: {num: 11, size_seconds: 3600}  # producer.id.quota.window.*
        false_positive_rate: 0.001
        max_bytes_per_user: 131072             # both bloom filters of one user together

``producer_ids_rate`` is a per-user quota (KIP-936): it may be set on a user or the <default>
user, not on a client id or a (user, client-id) pair.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quota.keys import PRODUCER_IDS_RATE, TOPIC_CONSUMER_BYTE_RATE, TOPIC_PRODUCER_BYTE_RATE
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
    # Where the entity's byte rates, controller_mutation_rate and producer_ids_rate hold, when
    # the gateway runs as several replicas. cluster: once across all replicas (the usage goes
    # through the cluster-quota exchange); instance: each replica alone (N replicas allow N
    # times the quota). Unset: cluster when the exchange runs (cluster_quotas.enabled), else
    # instance. request_percentage and connection_creation_rate always hold per replica.
    scope: Literal["instance", "cluster"] | None = None

    @model_validator(mode="after")
    def _scope_of_shared_quotas(self) -> ClientQuotas:
        shared = (
            self.producer_byte_rate,
            self.consumer_byte_rate,
            self.controller_mutation_rate,
            self.producer_ids_rate,
        )
        if self.scope is not None and all(value is None for value in shared):
            raise ValueError(
                f"scope {self.scope} applies to producer_byte_rate, consumer_byte_rate, "
                "controller_mutation_rate and producer_ids_rate: set one"
            )
        return self

    def get(self, key: str) -> Rate | None:
        value: Rate | None = getattr(self, key)
        return value


class UserQuotas(ClientQuotas):
    clients: dict[str, ClientQuotas] = Field(default_factory=dict)


class TopicQuotas(_Strict):
    producer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_PRODUCER_BYTE_RATE)
    consumer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_CONSUMER_BYTE_RATE)
    # As ClientQuotas.scope: each partition's quota once across the gateway's replicas, or per
    # replica (instance).
    scope: Literal["instance", "cluster"] | None = None


class WindowConfig(_Strict):
    num: int = Field(11, ge=1, le=1000)
    size_seconds: float = Field(1.0, gt=0, le=3600)

    def quota_window(self) -> QuotaWindow:
        return QuotaWindow(self.num, self.size_seconds * 1000.0)


class IpQuotas(_Strict):
    connection_creation_rate: Rate | None = Field(None, gt=0)


class MutationOptions(_Strict):
    # Kafka's KRaft controller charges validateOnly CreateTopics/CreatePartitions (KIP-599 said
    # it would not); true follows the broker, false follows the KIP.
    charge_validate_only: bool = True


def _producer_id_window() -> WindowConfig:
    return WindowConfig(num=11, size_seconds=3600.0)


class ProducerIdOptions(_Strict):
    window: WindowConfig = Field(default_factory=_producer_id_window)
    false_positive_rate: float = Field(0.001, gt=0, lt=0.5)
    max_bytes_per_user: int = Field(131072, ge=256, le=64 * 1024 * 1024)
    # steady: a user's new ids are paid into a token bucket at the quota (holding the window's
    # burst), and an InitProducerId is charged for the id it hands out, so producers started
    # together are spaced out at the quota; kafka: KIP-936's windowed rate, charged at Produce.
    shaping: Literal["steady", "kafka"] = "steady"


class QuotaConfig(_Strict):
    window: WindowConfig = Field(default_factory=WindowConfig)
    controller_window: WindowConfig = Field(default_factory=WindowConfig)
    mutations: MutationOptions = Field(default_factory=MutationOptions)
    producer_ids: ProducerIdOptions = Field(default_factory=ProducerIdOptions)
    ips: dict[str, IpQuotas] = Field(default_factory=dict)
    dry_run: bool = False
    # How a producer over producer_byte_rate is throttled. steady: the client throttle is the time
    # a token bucket at the quota (holding Kafka's burst of quota x (num - 1) x size) needs to pay
    # back what the entity took, so no burst is forgotten when a window sample expires; kafka: as
    # a broker does, (rate - quota) / quota x window over the sampled window.
    produce_shaping: Literal["steady", "kafka"] = "steady"
    # How a consumer over consumer_byte_rate is held. steady: each Fetch is sized to what the
    # entity may take now (the same token bucket) and its bytes are delivered with the throttle
    # they cost; kafka: as a broker does, a fetch is capped at quota x (num - 1) x size and one
    # that goes over is answered empty.
    fetch_shaping: Literal["steady", "kafka"] = "steady"
    # An entity throttled on one connection has its other connections' next Produce/Fetch held
    # until the throttle has passed (one quota across connections and brokers, at every moment
    # rather than on average).
    hold_across_connections: bool = True
    users: dict[str, UserQuotas] = Field(default_factory=dict)
    clients: dict[str, ClientQuotas] = Field(default_factory=dict)
    topics: dict[str, TopicQuotas] = Field(default_factory=dict)
    # Entity and partition state unused this long is dropped (Kafka: one hour).
    idle_expiry_seconds: float = Field(3600.0, gt=0)
    # Per-entity and per-partition metric series; the rest are summed under "__other__".
    metrics_max_series: int = Field(500, ge=1, le=100_000)

    @model_validator(mode="after")
    def _producer_ids_per_user_only(self) -> QuotaConfig:
        where = [f"clients.{name}" for name, q in self.clients.items() if q.producer_ids_rate is not None]
        where += [
            f"users.{user}.clients.{name}"
            for user, uq in self.users.items()
            for name, q in uq.clients.items()
            if q.producer_ids_rate is not None
        ]
        if where:
            raise ValueError(
                f"{PRODUCER_IDS_RATE} is a per-user quota (KIP-936); set it on a user or <default> "
                f"user, not on {', '.join(where)}"
            )
        return self
