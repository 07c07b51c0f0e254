"""The proxy process: listeners, broker discovery, pipelines, graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from protocol.sasl import SaslNaming
from proxy.admin.pending_requests import PendingRequestsCollector, warn_stalled
from proxy.admin.quota_metrics import QuotaCollector
from proxy.capture.writer import CaptureWriter, instance_name
from proxy.config import ProxyConfig
from proxy.metrics import ProxyMetrics
from proxy.net.brokers import BrokerDirectory
from proxy.net.proxy_protocol import HeaderProtocol, Origin, ProxyProtocolGate
from proxy.net.tls import ListenerTlsContext, upstream_context
from proxy.net.transports import ClientProtocol, PlainClientProtocol
from proxy.net.upstream_client import Credentials, UpstreamLogin, fetch_brokers
from proxy.pipeline.connection import Pipeline
from proxy.pipeline.flow import Shutdown
from proxy.pipeline.host import Listener
from proxy.pipeline.stages import proxy_stages
from proxy.ratelog import RateLimitedLog
from proxy.shared.cluster_quotas import ClusterQuotaService
from proxy.shared.quota_api import QuotaApiService
from proxy.shared.throttling import QuotaEnforcer
from proxy.shared.topic_catalog import TopicCatalog
from proxy.shared.topic_lookup import TopicIdLookup
from proxy.shared.topic_names import TopicNames
from proxy.shared.volume_service import VolumeService
from quota.entities import any_cluster_scope
from quota.principal_mapping import PrincipalMapper

log = logging.getLogger(__name__)


def cluster_wanted(cfg: ProxyConfig) -> bool:
    """The exchange runs when enabled (the chart: more than one gateway replica) or when an
    entity asks for ``scope: cluster``."""
    return cfg.cluster_quotas.enabled or any_cluster_scope(cfg.quotas)


handshake_log = RateLimitedLog(log)
EXPIRY_SWEEP_SECONDS = 5.0  # how often idle quota state is looked for without traffic


def _loop_time() -> float:
    """The event loop's clock (requests are stamped with it); the same monotonic clock outside one."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class ProxyServer:
    def __init__(self, cfg: ProxyConfig, metrics: ProxyMetrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics or ProxyMetrics()
        self._sasl_naming: tuple[object, SaslNaming] | None = None
        # TLS files that do not load refuse the start (TlsConfigError names them).
        self.tls = ListenerTlsContext(cfg.tls, on_failure=self._handshake_failed) if cfg.tls.enabled else None
        self.upstream_tls = upstream_context(cfg.upstream_tls)
        # Listeners behind a load balancer that sends the PROXY protocol header.
        self.proxy_protocol = (
            ProxyProtocolGate(cfg, self.metrics, self.tls) if cfg.proxy_protocol.listeners else None
        )
        self.brokers = BrokerDirectory(cfg, on_new_node=self._on_new_node)
        unreadable = self.metrics.topic_ids.labels("unreadable_metadata")
        self.topic_names = TopicNames(on_unreadable=unreadable.inc)
        self.enforcer = QuotaEnforcer(cfg.quotas, self.metrics, topic_names=self.topic_names)
        self.catalog = TopicCatalog(
            lambda: [*self.brokers.real.values(), *self.brokers.bootstrap],
            lambda: sorted(self.brokers.real),
            cfg.connect_timeout_seconds,
            self.upstream_login,
        )
        self.topic_lookup = TopicIdLookup(self.catalog, self.topic_names, self.enforcer)
        self.enforcer.lookup_topic_ids = self.topic_lookup.wanted
        self.metrics.registry.register(QuotaCollector(self.enforcer, cfg.quotas.metrics_max_series))
        self.capture = self._capture_writer(cfg) if cfg.capture.enabled else None
        self.volume = (
            VolumeService(cfg, self.metrics.registry, self.upstream_login) if cfg.volume.enabled else None
        )
        self.cluster_quotas = (
            ClusterQuotaService(cfg, self.enforcer, self.metrics.registry) if cluster_wanted(cfg) else None
        )
        # KIP-546: DescribeClientQuotas/AlterClientQuotas answered by the proxy (not in forward mode).
        self.quota_api = (
            QuotaApiService(cfg, self.enforcer, self.metrics.registry)
            if cfg.quota_api.mode != "forward"
            else None
        )
        self.stages = proxy_stages(self)
        self.listeners: dict[str, Listener] = {}
        self.pipelines: set[Pipeline] = set()
        self.metrics.registry.register(PendingRequestsCollector(lambda: self.pipelines, _loop_time))
        self.shutdown = Shutdown()  # each connection keeps it: looked at after every answer
        self._drain_cut = self._drain_unanswered = 0  # connections closed while draining, unanswered
        self.upstream_ready = False
        self._refresh_task: asyncio.Task[None] | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._frame_deadline_task: asyncio.Task[None] | None = None
        self._opening: dict[int, asyncio.Task[None]] = {}
        self.admin_port: int | None = None  # once the admin HTTP server listens
        self._discovered_from: tuple[str, int] | None = None  # the broker that answered last

    def _capture_writer(self, cfg: ProxyConfig) -> CaptureWriter:
        if cfg.capture.sink == "kafka":
            from proxy.capture.kafka_sink import kafka_sink

            sink = kafka_sink(cfg, self.metrics, instance_name(cfg.capture))
            return CaptureWriter(cfg.capture, self.metrics, sink=sink)
        return CaptureWriter(cfg.capture, self.metrics)

    # --- start and stop ------------------------------------------------------------------------

    async def start(self) -> None:
        """Learn the brokers, open every listener, then accept clients."""
        cfg = self.cfg
        if self.quota_api is not None:
            # Clients are served with the API's alterations in force, when the store answers in time.
            self.quota_api.start()
            await self.quota_api.wait_caught_up(cfg.quota_api.start_wait_seconds)
        if cfg.mode == "gateway":
            await self._refresh_brokers(required=False)
            await self._open_known_listeners()
            assert cfg.gateway is not None
            await self._open("bootstrap", cfg.gateway.bootstrap_port, None)
        else:
            assert cfg.sidecar is not None
            await self._open("sidecar", cfg.sidecar.listen_port, None)
            await self._refresh_brokers(required=False)
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_loop())
        self._expiry_task = asyncio.get_running_loop().create_task(self._expiry_loop())
        if cfg.client_frame_timeout_seconds is not None:
            self._frame_deadline_task = asyncio.get_running_loop().create_task(
                self._frame_deadline_loop(cfg.client_frame_timeout_seconds)
            )
        if self.volume is not None:
            self.volume.start()
        if self.cluster_quotas is not None:
            self.cluster_quotas.start()

    async def _open(self, name: str, port: int, node_id: int | None) -> Listener:
        listener = Listener(name, self.cfg.bind_host, port, node_id)
        loop = asyncio.get_running_loop()
        gate = self.proxy_protocol
        if gate is not None and not gate.applies_to(name):
            gate = None
        if gate is not None:
            # The header comes first, the TLS handshake (if any) after it: TLS is started by the
            # header's protocol, not by the listener.
            def pipeline_for(transport: asyncio.Transport, origin: Origin) -> Pipeline:
                return Pipeline(self, listener, transport, origin)

            listener.server = await loop.create_server(
                lambda: HeaderProtocol(gate, name, pipeline_for),
                self.cfg.bind_host,
                port,
                reuse_address=True,
                backlog=1024,
            )
        else:
            # Plaintext connections are read as bytes; TLS ones into the decoder's buffers
            # (decrypted straight into them).
            protocol = ClientProtocol if self.tls is not None else PlainClientProtocol
            listener.server = await loop.create_server(
                lambda: protocol(lambda transport: Pipeline(self, listener, transport)),
                self.cfg.bind_host,
                port,
                reuse_address=True,
                backlog=1024,
                ssl=self.tls.listening if self.tls is not None else None,
                ssl_handshake_timeout=self.cfg.connect_timeout_seconds if self.tls is not None else None,
            )
        sock = listener.server.sockets[0]
        listener.port = sock.getsockname()[1]
        self.listeners[name] = listener
        proxied = ", PROXY protocol required" if gate is not None else ""
        log.info("listening on %s:%d (%s%s)", self.cfg.bind_host, listener.port, name, proxied)
        return listener

    async def _open_node_listener(self, node_id: int) -> None:
        assert self.cfg.gateway is not None
        port = self.cfg.gateway.port_for(node_id)
        if port is None:
            log.error("broker node %d has no proxy port (broker_ports / broker_port_base)", node_id)
            return
        try:
            await self._open(f"broker-{node_id}", port, node_id)
        except OSError as exc:
            log.error("cannot listen for broker node %d on port %d: %s", node_id, port, exc)

    def _ensure_listener(self, node_id: int) -> asyncio.Task[None] | None:
        """Open node ``node_id``'s listener once; returns the task to await, if any is under way."""
        if self.cfg.mode != "gateway" or f"broker-{node_id}" in self.listeners or self.sni_routing:
            return None
        task = self._opening.get(node_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open_node_listener(node_id))
            self._opening[node_id] = task
            task.add_done_callback(lambda _t: self._opening.pop(node_id, None))
        return task

    async def _open_known_listeners(self) -> None:
        tasks = [t for n in sorted(self.brokers.real) if (t := self._ensure_listener(n)) is not None]
        if tasks:
            await asyncio.gather(*tasks)

    def _on_new_node(self, node_id: int) -> None:
        self._ensure_listener(node_id)

    @property
    def sni_routing(self) -> bool:
        """Gateway mode with one TLS port for all brokers, told apart by the server name."""
        return self.cfg.gateway is not None and self.cfg.gateway.sni.enabled

    @property
    def draining(self) -> bool:
        """Shutting down: no new connection is taken, and each closes after its last answer."""
        return self.shutdown.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.shutdown.draining = value

    def upstream_ssl(self) -> ssl.SSLContext | None:
        """The TLS context for connections to brokers (the newest certificates), if configured."""
        return self.upstream_tls.current() if self.upstream_tls is not None else None

    def sasl_naming(self) -> SaslNaming:
        """How this config names OAUTHBEARER and GSSAPI logins (made once per config: a reload
        applies to connections made after it)."""
        cfg = self.cfg.client_sasl
        if self._sasl_naming is None or self._sasl_naming[0] is not cfg:
            mapper = PrincipalMapper(cfg.principal_mapping_rules).name
            self._sasl_naming = (cfg, SaslNaming(cfg.oauthbearer_sub_claim, mapper))
        return self._sasl_naming[1]

    def upstream_login(self) -> UpstreamLogin:
        """The proxy's own way in to the brokers: TLS and SASL login, as configured (read at each
        use, so rotated files apply)."""
        sasl = self.cfg.upstream_sasl
        creds = Credentials(sasl.username, sasl.secret(), sasl.mechanism) if sasl is not None else None
        return UpstreamLogin(creds, self.upstream_ssl())

    async def _refresh_brokers(self, required: bool) -> None:
        try:
            login = self.upstream_login()
            answered: list[tuple[str, int]] = []
            addresses = self.brokers.discovery_addresses(self._discovered_from)
            nodes = await fetch_brokers(addresses, self.cfg.connect_timeout_seconds, login, answered)
            self._discovered_from = answered[0] if answered else None
        except (ConnectionError, OSError) as exc:  # OSError: an unreadable password_file
            self.upstream_ready = False
            self.metrics.upstream_errors.labels("metadata").inc()
            log.warning("broker discovery failed: %s", exc)
            if required:
                raise
            return
        self.upstream_ready = True
        for node_id, host, port in nodes:
            self.brokers.learn(node_id, host, port)

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_SECONDS)
            try:
                self.enforcer.expire_idle()
            except Exception:  # never let the sweep die: memory would grow unbounded
                log.exception("quota state expiry failed")
            try:
                warn_stalled(self.pipelines, asyncio.get_running_loop().time())
            except Exception:
                log.exception("stalled request sweep failed")

    async def _frame_deadline_loop(self, timeout: float) -> None:
        """Close connections whose request frame has been arriving for longer than ``timeout``
        (a slowloris holds a connection and its upstream with a byte now and then). One sweep
        over all connections, a few times per timeout: cheaper than a timer per frame."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(EXPIRY_SWEEP_SECONDS, timeout / 4))
            now = loop.time()
            try:
                for pipeline in [p for p in self.pipelines if p.frame_overdue(now, timeout)]:
                    pipeline.reject(
                        f"request frame incomplete after {timeout:g} s ({pipeline.requests.buffered} "
                        "bytes so far; client_frame_timeout_seconds)",
                        "frame-timeout",
                    )
            except Exception:  # never let the sweep die: slow clients would hold connections for good
                log.exception("frame deadline sweep failed")

    async def _refresh_loop(self) -> None:
        # Ends at shutdown by itself too: Python 3.11's asyncio.wait_for can swallow a cancel that
        # lands as its connection completes (gh-86296), and the loop would go on for ever.
        while not self.draining:
            await asyncio.sleep(self.cfg.metadata_refresh_seconds if self.upstream_ready else 1.0)
            if self.draining:
                return
            await self._refresh_brokers(required=False)
            await self._open_known_listeners()

    async def stop(self, drain_seconds: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish for a bounded time, then close all."""
        grace = self.cfg.drain_seconds if drain_seconds is None else drain_seconds
        self.draining = True
        for listener in self.listeners.values():
            if listener.server is not None:
                listener.server.close()
        if self.proxy_protocol is not None:
            self.proxy_protocol.close_all()
        began = asyncio.get_running_loop().time()
        connections = len(self.pipelines)
        for pipeline in list(self.pipelines):
            pipeline.pause_client("draining")
            if pipeline.idle:
                pipeline.close("idle at shutdown", level=logging.INFO)
        deadline = began + grace
        while self.pipelines and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        by_grace = len(self.pipelines)
        for pipeline in list(self.pipelines):
            pipeline.close(f"drain grace of {grace}s over with {len(pipeline.in_flight)} requests in flight")
        # One line an operator (and the deployment tests) can read the drain by: a client's
        # retries hide a request cut here (by the grace, or a broker or client that went), and
        # only the proxy knows it read a request it did not answer.
        cut = self._drain_cut
        log.log(
            logging.WARNING if cut else logging.INFO,
            "drain: %d of %d connections closed after their last answer in %.1fs; %d cut with %d "
            "requests unanswered (%d by the %.1fs grace)",
            connections - cut,
            connections,
            asyncio.get_running_loop().time() - began,
            cut,
            self._drain_unanswered,
            by_grace,
            grace,
        )
        loops = [t for t in (self._refresh_task, self._expiry_task, self._frame_deadline_task) if t]
        for task in loops:
            task.cancel()
        if loops:
            _done, still = await asyncio.wait(loops, timeout=2.0)
            for task in still:  # a cancel swallowed (see _refresh_loop): ask once more, bounded
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=2.0)
        for task in list(self._opening.values()):
            task.cancel()
        self.topic_lookup.close()
        for listener in self.listeners.values():
            if listener.server is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(listener.server.wait_closed(), 1.0)
        if self.volume is not None:
            await self.volume.stop()
        if self.cluster_quotas is not None:
            await self.cluster_quotas.stop()
        if self.quota_api is not None:
            await self.quota_api.stop()
        if self.capture is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.capture.close)

    # --- bookkeeping ---------------------------------------------------------------------------

    def pipeline_opened(self, pipeline: Pipeline) -> None:
        self.pipelines.add(pipeline)
        if self.topic_lookup.loop is None:
            self.topic_lookup.loop = pipeline.loop
        self.metrics.connections_total.labels(pipeline.listener.name).inc()
        self.metrics.connections_active.labels(pipeline.listener.name).inc()

    def pipeline_closed(self, pipeline: Pipeline) -> None:
        if pipeline in self.pipelines:
            self.pipelines.discard(pipeline)
            self.metrics.connections_active.labels(pipeline.listener.name).dec()
            if self.draining and pipeline.in_flight:  # for the drain's summary
                self._drain_cut += 1
                self._drain_unanswered += len(pipeline.in_flight)

    def _handshake_failed(self) -> None:
        """A client's TLS handshake failed: the client saw the TLS alert; the operator sees this."""
        self.metrics.tls_handshake_failures.inc()
        handshake_log.log(
            logging.WARNING,
            "tls",
            "a client TLS handshake failed (its certificate refused, no certificate where one is "
            "required, or the connection closed mid-handshake)",
        )

    def start_cluster_quotas(self, cfg: ProxyConfig) -> None:
        """Start the exchange on a running proxy (a reload turned quotas cluster-wide)."""
        if self.cluster_quotas is not None:
            return
        self.cluster_quotas = ClusterQuotaService(cfg, self.enforcer, self.metrics.registry)
        self.cluster_quotas.admin_port = self.admin_port
        self.cluster_quotas.start()

    def port_of(self, name: str) -> int:
        return self.listeners[name].port
