"""Which requests no quota holds back (``quotas.exempt``), sans-IO.

A request is exempt when its connection's user, listener or source address, or its own client
id, is listed. The listener and address of a connection never change; its user does (a SASL
login), and its client id is per request: each request is asked about, in a few set lookups,
and nothing at all when no exemption is configured.
"""

from __future__ import annotations

import ipaddress

from quota.config import ExemptConfig

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_address(host: str | None) -> Address | None:
    """A connection's source address, parsed once (None: not an IP, e.g. a Unix socket)."""
    if not host:
        return None
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


class Exemptions:
    """``quotas.exempt``, made ready to ask about requests."""

    __slots__ = ("_client_ids", "_listeners", "_networks", "_users", "any")

    def __init__(self, cfg: ExemptConfig) -> None:
        self.any = cfg.any
        self._users = frozenset(cfg.users)
        self._client_ids = frozenset(cfg.client_ids)
        self._listeners = frozenset(cfg.listeners)
        self._networks = cfg.networks()

    def source(self, listener: str, address: Address | None) -> bool:
        """Every request of a connection on this listener from this address is exempt."""
        kind = "brokers" if listener.startswith("broker-") else listener  # broker-<id> ports
        if kind in self._listeners:
            return True
        if address is None:
            return False
        return any(address in network for network in self._networks)

    def request(self, source_exempt: bool, user: str, client_id: str) -> bool:
        """This request is exempt (``source_exempt``: ``source`` of its connection)."""
        return self.any and (source_exempt or user in self._users or client_id in self._client_ids)
