"""Prometheus metrics, all named kthrottle_*; labels are bounded (api names, listener kinds)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.traffic_metrics import TrafficCollector


class ProxyMetrics:
    """One set per proxy instance (its own registry, so tests can run several proxies)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.connections_active = Gauge(
            "kthrottle_connections_active", "Open client connections", ["listener"], registry=r
        )
        self.connections_total = Counter(
            "kthrottle_connections", "Accepted client connections", ["listener"], registry=r
        )
        self.traffic = TrafficCollector()  # requests, bytes and upstream latency, by api
        r.register(self.traffic)
        self.upstream_errors = Counter(
            "kthrottle_upstream_errors",
            "Upstream connection failures, by kind (connect, disconnect with requests in flight, "
            "idle_close: the broker closed an idle connection)",
            ["kind"],
            registry=r,
        )
        self.rejected_frames = Counter(
            "kthrottle_rejected_frames",
            "Client connections closed for bad input, by reason",
            ["reason"],
            registry=r,
        )
        self.tls_handshake_failures = Counter(
            "kthrottle_tls_handshake_failures",
            "Client TLS handshakes that failed: a certificate refused, or closed mid-handshake",
            registry=r,
        )
        self.proxy_protocol_headers = Counter(
            "kthrottle_proxy_protocol_headers",
            "PROXY protocol headers accepted on listeners that require one, by version and kind "
            "(client: it named the client's address; local: the load balancer's own connection; "
            "unknown: no address named, the connection's peer stands for the client)",
            ["version", "kind"],
            registry=r,
        )
        self.proxy_protocol_refused = Counter(
            "kthrottle_proxy_protocol_refused",
            "Connections refused on listeners that require the PROXY protocol, by reason "
            "(untrusted-source, malformed, timeout, closed)",
            ["reason"],
            registry=r,
        )
        self.rewritten_addresses = Counter(
            "kthrottle_rewritten_addresses", "Broker addresses replaced in responses", registry=r
        )
        self.node_endpoints_withheld = Counter(
            "kthrottle_node_endpoints_withheld",
            "Streamed Produce/Fetch responses whose new-leader addresses (KIP-951) were withheld "
            "(the client asks Metadata through the proxy instead)",
            registry=r,
        )
        self.spliced_response_bytes = Counter(
            "kthrottle_spliced_response_bytes",
            "Bytes of large responses moved from broker to client by splice(2), never copied "
            "through the proxy (splice_responses)",
            registry=r,
        )
        self.throttled_requests = Counter(
            "kthrottle_throttled_requests",
            "Requests over a quota (throttled, or with topics rejected), by api and whether the "
            "decision was applied, dry-run or exempt (quotas.exempt: reported, not applied)",
            ["api", "mode"],
            registry=r,
        )
        self.client_id_refused = Counter(
            "kthrottle_client_id_refused",
            "Requests refused for having no client id (quotas.client_id_policy.required), by api",
            ["api"],
            registry=r,
        )
        self.throttle_seconds = Counter(
            "kthrottle_throttle_seconds", "Throttle time decided by the proxy, by api", ["api"], registry=r
        )
        self.bounded_throttles = Counter(
            "kthrottle_bounded_throttles",
            "Throttles quotas.max_throttle_ms cut short (the rest stays owed), by api and outcome "
            "(bounded: answered with the bound; refused: a fetch made while its entity owed, "
            "answered empty)",
            ["api", "outcome"],
            registry=r,
        )
        self.quota_throttles = Counter(
            "kthrottle_quota_throttles",
            "Requests throttled by producer_ids_rate, request_percentage or a consumer-group rate "
            "(join_group_rate, rejoin_group_rate, sync_group_rate, offset_commit_rate), by api, "
            "quota and mode",
            ["api", "quota", "mode"],
            registry=r,
        )
        self.group_requests_held = Counter(
            "kthrottle_group_requests_held",
            "Group requests (JoinGroup, SyncGroup, OffsetCommit) that waited in the proxy because "
            "their entity's group rate owed, by api, quota and mode",
            ["api", "quota", "mode"],
            registry=r,
        )
        self.throttled_connections = Counter(
            "kthrottle_throttled_connections",
            "Client connections over their IP's connection_creation_rate: held, then closed (KIP-612)",
            ["mode"],
            registry=r,
        )
        self.mutation_rejected_topics = Counter(
            "kthrottle_mutation_rejected_topics",
            "Topics answered THROTTLING_QUOTA_EXCEEDED by the proxy (KIP-599 strict versions)",
            ["api", "mode"],
            registry=r,
        )
        self.capture_records = Counter(
            "kthrottle_capture_records",
            "Capture records written to files, or acknowledged by the brokers (kafka sink)",
            registry=r,
        )
        self.capture_dropped = Counter(
            "kthrottle_capture_dropped",
            "Capture records dropped because the writer fell behind, or (kafka sink) the producer "
            "could not take them without waiting (traffic is never slowed)",
            registry=r,
        )
        self.capture_files = Counter("kthrottle_capture_files", "Capture files completed", registry=r)
        self.capture_errors = Counter(
            "kthrottle_capture_write_errors",
            "Failed capture writes: file writes (their records are lost), or (kafka sink) records "
            "whose delivery failed",
            registry=r,
        )
        self.config_reloads = Counter(
            "kthrottle_config_reloads",
            "Config reloads, by result (applied, rejected)",
            ["result"],
            registry=r,
        )
        self.config_last_reload_ok = Gauge(
            "kthrottle_config_last_reload_ok",
            "1 when the config file as it is now on disk is the one in force; 0 while the last "
            "change to it was refused (the last good config stays; the log says why)",
            registry=r,
        )
        self.config_last_reload_ok.set(1)
        self.config_restart_pending = Gauge(
            "kthrottle_config_restart_pending",
            "Settings changed in the config file that take effect only at a restart (0: none)",
            registry=r,
        )
        self.entity_holds = Counter(
            "kthrottle_entity_holds",
            "Requests held, unread, because another connection of the same client (user, client id) "
            "was throttled and its throttle has not passed yet: one quota across connections",
            ["api"],
            registry=r,
        )
        self.topic_ids = Counter(
            "kthrottle_topic_ids",
            "Topics addressed by id (Produce/Fetch v13+) whose name the proxy did not know yet, by "
            "outcome: unresolved (met in a request: looked up, its bytes charged once found), "
            "resolved (found by the proxy's own Metadata request), unknown (the cluster has no such "
            "topic: its bytes count towards no topic quota and capture keeps the id), "
            "unreadable_metadata (a Metadata answer passed on whose topics could not be read when "
            "an unknown id was met: the ids it showed are looked up instead)",
            ["outcome"],
            registry=r,
        )
