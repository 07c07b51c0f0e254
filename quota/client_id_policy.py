"""Which client id a request's quotas see (``quotas.client_id_policy``), sans-IO.

Quotas are kept per client id, so clients that send none, or a library's default that many
unrelated clients share, would all charge one bucket. With a template, those get an id of their
own made from their connection (principal, source address, listener); with ``required``, a
request without an id that a quota would charge is refused instead. Everything else keeps the id
it sent, at the cost of one check.
"""

from __future__ import annotations

import fnmatch
import re

from quota.config import ClientIdPolicyConfig

REQUIRED_MESSAGE = (
    "kthrottle: this request needs a client id (client_id_policy.required); set client.id in the client"
)


class ClientIdPolicy:
    """``quotas.client_id_policy``, ready to ask about requests."""

    __slots__ = ("_shared", "_template", "required", "rewrites")

    def __init__(self, cfg: ClientIdPolicyConfig) -> None:
        self.required = cfg.required
        self._template = cfg.template
        self.rewrites = cfg.template is not None
        patterns = [fnmatch.translate(p) for p in cfg.shared_ids]
        self._shared = re.compile("|".join(patterns)).match if patterns else None

    def refuses(self, client_id: str | None) -> bool:
        """``required`` is on and this request has no client id (asked only of the requests a
        quota charges: protocol.refusals.REFUSABLE_APIS)."""
        return self.required and not client_id

    def rewritten(self, client_id: str) -> bool:
        """The template gives this id its own bucket: it is empty, or one of the shared ids."""
        if not self.rewrites:
            return False
        return not client_id or (self._shared is not None and self._shared(client_id) is not None)

    def quota_client_id(self, client_id: str, principal: str, source_ip: str, listener: str) -> str:
        """The id the quotas see: the template's for an empty or shared id, else the id sent."""
        if not self.rewritten(client_id):
            return client_id
        assert self._template is not None
        return self._template.format(
            principal=principal, source_ip=source_ip, listener=listener, client_id=client_id
        )
