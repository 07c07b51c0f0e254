"""Who a new client connection is, from its TLS handshake: the principal its certificate maps to
and, with SNI routing, the broker the server name it asked for stands for."""

from __future__ import annotations

from typing import Any

from proxy.config import ProxyConfig
from proxy.net.tls import ListenerTlsContext, server_name
from quota.principal_mapping import BadCertificate, NoMatchingRule


class Refused(Exception):
    """The connection is refused: ``label`` counts it, the message says why."""

    def __init__(self, reason: str, label: str) -> None:
        super().__init__(reason)
        self.label = label


def tls_identity(
    tls: ListenerTlsContext | None, cfg: ProxyConfig, ssl_object: Any, user: str, node_id: int | None
) -> tuple[str, int | None]:
    """The (principal, broker node) of a connection, given the listener's defaults; Refused when
    its certificate maps to no principal or its server name to no broker."""
    if tls is None or ssl_object is None:
        return user, node_id
    tls.completed(ssl_object)
    try:
        user = tls.principal(ssl_object)
    except (NoMatchingRule, BadCertificate) as exc:
        raise Refused(f"TLS client certificate: {exc}", "tls-principal") from exc
    gateway = cfg.gateway
    if gateway is None or not gateway.sni.enabled or node_id is not None:
        return user, node_id
    name = server_name(ssl_object)
    if name is None or name.lower().rstrip(".") == gateway.sni.bootstrap_host.lower():
        return user, node_id  # bootstrap (so is a client that sends no name, e.g. one using an address)
    node = gateway.sni.broker_node(name)
    if node is None:
        raise Refused(f"TLS server name {name!r} names neither the bootstrap nor a broker", "tls-server-name")
    return user, node
