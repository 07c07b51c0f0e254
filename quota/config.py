"""The quota section of the config: Kafka's entities, key names and defaults, validated.

Shape (YAML)::

    quotas:
      window: {num: 11, size_seconds: 1}       # quota.window.num / quota.window.size.seconds
      dry_run: false                           # compute and report throttles, apply none
      produce_shaping: steady                  # or kafka (QuotaConfig.produce_shaping)
      fetch_shaping: steady                    # or kafka (QuotaConfig.fetch_shaping)
      hold_across_connections: true            # QuotaConfig.hold_across_connections
      max_throttle_ms: 1000                    # no throttle longer (QuotaConfig.max_throttle_ms)
      exempt:                                  # never throttled or refused, still measured
        users: [replicator]
        client_ids: [ops-admin]
        listeners: []                          # bootstrap, brokers or sidecar
        source_cidrs: [10.20.0.0/16]
      client_id_policy:                        # ids required; empty or shared ids split
        required: false
        template: "anon-{principal}-{source_ip}"
        shared_ids: [rdkafka, producer-*]
      users:
        alice:                                 # /config/users/alice
          producer_byte_rate: 1048576
          clients:
            app-1: {consumer_byte_rate: 2097152}   # /config/users/alice/clients/app-1
            <default>: {producer_byte_rate: 524288}
        <default>: {...}                       # /config/users/<default> (and its clients)
      clients:
        app-2: {producer_byte_rate: 1048576}   # /config/clients/app-2
        worker: {join_group_rate: 0.05}        # group guard rails (quota/group_requests.py)
        <default>: {consumer_byte_rate: ...}
      client_id_prefixes:                      # every client id starting app- shares one bucket
        app-: {producer_byte_rate: 1048576}
      groups:                                  # principals, or client ids, sharing one bucket
        etl: {users: [loader, backfill], consumer_byte_rate: 8388608}
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

import ipaddress
import string
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from quota.keys import DEFAULT, PRODUCER_IDS_RATE, TOPIC_CONSUMER_BYTE_RATE, TOPIC_PRODUCER_BYTE_RATE
from quota.rate import QuotaWindow

Rate = float


# Checked in a config file (validated with the context ``{"config_file": True}``): the quota API's
# overlay and the tuning job's proposals carry names as Kafka has them, which need not be so.
CONFIG_FILE = "config_file"

# The format of the config and quotas files this release writes (``config_version:`` at their
# top) and the newest it reads. A file without the key is version 1, the format before the key
# existed; a newer version is refused by name rather than read as something it is not.
CONFIG_VERSION = 1


def _in_file(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(CONFIG_FILE))


def is_ip_literal(ip: str) -> bool:
    """The proxy matches connections by address, so only IP literals can ever apply."""
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        return False
    return True


def _ip_key(key: str, info: ValidationInfo) -> str:
    """An ``ips`` key is an address as a client connects from it, or <default>: a host name or a
    network would be accepted and never match a connection."""
    if key == DEFAULT or not _in_file(info):
        return key
    if not is_ip_literal(key):
        raise ValueError(
            f"{key!r} is not an IP address: a connection quota applies to the exact address a "
            "client connects from (an IPv4 or IPv6 literal such as 10.0.0.5 or 2001:db8::5, or "
            "<default>); host names and networks never match"
        )
    return key


def _user_key(key: str, info: ValidationInfo) -> str:
    """A ``users`` key is the principal's name, as Kafka's /config/users/<user> has it: a key
    written with the principal's type never matches."""
    if key.startswith("User:") and _in_file(info):
        raise ValueError(
            f"{key!r}: a user key is the principal's name without its type; write "
            f"{key.removeprefix('User:')!r} (Kafka's /config/users/{key.removeprefix('User:')})"
        )
    return key


IpKey = Annotated[str, AfterValidator(_ip_key)]
UserKey = Annotated[str, AfterValidator(_user_key)]


class _Strict(BaseModel):
    # Each field's docstring is its description (docs/config.md is generated from them).
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, use_attribute_docstrings=True
    )


class ClientQuotas(_Strict):
    """Quota values for one entity; unset means 'no quota of this kind at this level'."""

    producer_byte_rate: Rate | None = Field(None, gt=0)
    """Bytes per second of Produce requests (KIP-13), header and body."""
    consumer_byte_rate: Rate | None = Field(None, gt=0)
    """Bytes per second of Fetch responses (KIP-13)."""
    request_percentage: Rate | None = Field(None, gt=0)
    """Percent of one broker thread's time (KIP-124); the proxy charges the time the broker had
    each request to itself."""
    controller_mutation_rate: Rate | None = Field(None, gt=0)
    """Partitions created or deleted per second (KIP-599), a token bucket whose burst is
    controller_window.num x size x rate."""
    producer_ids_rate: Rate | None = Field(None, gt=0)
    """New producer ids per second (KIP-936); on a user or the <default> user only."""
    join_group_rate: Rate | None = Field(None, gt=0)
    """JoinGroup requests of new members (no member id yet: a consumer starting, or restarting in
    a crash loop) per second; one over it waits in the proxy before the group coordinator sees
    it. A token bucket whose burst is window.num x size x rate; per replica."""
    rejoin_group_rate: Rate | None = Field(None, gt=0)
    """JoinGroup requests of members rejoining with their member id, per second (a rebalance
    asks each member for one; a client rejoining by itself again and again is a storm)."""
    sync_group_rate: Rate | None = Field(None, gt=0)
    """SyncGroup requests per second."""
    offset_commit_rate: Rate | None = Field(None, gt=0)
    """OffsetCommit requests per second (a consumer committing after every record)."""
    scope: Literal["instance", "cluster"] | None = None
    """Where the entity's byte rates, controller_mutation_rate and producer_ids_rate hold, when
    the gateway runs as several replicas. cluster: once across all replicas (the usage goes
    through the cluster-quota exchange); instance: each replica alone (N replicas allow N
    times the quota). Unset: cluster when the exchange runs (cluster_quotas.enabled), else
    instance. request_percentage and connection_creation_rate always hold per replica."""

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
    """A user's quotas, and those of its clients (the (user, client-id) levels)."""

    clients: dict[str, ClientQuotas] = Field(default_factory=dict)
    """Quotas of (this user, client id) pairs, by client id (<default>: the user's other clients)."""


class QuotaGroup(ClientQuotas):
    """Principals, or client ids, that share one quota: one bucket for all of them."""

    users: list[UserKey] = Field(default_factory=list)
    """Principals by name (alice, not User:alice): matched after an exact user entry (level 3)."""
    client_ids: list[str] = Field(default_factory=list)
    """Client ids, exactly: matched after an exact client-id entry and the client-id prefixes
    (level 7)."""

    @model_validator(mode="after")
    def _one_kind(self) -> QuotaGroup:
        if bool(self.users) == bool(self.client_ids):
            raise ValueError("a group lists users or client_ids (one of them, not both)")
        if self.producer_ids_rate is not None:
            raise ValueError("producer_ids_rate is per user (KIP-936): set it on the users, not a group")
        return self


class TopicQuotas(_Strict):
    """A topic's quotas: a rate for each of its partitions (KIP-1010)."""

    producer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_PRODUCER_BYTE_RATE)
    """Bytes per second produced to each partition of the topic."""
    consumer_byte_rate: Rate | None = Field(None, gt=0, alias=TOPIC_CONSUMER_BYTE_RATE)
    """Bytes per second fetched from each partition of the topic."""
    scope: Literal["instance", "cluster"] | None = None
    """As a client's scope: each partition's quota once across the gateway's replicas (cluster),
    or per replica (instance)."""


class WindowConfig(_Strict):
    """A sampled window: num samples of size_seconds each."""

    num: int = Field(11, ge=1, le=1000)
    """Number of samples (Kafka's *.window.num)."""
    size_seconds: float = Field(1.0, gt=0, le=3600)
    """Length of one sample (Kafka's *.window.size.seconds)."""

    def quota_window(self) -> QuotaWindow:
        return QuotaWindow(self.num, self.size_seconds * 1000.0)


class IpQuotas(_Strict):
    """A client IP's quota (KIP-612)."""

    connection_creation_rate: Rate | None = Field(None, gt=0)
    """New connections per second from this IP; one over it is accepted, never read from, and
    closed after the throttle time."""


class MutationOptions(_Strict):
    """How controller mutations are charged (KIP-599)."""

    charge_validate_only: bool = True
    """Kafka's KRaft controller charges validateOnly CreateTopics/CreatePartitions (KIP-599 said
    it would not); true follows the broker, false follows the KIP."""


def _producer_id_window() -> WindowConfig:
    return WindowConfig(num=11, size_seconds=3600.0)


class ProducerIdOptions(_Strict):
    """How new producer ids are tracked per user (KIP-936)."""

    window: WindowConfig = Field(default_factory=_producer_id_window)
    """producer.id.quota.window.* (KIP-936's defaults: 11 samples of an hour); a user's bloom
    filters turn over every half window."""
    false_positive_rate: float = Field(0.001, gt=0, lt=0.5)
    """The bloom filters' false positive rate (a new id taken for a known one)."""
    max_bytes_per_user: int = Field(131072, ge=256, le=64 * 1024 * 1024)
    """Both bloom filters of one user together; past their capacity more new ids look known."""
    shaping: Literal["steady", "kafka"] = "steady"
    """steady: a user's new ids are paid into a token bucket at the quota (holding the window's
    burst), and an InitProducerId is charged for the id it hands out, so producers started
    together are spaced out at the quota; kafka: KIP-936's windowed rate, charged at Produce."""


ListenerName = Literal["bootstrap", "brokers", "sidecar"]


def check_networks(value: list[str]) -> list[str]:
    """Networks or single addresses, each strict (no host bits set: the network is named)."""
    for item in value:
        try:
            ipaddress.ip_network(item, strict=True)
        except ValueError as exc:
            hint = ""
            if "host bits set" in str(exc):
                hint = f"; the network is {ipaddress.ip_network(item, strict=False)}"
            raise ValueError(f"{item!r} is not an address or CIDR network{hint}") from exc
    return value


class ExemptConfig(_Strict):
    """Clients never throttled, muted, held or refused by any quota, yet measured and captured as
    everyone else (their rates are shown, their requests captured with ``dry_run`` and nothing
    applied, a throttle decided and not applied counted as ``mode="exempt"``): internal clients,
    replication tools, the operator's own admin. Their bytes owe nothing: no token bucket is
    charged for them, so neither the others of a bucket they share (a user quota, a topic's
    partitions) nor they themselves, once taken off the list, are held back by what they sent. A
    request is exempt when its connection's user, listener or source address, or its client id,
    is listed."""

    users: list[UserKey] = Field(default_factory=list)
    """Principals by name, as the quotas' users keys have them (alice, not User:alice)."""
    client_ids: list[str] = Field(default_factory=list)
    """Client ids, exactly."""
    listeners: list[ListenerName] = Field(default_factory=list)
    """The proxy's listeners (bootstrap and brokers in gateway mode, sidecar in sidecar mode):
    every connection they accept."""
    source_cidrs: list[str] = Field(default_factory=list)
    """Client addresses, as networks (10.0.0.0/8) or single addresses; behind a load balancer, the
    address the PROXY protocol names. Also exempt from connection_creation_rate."""

    @field_validator("source_cidrs")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return check_networks(value)

    @property
    def any(self) -> bool:
        return bool(self.users or self.client_ids or self.listeners or self.source_cidrs)

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(item) for item in self.source_cidrs]


TEMPLATE_FIELDS = ("principal", "source_ip", "listener", "client_id")
"""What a client-id template may name: the connection's principal, source address and listener,
and the id the client sent (empty, or one of the shared ids)."""


def check_template(template: str) -> str:
    """A client-id template's placeholders, checked at load: only names it can fill, at least one
    of them (a constant would put every client back into one bucket)."""
    names = []
    try:
        for _text, name, spec, conversion in string.Formatter().parse(template):
            if name is None:
                continue
            if name not in TEMPLATE_FIELDS or spec or conversion:
                raise ValueError(
                    f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}} "
                    f"is not a placeholder here: use {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}"
                )
            names.append(name)
    except ValueError as exc:
        raise ValueError(f"template {template!r}: {exc}") from None
    if not names:
        raise ValueError(
            f"template {template!r} names nothing of the client, so every id it rewrites would share "
            "one bucket: put {principal} or {source_ip} in it"
        )
    return template


class ClientIdPolicyConfig(_Strict):
    """What a client id must be, and whose bucket an empty or shared one charges. Quotas are kept
    per client id, so every client without one (or with a library's default, rdkafka, producer-1,
    kafka-python-3.0.0) would share a single bucket at the <default> client level and throttle
    each other."""

    required: bool = False
    """Requests a quota charges (Produce, Fetch, CreateTopics, CreatePartitions, DeleteTopics,
    InitProducerId) without a client id (empty or null) are refused: answered with
    POLICY_VIOLATION (44) and a message naming this setting, nothing forwarded, and counted in
    kthrottle_client_id_refused_total; an acks=0 Produce, which has no answer, closes its
    connection. Other requests (ApiVersions, Metadata, SASL, groups) pass, so the client can
    connect and read the error."""
    template: str | None = None
    """The client id the quotas see for a request with an empty id or a shared one, e.g.
    "anon-{principal}-{source_ip}": each principal and address gets its own bucket. Placeholders:
    {principal}, {source_ip}, {listener}, {client_id} (the id sent). Capture records, metrics
    and kthrottle top show the id the quotas saw."""
    shared_ids: list[str] = Field(default_factory=list)
    """Client ids many unrelated clients send (a library's default), rewritten by the template as
    an empty id is; shell-style patterns (producer-*, rdkafka). Needs a template."""

    @field_validator("template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return None if value is None else check_template(value)

    @field_validator("shared_ids")
    @classmethod
    def _shared_ids(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or not pattern.strip("*?"):
                raise ValueError(f"{pattern!r} matches every client id: list the shared ids themselves")
        return value

    @model_validator(mode="after")
    def _shared_needs_template(self) -> ClientIdPolicyConfig:
        if self.shared_ids and self.template is None:
            raise ValueError("shared_ids are rewritten by the template: set template as well")
        return self


class QuotaConfig(_Strict):
    """The quotas, with Kafka's entity levels and key names; reloaded live."""

    window: WindowConfig = Field(default_factory=WindowConfig)
    """The byte rates' and request time's window (quota.window.num / quota.window.size.seconds)."""
    controller_window: WindowConfig = Field(default_factory=WindowConfig)
    """controller.quota.window.*: a mutation bucket's burst is num x size x rate."""
    mutations: MutationOptions = Field(default_factory=MutationOptions)
    """How controller mutations are charged."""
    producer_ids: ProducerIdOptions = Field(default_factory=ProducerIdOptions)
    """How new producer ids are tracked per user."""
    ips: dict[IpKey, IpQuotas] = Field(default_factory=dict)
    """KIP-612 connection_creation_rate per client IP: the exact address before <default>. Keys
    are IPv4 or IPv6 literals (or <default>); a host name or a network is refused, as it would
    never match a connection."""
    dry_run: bool = False
    """Compute, count and log throttles, apply none."""
    produce_shaping: Literal["steady", "kafka"] = "steady"
    """How a producer over producer_byte_rate is throttled. steady: the client throttle is the time
    a token bucket at the quota (holding Kafka's burst of quota x (num - 1) x size) needs to pay
    back what the entity took, so no burst is forgotten when a window sample expires; kafka: as
    a broker does, (rate - quota) / quota x window over the sampled window."""
    fetch_shaping: Literal["steady", "kafka"] = "steady"
    """How a consumer over consumer_byte_rate is held. steady: each Fetch is sized to what the
    entity may take now (the same token bucket) and its bytes are delivered with the throttle
    they cost; kafka: as a broker does, a fetch is capped at quota x (num - 1) x size and one
    that goes over is answered empty."""
    hold_across_connections: bool = True
    """An entity throttled on one connection has its other connections' next Produce/Fetch held
    until the throttle has passed (one quota across connections and brokers, at every moment
    rather than on average)."""
    exempt: ExemptConfig = Field(default_factory=ExemptConfig)
    """Clients no quota holds back, still measured and captured."""
    client_id_policy: ClientIdPolicyConfig = Field(default_factory=ClientIdPolicyConfig)
    """Client ids required, and empty or shared ids given their own bucket."""
    max_throttle_ms: int | None = Field(None, ge=1, le=3_600_000)
    """No byte-rate throttle (producer_byte_rate, consumer_byte_rate, topic rates) and no
    mutation throttle of a strict version (KIP-599) is longer than this, so a burst cannot hold a
    client past its request timeout or a consumer past its poll interval; null: unbounded, as
    Kafka's byte-rate quotas are. What the bound leaves unpaid stays owed in the entity's token
    bucket and is throttled in its next requests, so over time the quota holds: a fetch made
    while its entity owes is answered empty (its bytes not charged), as Kafka answers a
    throttled fetch. A producer's requests are written once read, so one whose requests in flight
    (connections x in-flight requests x batch size) hold more than quota x bound gets more than
    its quota: keep the bound above that. Producer-id waits are not bounded (a shorter wait
    would let new ids through). Needs steady shaping (a kafka-shaped window forgets what it is
    owed)."""

    @field_validator("max_throttle_ms")
    @classmethod
    def _bound_needs_steady(cls, value: int | None, info: ValidationInfo) -> int | None:
        kafka = [k for k in ("produce_shaping", "fetch_shaping") if info.data.get(k) == "kafka"]
        if value is not None and kafka:
            raise ValueError(
                f"a bound needs steady shaping ({' and '.join(kafka)} is kafka): what it leaves unpaid is "
                "carried in the token bucket, and a kafka-shaped window forgets it"
            )
        return value

    users: dict[UserKey, UserQuotas] = Field(default_factory=dict)
    """Quotas by user (the SASL or TLS principal; ANONYMOUS without either), <default> for every
    other user: /config/users/<user>. Keys are the principal's name without its type (alice, not
    User:alice, which is refused)."""
    clients: dict[str, ClientQuotas] = Field(default_factory=dict)
    """Quotas by client id, <default> for every other client id: /config/clients/<client-id>."""
    client_id_prefixes: dict[str, ClientQuotas] = Field(default_factory=dict)
    """Quotas by client-id prefix (app- for app-7f9c..., app-0b31...): every client id starting
    with the prefix shares one bucket; the longest matching prefix wins; matched after an exact
    client-id entry (level 7)."""
    groups: dict[str, QuotaGroup] = Field(default_factory=dict)
    """Named groups of principals or of client ids sharing one quota (one bucket per group)."""
    topics: dict[str, TopicQuotas] = Field(default_factory=dict)
    """Quotas by topic, a rate per partition (KIP-1010), <default> for every other topic."""
    idle_expiry_seconds: float = Field(3600.0, gt=0)
    """Entity and partition state unused this long is dropped (Kafka: one hour)."""
    metrics_max_series: int = Field(500, ge=1, le=100_000)
    """Per-entity and per-partition metric series (the busiest by rate); the rest are summed
    under "__other__"."""

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

    @field_validator("client_id_prefixes")
    @classmethod
    def _prefixes(cls, value: dict[str, ClientQuotas]) -> dict[str, ClientQuotas]:
        for prefix, quotas in value.items():
            if not prefix or prefix == DEFAULT:
                raise ValueError(f"{prefix!r} is not a prefix: give the start of the client ids")
            if quotas.producer_ids_rate is not None:
                raise ValueError(f"{prefix}: {PRODUCER_IDS_RATE} is per user (KIP-936), not per client id")
        return value

    @field_validator("groups")
    @classmethod
    def _one_group_each(cls, value: dict[str, QuotaGroup]) -> dict[str, QuotaGroup]:
        """A principal or client id in two groups would have two buckets: refused by name."""
        seen: dict[tuple[str, str], str] = {}
        for name, group in value.items():
            for kind, members in (("user", group.users), ("client id", group.client_ids)):
                for member in members:
                    other = seen.setdefault((kind, member), name)
                    if other != name:
                        raise ValueError(f"{kind} {member!r} is in groups {other} and {name}: one group each")
        return value
