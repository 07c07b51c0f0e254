"""What a connection's pipeline and its stages may use of the proxy process that holds them.

``ProxyServer`` is the one implementation; naming the surface here keeps the pipeline from
importing the server (which imports the pipeline to accept connections).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from protocol.sasl import SaslNaming
    from proxy.capture.writer import CaptureWriter
    from proxy.config import ProxyConfig
    from proxy.metrics import ProxyMetrics
    from proxy.net.brokers import BrokerDirectory
    from proxy.net.tls import ListenerTlsContext
    from proxy.pipeline.connection import Pipeline
    from proxy.pipeline.flow import Shutdown
    from proxy.pipeline.stages.chain import StageSet
    from proxy.shared.quota_api import QuotaApiService
    from proxy.shared.throttling import QuotaEnforcer
    from proxy.shared.topic_catalog import TopicCatalog
    from proxy.shared.topic_lookup import TopicIdLookup
    from proxy.shared.topic_names import TopicNames
    from proxy.shared.volume_service import VolumeService


@dataclass
class Listener:
    """A proxy port. ``node_id`` None is the bootstrap (or sidecar) port."""

    name: str
    host: str
    port: int
    node_id: int | None
    server: asyncio.AbstractServer | None = field(default=None, repr=False)


class Host(Protocol):
    cfg: ProxyConfig
    metrics: ProxyMetrics
    enforcer: QuotaEnforcer
    tls: ListenerTlsContext | None
    brokers: BrokerDirectory
    catalog: TopicCatalog
    topic_names: TopicNames
    topic_lookup: TopicIdLookup
    capture: CaptureWriter | None
    volume: VolumeService | None
    quota_api: QuotaApiService | None
    stages: StageSet
    shutdown: Shutdown  # draining for shutdown

    def upstream_ssl(self) -> ssl.SSLContext | None: ...
    def sasl_naming(self) -> SaslNaming: ...
    def pipeline_opened(self, pipeline: Pipeline) -> None: ...
    def pipeline_closed(self, pipeline: Pipeline) -> None: ...
