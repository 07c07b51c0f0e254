"""Which broker each proxy port stands for, and what address the client sees for each broker."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from proxy.config import ProxyConfig, upstream_addresses
from proxy.net.upstream_backoff import UpstreamBackoff

log = logging.getLogger(__name__)


def backoff_bounds(cfg: ProxyConfig) -> tuple[float, float]:
    """The upstream reconnect backoff's first and longest wait, in seconds."""
    return cfg.upstream_reconnect_backoff_ms / 1000, cfg.upstream_reconnect_backoff_max_ms / 1000


class BrokerDirectory:
    """Real broker addresses by node id, learned from the responses passing through.

    ``on_new_node`` is called the first time a node id is seen, so gateway mode can open that
    node's listener before any client is told about it.
    """

    def __init__(self, cfg: ProxyConfig, on_new_node: Callable[[int], None] | None = None) -> None:
        self.cfg = cfg
        self.real: dict[int, tuple[str, int]] = {}
        self.on_new_node = on_new_node
        self.bootstrap = upstream_addresses(cfg)
        # Per broker address, shared by every client connection (a reload keeps its state, the
        # brokers' state does not change with the file, and takes its bounds).
        self.backoff = UpstreamBackoff(*backoff_bounds(cfg), time.monotonic)

    def discovery_addresses(self, last_answered: tuple[str, int] | None = None) -> list[tuple[str, int]]:
        """Where to ask for the cluster's brokers: the one that answered last, the configured
        bootstrap addresses, then (gateway mode) every broker learned since, so one broker
        restarting does not leave the proxy unable to refresh its view (and every replica of a
        gateway unready at once). A sidecar asks its own broker only: it is ready with it."""
        addresses = list(self.bootstrap)
        if self.cfg.mode == "gateway":
            addresses += [a for _node, a in sorted(self.real.items()) if a not in addresses]
        if last_answered in addresses:
            addresses.remove(last_answered)
            addresses.insert(0, last_answered)
        return addresses

    def learn(self, node_id: int, host: str, port: int) -> None:
        known = self.real.get(node_id)
        if known == (host, port):
            return
        self.real[node_id] = (host, port)
        if known is None:
            log.info("learned broker node %d at %s:%d", node_id, host, port)
            if self.on_new_node is not None:
                self.on_new_node(node_id)
        else:
            log.info("broker node %d moved from %s:%d to %s:%d", node_id, *known, host, port)

    def advertised(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Record the real address and return the proxy address clients must use instead."""
        self.learn(node_id, host, port)
        cfg = self.cfg
        if cfg.mode == "sidecar":
            assert cfg.sidecar is not None
            # Each broker's sidecar listens on the same port in its own pod.
            return (cfg.sidecar.advertised_host or host, cfg.sidecar.listen_port)
        assert cfg.gateway is not None
        sni = cfg.gateway.sni
        if sni.enabled:
            # One port for all; the name the client connects with says which broker it wants.
            return sni.broker_host(node_id), sni.advertised_port or cfg.gateway.bootstrap_port
        proxy_port = cfg.gateway.port_for(node_id)
        if proxy_port is None:
            raise LookupError(f"no proxy port configured for broker node {node_id}")
        return cfg.advertised_host, proxy_port

    def upstream_for(self, node_id: int | None) -> list[tuple[str, int]]:
        """Where a connection for ``node_id`` (None: bootstrap) goes, in the order to try."""
        if node_id is None:
            return list(self.bootstrap)
        addr = self.real.get(node_id)
        return [addr] if addr is not None else []
