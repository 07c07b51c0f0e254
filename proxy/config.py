"""The proxy's YAML config: one file, validated at load, errors that name the line and the field."""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core.core_schema import ValidationInfo

from protocol.frames import DEFAULT_MAX_FRAME_BYTES
from quota.config import CONFIG_FILE, CONFIG_VERSION, QuotaConfig, check_networks
from quota.principal_mapping import DEFAULT_RULES, PrincipalMapper
from quota.volume_config import VolumeConfig

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config the proxy refuses; the message names the file, line and field."""


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


class Strict(BaseModel):
    # Each field's docstring is its description (docs/config.md is generated from them).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class AdminConfig(Strict):
    """The admin HTTP server: metrics, health, readiness, the quota endpoints."""

    host: str = "127.0.0.1"
    """Address the admin server listens on: loopback only by default (the chart sets 0.0.0.0)."""
    port: int = Field(9644, ge=0, le=65535)
    """Port of the admin server (0: any free port, reported in the ready file)."""
    enabled: bool = True
    """Run the admin server at all."""
    token_file: Path | None = None
    """State-changing endpoints, and those that name users, client ids or addresses (/quotas,
    /quotas/entity, /quotas/ip, /quotas/client-quotas, /quotas/cluster, /connections), need
    ``Authorization: Bearer <the file's contents>``; the file is read at start and again
    whenever it changes (its path itself needs a restart). Without it they are refused, unless
    allow_unauthenticated_changes / allow_unauthenticated_reads say otherwise. /healthz,
    /readyz, /metrics, /volume and /cluster/peer (the replicas' liveness probe) are always open."""
    allow_unauthenticated_changes: bool = False
    """Allow state-changing endpoints without the token (anyone who reaches the port may change
    quotas)."""
    allow_unauthenticated_reads: bool = False
    """Allow the endpoints that name users, client ids and addresses without the token (anyone
    who reaches the port may read who uses the cluster and how)."""


class QuotaApiConfig(Strict):
    """Kafka's client-quota Admin API (DescribeClientQuotas, AlterClientQuotas; KIP-546)."""

    mode: Literal["proxy", "forward", "both"] = "forward"
    """proxy: answered by the proxy from the quotas it enforces; forward: passed to the brokers
    untouched; both: applied by the proxy and forwarded, the broker's answer returned. A change
    takes effect at restart."""
    admins: list[str] = Field(default_factory=list)
    """Principals allowed to alter ("User:alice"; "User:*" for everyone); others get
    CLUSTER_AUTHORIZATION_FAILED per entry. Changes on reload."""
    describers: list[str] | None = None
    """Principals allowed to describe; null: everyone. Changes on reload."""
    topic: str = Field("__kthrottle_quotas", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """The compacted topic that stores the alterations (created at start if missing). A change
    takes effect at restart."""
    catch_up_timeout_seconds: float = Field(10.0, gt=0, le=300)
    """How long an alteration waits for this instance to have read the topic to its end (its
    value is the entity's whole overlay, so it must start from the latest one)."""
    start_wait_seconds: float = Field(5.0, ge=0, le=300)
    """At start, how long the listeners wait for the store to be read (0: not at all): clients are
    then served with the alterations already in force. Past it the proxy starts with the file's
    quotas and applies the alterations as it reads them."""

    @field_validator("admins", "describers")
    @classmethod
    def _principals(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            kind, sep, name = item.partition(":")
            if not sep or not kind or not name:
                raise ValueError(f"{item!r} is not a principal such as User:alice")
        return value


class TlsFiles(Strict):
    """PEM files of one side's TLS: its own certificate and key, and the CA it trusts.

    The files are read again when they change on disk (checked at most every
    ``reload_check_seconds``), so a rotated certificate takes effect for new connections
    without a restart; a change that does not load is logged and the last good one kept.
    """

    enabled: bool = False
    """Use TLS on this side."""
    certfile: Path | None = None
    """PEM: this side's own certificate (chain); give keyfile with it."""
    keyfile: Path | None = None
    """PEM: the key of certfile."""
    key_password_file: Path | None = None
    """Password of an encrypted keyfile, kept in a file of its own (never in the config)."""
    cafile: Path | None = None
    """PEM: the CA certificates trusted (of client certificates on a listener, of the brokers
    upstream; upstream without it, the system's CAs)."""
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"
    """The oldest TLS version accepted."""
    reload_check_seconds: float = Field(5.0, gt=0, le=3600)
    """The certificate, key and CA files are looked at again at most this often, and reloaded
    when they change on disk."""

    @model_validator(mode="after")
    def _pair(self) -> TlsFiles:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("give certfile and keyfile together")
        return self


class ListenerTls(TlsFiles):
    """TLS on the client-facing listeners, optionally with client certificates (mTLS).

    The principal of a client with a certificate is its subject, mapped by
    ``principal_mapping_rules`` as Kafka's ``ssl.principal.mapping.rules`` maps it; a client
    that logs in with SASL over TLS is the SASL user instead, as on a broker.
    """

    client_auth: Literal["none", "requested", "required"] = "none"
    """Client certificates: not asked for, asked for, or required (Kafka's ssl.client.auth);
    requested or required need cafile."""
    principal_mapping_rules: list[str] = Field(default_factory=lambda: list(DEFAULT_RULES))
    """Kafka's ssl.principal.mapping.rules, one rule per item, applied in order to the
    certificate's subject (RFC 2253, as Java prints it); a subject no rule maps is refused."""

    @model_validator(mode="after")
    def _listener(self) -> ListenerTls:
        if not self.enabled:
            return self
        if self.certfile is None:
            raise ValueError("tls.enabled needs certfile and keyfile (the proxy's server certificate)")
        if self.client_auth != "none" and self.cafile is None:
            raise ValueError(f"client_auth {self.client_auth} needs cafile (the CA of client certificates)")
        PrincipalMapper(self.principal_mapping_rules)
        return self


class ClientSasl(Strict):
    """How clients logging in with OAUTHBEARER or GSSAPI are named (PLAIN and SCRAM name
    themselves): the proxy reads the name from the exchange it forwards and believes it once
    the broker accepts the login."""

    oauthbearer_sub_claim: str = Field("sub", min_length=1)
    """The JWT claim naming an OAUTHBEARER client, as the brokers' sasl.oauthbearer.sub.claim.name
    (a token without one, or an opaque token, is named by its authorization id, or left unnamed)."""
    principal_mapping_rules: list[str] = Field(default_factory=lambda: list(DEFAULT_RULES))
    """Rules from the name an OAUTHBEARER or GSSAPI login shows (a token's subject, a Kerberos
    principal such as alice/host@EXAMPLE.COM) to the principal quotas know, in
    principal_mapping_rules' syntax (RULE:(.*)@EXAMPLE.COM/$1/L): write what the brokers'
    sasl.kerberos.principal.to.local.rules do. A name no rule maps is left unnamed and logged."""

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        PrincipalMapper(value)
        return value


class UpstreamTls(TlsFiles):
    """TLS from the proxy to the brokers: the CA that signed them and, for brokers that want
    client certificates, the proxy's own."""

    check_hostname: bool = True
    """Check that a broker's certificate names the host the proxy connected to."""


class SniConfig(Strict):
    """Route by TLS server name on the bootstrap port, instead of a port per broker.

    Clients are told ``broker_host_template`` (with ``{node_id}``) for each broker and
    ``advertised_port`` (default: the bootstrap port), and DNS sends all those names to the proxy.
    """

    enabled: bool = False
    """Route by TLS server name (needs tls.enabled)."""
    bootstrap_host: str = ""
    """The name clients bootstrap with; a client that sends no server name is taken there too."""
    broker_host_template: str = ""
    """The name of each broker, with {node_id} once, e.g. b{node_id}.kafka.example.com."""
    advertised_port: int | None = Field(None, gt=0, le=65535)
    """The port clients are told (a load balancer's, say); null: the bootstrap port."""

    @model_validator(mode="after")
    def _names(self) -> SniConfig:
        if not self.enabled:
            return self
        if not self.bootstrap_host:
            raise ValueError("sni.enabled needs bootstrap_host (the name clients bootstrap with)")
        if self.broker_host_template.count("{node_id}") != 1:
            raise ValueError(
                "broker_host_template must contain {node_id} once, e.g. b{node_id}.kafka.example.com"
            )
        if self.broker_node(self.bootstrap_host) is not None:
            raise ValueError("bootstrap_host must not match broker_host_template")
        return self

    def broker_host(self, node_id: int) -> str:
        return self.broker_host_template.replace("{node_id}", str(node_id))

    def broker_node(self, server_name: str) -> int | None:
        """The node id a server name stands for, or None when it names no broker."""
        head, _, tail = self.broker_host_template.partition("{node_id}")
        name = server_name.lower().rstrip(".")
        head, tail = head.lower(), tail.lower()
        if not (name.startswith(head) and name.endswith(tail)) or len(name) <= len(head) + len(tail):
            return None
        middle = name[len(head) : len(name) - len(tail)]
        return int(middle) if middle.isdigit() else None


class GatewayConfig(Strict):
    """A bootstrap port plus one port per broker node (a fixed map, else base_port + node_id)."""

    bootstrap_port: int = Field(9092, ge=0, le=65535)
    """The port clients bootstrap from; its connections go to the first reachable
    upstream_bootstrap broker (with sni, the one TLS port of every broker)."""
    broker_port_base: int | None = Field(9100, ge=0, le=65535)
    """Broker node N is reachable at this port + N, unless broker_ports names its port."""
    broker_ports: dict[int, int] = Field(default_factory=dict)
    """Ports given explicitly, by node id, e.g. {1: 19001}."""
    upstream_bootstrap: list[str] = Field(min_length=1)
    """The brokers' addresses (host:port) the proxy discovers the cluster from."""
    sni: SniConfig = Field(default_factory=SniConfig)
    """Route by TLS server name on the bootstrap port instead of a port per broker."""

    @field_validator("upstream_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: list[str]) -> list[str]:
        for item in value:
            _host_port(item)
        return value

    @model_validator(mode="after")
    def _ports_known(self) -> GatewayConfig:
        if self.broker_port_base is None and not self.broker_ports and not self.sni.enabled:
            raise ValueError("set broker_port_base or broker_ports so every broker node gets a proxy port")
        for node, port in self.broker_ports.items():
            if not 0 < port < 65536 or node < 0:
                raise ValueError(f"broker_ports entry {node}: {port} is not a node id and a port")
        return self

    def port_for(self, node_id: int) -> int | None:
        if node_id in self.broker_ports:
            return self.broker_ports[node_id]
        if self.broker_port_base is None:
            return None
        port = self.broker_port_base + node_id
        return port if port < 65536 else None


class SidecarConfig(Strict):
    """One listener in front of the broker in the same pod."""

    listen_port: int = Field(9092, ge=0, le=65535)
    """The port clients connect to."""
    upstream: str = "127.0.0.1:9093"
    """The broker's listener (host:port) the proxy forwards to."""
    advertised_host: str | None = None
    """Host clients are told for this broker; null keeps the host the broker advertises and
    replaces only the port."""

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        _host_port(value)
        return value


class UpstreamSasl(Strict):
    """The proxy's own login, for its broker discovery when the upstream listener needs SASL."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    """The SASL mechanism."""
    username: str = Field(min_length=1)
    """The proxy's own user name."""
    password: str | None = None
    """Its password, inline; give exactly one of password and password_file."""
    password_file: Path | None = None
    """A file holding its password (surrounding white space ignored)."""

    @model_validator(mode="after")
    def _one_password(self) -> UpstreamSasl:
        if (self.password is None) == (self.password_file is None):
            raise ValueError("give exactly one of password and password_file")
        return self

    def secret(self) -> str:
        """The password, registered for redaction from the logs (proxy/secrets.py)."""
        from proxy.secrets import register

        if self.password is not None:
            return register(self.password)
        assert self.password_file is not None
        return register(self.password_file.read_text(encoding="utf-8").strip())


class CaptureKafkaConfig(Strict):
    """The Kafka capture sink (``capture.sink: kafka``): one JSON message per record on a topic.

    The proxy's own producer connects to the brokers directly, never through the proxy, so it is
    never throttled by itself.
    """

    topic: str = Field("__kthrottle_capture", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """The capture topic."""
    bootstrap_servers: list[str] | None = Field(None, min_length=1)
    """Where the producer connects; null: the proxy's upstream brokers (gateway.upstream_bootstrap,
    or sidecar.upstream). The proxy's own listener is refused."""
    create_topic: bool = True
    """Create the topic at start when missing (cleanup.policy=delete)."""
    partitions: int = Field(3, ge=1, le=100_000)
    """Partitions of the topic, for create_topic."""
    replication_factor: int = Field(-1, ge=-1, le=32767)
    """Replication factor of the topic, for create_topic; -1: the brokers' default.replication.factor."""
    retention_ms: int = Field(7 * 86400 * 1000, ge=-1)
    """retention.ms of the topic, for create_topic (7 days); -1: keep forever."""
    compression: Literal["zstd", "gzip", "lz4", "snappy", "none"] | None = None
    """The producer's compression; null: zstd if its Python package is installed, else gzip."""
    buffer_bytes: int = Field(32 * 1024 * 1024, ge=64 * 1024, le=2**31)
    """Bytes handed to the producer and not yet acknowledged; past this, records are dropped."""
    linger_ms: int = Field(100, ge=0, le=10_000)
    """The producer's linger.ms."""
    delivery_timeout_ms: int = Field(30_000, ge=1000, le=600_000)
    """A record not acknowledged by then counts as a write error; at least linger_ms + 1000."""
    close_timeout_seconds: float = Field(5.0, ge=0, le=120)
    """Flush on shutdown, at most this long."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            _host_port(item)
        return value

    @model_validator(mode="after")
    def _delivery_after_linger(self) -> CaptureKafkaConfig:
        if self.delivery_timeout_ms < self.linger_ms + 1000:
            raise ValueError("delivery_timeout_ms must be at least linger_ms + 1000")
        return self

    @field_validator("compression")
    @classmethod
    def _codec_available(cls, value: str | None) -> str | None:
        if value in (None, "none", "gzip"):
            return value
        from kafka import codec

        if not getattr(codec, f"has_{value}")():
            raise ValueError(f"{value} compression needs its Python package, which is not installed")
        return value


class CaptureConfig(Strict):
    """Traffic capture: one record per request (quota/capture_schema.py) to rolling Parquet files,
    or (``sink: kafka``) to a Kafka topic."""

    enabled: bool = False
    """Capture a record of every request (files need pyarrow: kthrottle[capture])."""
    sink: Literal["files", "kafka"] = "files"
    """Where records go: rolling Parquet files, or a Kafka topic (capture.kafka)."""
    kafka: CaptureKafkaConfig = Field(default_factory=CaptureKafkaConfig)
    """The Kafka sink's settings (sink: kafka)."""
    directory: Path = Path("capture")
    """Directory of the capture files (relative: to the proxy's working directory)."""
    instance: str | None = None
    """Names this proxy in the records and file names (and is the Kafka sink's message key);
    null: the host name."""
    max_file_bytes: int = Field(128 * 1024 * 1024, ge=64 * 1024, le=2**40)
    """A file is closed at this size..."""
    max_file_seconds: float = Field(300.0, ge=1, le=86400)
    """...or this age, whichever comes first."""
    retention_files: int = Field(288, ge=1, le=1_000_000)
    """Completed files kept, oldest deleted first."""
    retention_seconds: float | None = Field(7 * 86400.0, gt=0)
    """And none older than this; null: no age limit."""
    queue_records: int = Field(200_000, ge=1000, le=10_000_000)
    """Records waiting for the writer; past this they are dropped and counted (traffic is never
    slowed)."""
    batch_records: int = Field(8192, ge=16, le=1_000_000)
    """Records a Parquet row group holds: rows are gathered until then before they are written."""
    flush_seconds: float = Field(1.0, gt=0, le=60)
    """The writer thread wakes at least this often to write what is queued."""

    @model_validator(mode="after")
    def _files_need_pyarrow(self) -> CaptureConfig:
        if self.enabled and self.sink == "files" and not parquet_available():
            raise ValueError(PARQUET_MISSING)
        return self


PARQUET_MISSING = (
    "capture to files writes Parquet, which needs pyarrow, and this installation has none: install "
    "kthrottle[capture] (the container image: build it with --build-arg KTHROTTLE_EXTRAS=capture), or "
    "use sink: kafka"
)


def parquet_available() -> bool:
    """Whether pyarrow can be imported: the lean install (and image) leaves it out."""
    return importlib.util.find_spec("pyarrow") is not None


class ExchangeConfig(Strict):
    """The proxy's own Kafka client for state shared between proxy instances (compacted topics):
    it connects to the brokers directly, never through a proxy, so it is never throttled."""

    bootstrap_servers: list[str] | None = None
    """Where the exchange client connects (host:port); null: the upstream addresses."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    """Kafka's security.protocol; null: from upstream_tls and upstream_sasl. SASL logs in with
    upstream_sasl."""
    ssl_cafile: Path | None = None
    """PEM: the CA that signed the brokers' certificates."""
    ssl_certfile: Path | None = None
    """PEM: the client certificate (mTLS); give ssl_keyfile with it."""
    ssl_keyfile: Path | None = None
    """PEM: the key of ssl_certfile."""
    request_timeout_seconds: float = Field(10.0, gt=0, le=300)
    """The exchange client's request timeout; also how long a cluster-wide mutation waits to be
    read back from the exchange before this replica decides it on its own part of the quota."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_bootstrap(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            _host_port(item)
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ExchangeConfig:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("give ssl_certfile and ssl_keyfile together")
        return self


class ClusterQuotaConfig(Strict):
    """One quota across the gateway's replicas (quota/cluster.py): the exchange of usage between
    them, through a topic on the Kafka cluster they front. It runs when ``enabled`` (the chart
    sets it for more than one replica) or when an entity asks for ``scope: cluster``."""

    enabled: bool = False
    """Run the exchange: every quota (unless its entity says scope: instance) holds once across the
    replicas. The chart sets it for more than one gateway replica; a reload that turns it on starts
    the exchange on the running proxy."""
    replicas: int = Field(1, ge=1, le=10_000, validation_alias=AliasChoices("replicas", "assumed_instances"))
    """How many replicas share the quotas: while the exchange cannot be trusted before it has
    told how many are live, each holds quota / replicas (the chart: gateway.replicas, or the
    autoscaler's maxReplicas)."""
    topic: str = Field("__kthrottle_cluster_usage", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """The exchange topic, on the cluster the gateway fronts (no new server to run). A change takes
    effect at restart."""
    instance: str | None = None
    """Unique per replica; null: host name, process id, random suffix. A change takes effect at
    restart."""
    peer_host: str | None = None
    """Where the other replicas reach this one's admin port to ask whether it is alive when its
    reports stop; null: $KTHROTTLE_POD_IP (the chart sets it), else the host name's address."""
    hot_interval_seconds: float = Field(0.25, gt=0, le=10)
    """Usage of the buckets under pressure (throttled, half their burst gone, or given out here
    faster than the others are told) goes out this often; at most publish_interval_seconds."""
    publish_interval_seconds: float = Field(2.0, gt=0, le=60)
    """A report (empty if need be) at least this often: the heartbeat the staleness is judged on."""
    full_interval_seconds: float = Field(10.0, gt=0, le=600)
    """Every bucket's usage at least this often (far from its quota, a bucket's usage can wait: at
    10,000 client ids the full report is most of the exchange's cost); at least
    publish_interval_seconds."""
    staleness_seconds: float = Field(5.0, gt=0, le=3600)
    """A replica not heard from for this long (this one: its own report not read back) no longer
    counts as sharing through the exchange: it is asked whether it is alive, and the fallback
    applies. The fallback: a replica cut off from the exchange holds every cluster-wide quota
    (byte rates, mutations, producer ids) at quota / replicas last seen on its own clients, and
    the others share what is left, so together they never exceed a quota; a replica found dead
    frees its part at once. More than twice publish_interval_seconds."""
    peer_grace_seconds: float = Field(30.0, gt=0, le=3600)
    """A silent replica that cannot be reached at all is taken as gone after this long; at least
    staleness_seconds."""
    retention_seconds: float = Field(600.0, ge=60, le=7 * 86400)
    """retention.ms of the exchange topic (its segments roll at a quarter of it)."""

    @model_validator(mode="after")
    def _intervals(self) -> ClusterQuotaConfig:
        if self.hot_interval_seconds > self.publish_interval_seconds:
            raise ValueError("hot_interval_seconds must not be more than publish_interval_seconds")
        if self.full_interval_seconds < self.publish_interval_seconds:
            raise ValueError("full_interval_seconds must be at least publish_interval_seconds")
        if self.staleness_seconds <= 2 * self.publish_interval_seconds:
            raise ValueError("staleness_seconds must be more than twice publish_interval_seconds")
        if self.peer_grace_seconds < self.staleness_seconds:
            raise ValueError("peer_grace_seconds must be at least staleness_seconds")
        return self


ProxyProtocolListener = Literal["bootstrap", "brokers", "sidecar", "all"]


class ProxyProtocolConfig(Strict):
    """The PROXY protocol (HAProxy's, v1 and v2) on client listeners behind a load balancer.

    A listener named here requires the header at the start of every connection and takes the
    client's address from it (connection-rate quotas, capture, logs); a connection without a
    valid header, or from an address outside ``trusted_sources``, is refused. Off by default.
    """

    listeners: list[ProxyProtocolListener] = Field(default_factory=list)
    """The listeners that require the header. bootstrap: the gateway's bootstrap port (with
    gateway.sni, the one TLS port of all brokers); brokers: every per-broker port; sidecar: the
    sidecar's port; all: every one."""
    trusted_sources: list[str] = Field(default_factory=list)
    """Addresses (CIDR, or single addresses) of the load balancers allowed to connect and send a
    header: a header from anywhere else would let a client name any address it likes."""

    @field_validator("listeners")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"{value} names a listener twice")
        return value

    @field_validator("trusted_sources")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return check_networks(value)

    @model_validator(mode="after")
    def _sources_given(self) -> ProxyProtocolConfig:
        if self.listeners and not self.trusted_sources:
            raise ValueError(
                "listeners with the PROXY protocol need trusted_sources: the load balancers' addresses "
                "(0.0.0.0/0 and ::/0 trust any, which lets anyone who reaches the port claim any address)"
            )
        return self

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(item) for item in self.trusted_sources]

    def applies_to(self, listener: str) -> bool:
        """Whether the listener of this name (bootstrap, broker-<id>, sidecar) requires the header."""
        if not self.listeners:
            return False
        kind = "brokers" if listener.startswith("broker-") else listener
        return "all" in self.listeners or kind in self.listeners


class ProxyConfig(Strict):
    """The whole config file (``kthrottle.yaml``)."""

    config_version: int = Field(CONFIG_VERSION, ge=1, le=CONFIG_VERSION)
    """The format of this file. Without it a file is read as version 1 (the format before the key
    existed); a file of a newer format than this release reads is refused by name, never read as
    something else. The chart and ``kthrottle tune`` write it."""
    mode: Literal["gateway", "sidecar"] = "gateway"
    """gateway: in front of the whole cluster (needs the gateway section); sidecar: in front of one
    broker (needs the sidecar section)."""
    bind_host: str = "127.0.0.1"
    """Address the client listeners bind to (0.0.0.0: all)."""
    advertised_host: str = "127.0.0.1"
    """The host clients are told to connect to (Metadata, FindCoordinator, ...), in gateway mode."""
    gateway: GatewayConfig | None = None
    """The gateway's listeners and upstream brokers (mode gateway)."""
    sidecar: SidecarConfig | None = None
    """The sidecar's listener and broker (mode sidecar)."""
    max_frame_bytes: int = Field(DEFAULT_MAX_FRAME_BYTES, ge=1024, le=2**31 - 1)
    """A frame whose size prefix is larger closes its connection; like the broker's
    socket.request.max.bytes."""
    splice_responses: bool = True
    """A large response no stage needs whole (a bulk Fetch's) goes from the broker's socket to
    the client's by splice(2), its records never copied through the proxy (Linux, both sides
    plaintext; TLS and other systems stream it as before). false: always through user space."""
    connect_timeout_seconds: float = Field(10.0, gt=0, le=300)
    """Connecting to a broker gives up after this long; also the time a PROXY protocol header has
    to arrive."""
    upstream_reconnect_backoff_ms: int = Field(50, ge=1, le=60_000)
    """After a connect to a broker address fails, the next one to it waits this long, doubled on
    each failure up to upstream_reconnect_backoff_max_ms (with 20% jitter), as Kafka's clients'
    reconnect.backoff.ms: a client whose broker is down is held that long, then closed, instead
    of every reconnect of every client hitting the dead broker at once. A success resets it."""
    upstream_reconnect_backoff_max_ms: int = Field(1000, ge=1, le=60_000)
    """The longest wait between connects to a broker address that keeps failing (Kafka's
    reconnect.backoff.max.ms); at least upstream_reconnect_backoff_ms. A client is held at most
    this long before its connect is tried: keep it well under the clients' request.timeout.ms
    (30 s by default). Both apply at a reload."""
    client_frame_timeout_seconds: float | None = Field(60.0, gt=0, le=3600)
    """A request frame still incomplete this long after its first byte closes the connection (a
    slowloris). Real clients write a frame at once, and their own request.timeout.ms (30 s by
    default, sending included) gives up first. Time spent muted by a throttle does not count.
    null: no deadline (the broker's connections.max.idle.ms still closes a silent one)."""
    silent_connection_close_seconds: float | None = Field(600.0, gt=0, le=86400)
    """A client connection that has sent nothing this long after it was accepted is closed, as the
    broker's connections.max.idle.ms (10 minutes by default) closes an idle one. The proxy opens
    the upstream connection when a client first sends, so until then a silent connection costs the
    broker nothing; null: kept until the client leaves."""
    drain_seconds: float = Field(10.0, ge=0, le=600)
    """On SIGTERM: stop accepting, let in-flight requests finish for at most this long."""
    metadata_refresh_seconds: float = Field(30.0, gt=0, le=3600)
    """How often the proxy asks the brokers for the cluster's brokers (every second until one
    answers)."""
    admin: AdminConfig = Field(default_factory=AdminConfig)
    """The admin HTTP server."""
    tls: ListenerTls = Field(default_factory=ListenerTls)
    """TLS on the client-facing listeners."""
    upstream_tls: UpstreamTls = Field(default_factory=UpstreamTls)
    """TLS on every connection the proxy makes to a broker."""
    client_sasl: ClientSasl = Field(default_factory=ClientSasl)
    """How clients logging in with OAUTHBEARER or GSSAPI are named."""
    upstream_sasl: UpstreamSasl | None = None
    """The proxy's own SASL login to the brokers (discovery, the exchanges, the Kafka capture
    sink); client connections keep their own SASL exchange, which the proxy forwards."""
    proxy_protocol: ProxyProtocolConfig = Field(default_factory=ProxyProtocolConfig)
    """The PROXY protocol on client listeners behind a load balancer (off unless listeners are named)."""
    quotas: QuotaConfig = Field(default_factory=QuotaConfig)
    """The quotas, inline; or in quotas_file, not both."""
    quotas_file: Path | None = None
    """Quotas kept in a file of their own (``quotas:`` at its top, as `kthrottle tune` writes it),
    reloaded like the main file; relative to the main config file's directory."""
    capture: CaptureConfig = Field(default_factory=CaptureConfig)
    """Traffic capture, the tuning job's input."""
    exchange: ExchangeConfig = Field(default_factory=ExchangeConfig)
    """The proxy's own Kafka client for the topics proxy instances share."""
    volume: VolumeConfig = Field(default_factory=VolumeConfig)
    """Cluster-wide disk volume limits (the Strimzi proposal)."""
    cluster_quotas: ClusterQuotaConfig = Field(default_factory=ClusterQuotaConfig)
    """One quota across gateway replicas."""
    quota_api: QuotaApiConfig = Field(default_factory=QuotaApiConfig)
    """Kafka's client-quota Admin API (KIP-546)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """The log level; changes on reload."""

    @field_validator("proxy_protocol")
    @classmethod
    def _proxy_protocol_listeners(
        cls, value: ProxyProtocolConfig, info: ValidationInfo
    ) -> ProxyProtocolConfig:
        """The listeners named must be ones this mode has (mode and its sections come first)."""
        mode, gateway = info.data.get("mode"), info.data.get("gateway")
        for name in value.listeners:
            if name == "sidecar" and mode != "sidecar":
                raise ValueError("listeners: sidecar is the sidecar mode's listener; this is mode gateway")
            if name in ("bootstrap", "brokers") and mode != "gateway":
                raise ValueError(f"listeners: {name} is a gateway listener; mode sidecar has one, sidecar")
            if name == "brokers" and gateway is not None and gateway.sni.enabled:
                raise ValueError(
                    "listeners: with gateway.sni every broker is reached through the bootstrap listener "
                    "(there are no broker ports): name bootstrap"
                )
        return value

    @field_validator("bind_host")
    @classmethod
    def _check_bind(cls, value: str) -> str:
        if value not in ("localhost", "") and not value.replace(".", "").isalnum():
            try:
                ipaddress.ip_address(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not an address to bind") from exc
        return value

    @model_validator(mode="after")
    def _mode_section(self) -> ProxyConfig:
        if self.upstream_reconnect_backoff_max_ms < self.upstream_reconnect_backoff_ms:
            raise ValueError(
                "upstream_reconnect_backoff_max_ms must be at least upstream_reconnect_backoff_ms"
            )
        if self.mode == "gateway" and self.gateway is None:
            raise ValueError("mode gateway needs a 'gateway' section with upstream_bootstrap")
        if self.mode == "sidecar" and self.sidecar is None:
            raise ValueError("mode sidecar needs a 'sidecar' section")
        if self.gateway is not None and self.gateway.sni.enabled and not self.tls.enabled:
            raise ValueError("gateway.sni needs tls.enabled: the server name comes in the TLS handshake")
        self._capture_goes_direct()
        return self

    def _capture_goes_direct(self) -> None:
        """The capture producer must reach the brokers directly: through the proxy it would be
        captured and throttled by the proxy it reports on."""
        servers = self.capture.kafka.bootstrap_servers
        if not (self.capture.enabled and self.capture.sink == "kafka" and servers):
            return
        own_hosts = {self.bind_host, self.advertised_host, "localhost", "127.0.0.1", "0.0.0.0", "::1", ""}
        own_ports = set()
        if self.gateway is not None:
            own_ports |= {self.gateway.bootstrap_port, *self.gateway.broker_ports.values()}
        if self.sidecar is not None:
            own_ports.add(self.sidecar.listen_port)
        for item in servers:
            host, port = _host_port(item)
            if host in own_hosts and port in own_ports:
                raise ValueError(
                    f"capture.kafka.bootstrap_servers: {item} is this proxy's own listener; "
                    "the capture producer must connect to the brokers directly"
                )


def capture_bootstrap(cfg: ProxyConfig) -> list[str]:
    """Where the Kafka capture sink's producer connects: its own setting, else the upstream brokers."""
    if cfg.capture.kafka.bootstrap_servers:
        return list(cfg.capture.kafka.bootstrap_servers)
    return [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in upstream_addresses(cfg)]


def default_security_protocol(cfg: ProxyConfig) -> str:
    """Kafka's name for how the proxy's own clients reach the brokers (upstream TLS and SASL)."""
    tls = cfg.upstream_tls.enabled
    if cfg.upstream_sasl is not None:
        return "SASL_SSL" if tls else "SASL_PLAINTEXT"
    return "SSL" if tls else "PLAINTEXT"


def exchange_addresses(cfg: ProxyConfig) -> list[str]:
    """Bootstrap servers of the proxy's own state-exchange client."""
    if cfg.exchange.bootstrap_servers:
        return list(cfg.exchange.bootstrap_servers)
    return [f"{host}:{port}" for host, port in upstream_addresses(cfg)]


def upstream_addresses(cfg: ProxyConfig) -> list[tuple[str, int]]:
    if cfg.mode == "sidecar":
        assert cfg.sidecar is not None
        return [_host_port(cfg.sidecar.upstream)]
    assert cfg.gateway is not None
    return [_host_port(s) for s in cfg.gateway.upstream_bootstrap]


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic error location, or of its nearest parent."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if str(k.value) == str(key):
                    nxt, line = v, k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def parse_config(text: str, source: str = "<config>") -> ProxyConfig:
    """Parse and validate; every problem is reported with file:line and the field's path."""
    return _validated(ProxyConfig, text, source)


class _QuotasFile(Strict):
    """A quotas file (``quotas_file``): the quota section alone."""

    config_version: int = Field(CONFIG_VERSION, ge=1, le=CONFIG_VERSION)
    """The format of this file, as in the main config file."""
    quotas: QuotaConfig
    """The quotas, with the same keys as the main file's quotas section."""


def _validated(model: type[M], text: str, source: str) -> M:
    """Parse YAML and validate it; every problem is reported with file:line and the field's path."""
    try:
        root = yaml.compose(text)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of settings")
    _check_version(data, root, source)
    try:
        return model.model_validate(data, context={CONFIG_FILE: True})
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            # A mapping's key refused: its path ends at the key ("[key]" says nothing more).
            loc = tuple(
                p
                for p in err["loc"]
                if not (isinstance(p, str) and (p.startswith("function-") or p == "[key]"))
            )
            line = _line_of(root, loc)
            field = ".".join(str(p) for p in loc) or "(top level)"
            lines.append(f"{source}:{line if line is not None else '?'}: {field}: {err['msg']}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from exc


def _check_version(data: dict[str, Any], root: yaml.Node | None, source: str) -> None:
    """A file of a newer format is refused as such first: its other keys would only read as
    unknown settings, which says nothing about what to do."""
    version = data.get("config_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > CONFIG_VERSION:
        line = _line_of(root, ("config_version",))
        raise ConfigError(
            f"{source}:{line}: config_version: {version} is a newer format than this release reads "
            f"(1 to {CONFIG_VERSION}); run the release that wrote it, or write it as version "
            f"{CONFIG_VERSION} (docs/operations.md, Upgrades)"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from exc


def quotas_path(cfg: ProxyConfig, config_path: str | Path) -> Path | None:
    """Where the quotas file of this config is, if it has one."""
    if cfg.quotas_file is None:
        return None
    return Path(config_path).parent / cfg.quotas_file


def load_config(path: str | Path) -> ProxyConfig:
    """Load the config file, and the quotas file it names (``quotas_file``), if any."""
    p = Path(path)
    text = _read(p)
    cfg = parse_config(text, str(p))
    qpath = quotas_path(cfg, p)
    if qpath is None:
        return cfg
    if "quotas" in cfg.model_fields_set:
        raise ConfigError(f"{p}: give quotas inline or in quotas_file ({cfg.quotas_file}), not both")
    quotas = _validated(_QuotasFile, _read(qpath), str(qpath)).quotas
    return cfg.model_copy(update={"quotas": quotas})
