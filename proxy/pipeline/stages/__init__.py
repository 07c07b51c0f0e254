"""The proxy's concerns, one stage each, and the order they run in (see docs/architecture.md)."""

# ruff: noqa: E402  (the compiled modules are looked for before the stages are imported)

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.compiled import use_compiled

use_compiled(__name__, __path__)

from proxy.pipeline.stages.addresses import AddressStage
from proxy.pipeline.stages.base import Connection, InFlight, Request, Response, Stage, StageFactory
from proxy.pipeline.stages.capture import CaptureStage
from proxy.pipeline.stages.chain import StageChain, StageSet
from proxy.pipeline.stages.client_id_policy import ClientIdRequired
from proxy.pipeline.stages.fetch import FetchStage
from proxy.pipeline.stages.group_requests import GroupRequestStage
from proxy.pipeline.stages.mutations import MutationStage
from proxy.pipeline.stages.produce import ProduceStage
from proxy.pipeline.stages.producer_ids import InitProducerIdStage
from proxy.pipeline.stages.quota_api import QuotaApiStage
from proxy.pipeline.stages.request_time import RequestTimeStage
from proxy.pipeline.stages.sasl import SaslStage
from proxy.pipeline.stages.version_gate import VersionGate

if TYPE_CHECKING:
    from proxy.pipeline.host import Host

__all__ = ["Connection", "InFlight", "Request", "Response", "Stage", "StageChain", "StageSet", "proxy_stages"]


def proxy_stages(host: Host) -> StageSet:
    """The stages of a proxy with ``host``'s config, in order. Capture comes early so the stages
    that take a request over find its record started; it is finished last, from the response."""
    enforcer = host.enforcer
    capture = host.capture
    quota_api = host.quota_api
    volume = host.volume
    factories: list[StageFactory] = [VersionGate]
    if capture is not None:
        factories.append(lambda conn: CaptureStage(conn, capture))
    if quota_api is not None:
        factories.append(lambda conn: QuotaApiStage(conn, quota_api))
    factories += [
        lambda conn: ClientIdRequired(conn, enforcer),
        lambda conn: ProduceStage(conn, enforcer, volume, capture is not None),
        lambda conn: FetchStage(conn, enforcer),
        SaslStage,
        lambda conn: RequestTimeStage(conn, enforcer),
        lambda conn: MutationStage(conn, enforcer, capture is not None),
        lambda conn: InitProducerIdStage(conn, enforcer),
        lambda conn: GroupRequestStage(conn, enforcer),
        AddressStage,
    ]
    return StageSet(factories, enforcer)
