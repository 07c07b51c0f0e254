"""What a client learns about the cluster goes through the proxy: broker addresses in Metadata,
FindCoordinator, DescribeCluster and the other address-bearing responses are rewritten to the
proxy's; ApiVersions is cut to what the proxy can carry; Metadata's topic ids are learned (a
Produce or Fetch v13+ names its topics by id)."""

from __future__ import annotations

from collections.abc import Collection

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.versions import NODE_ENDPOINTS_FROM
from proxy.stages.base import Connection, Request, Response, Stage

# Responses that may carry broker addresses or capabilities the proxy must change.
_REWRITE_ALWAYS = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER}
)
_KEYS = _REWRITE_ALWAYS | frozenset(NODE_ENDPOINTS_FROM)


class AddressStage(Stage):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def request_keys(self) -> Collection[int]:
        return _KEYS

    def on_request(self, req: Request) -> bool:
        key = req.header.api_key
        if key in _REWRITE_ALWAYS or req.header.api_version >= NODE_ENDPOINTS_FROM[key]:
            req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        if resp.replacement is not None:
            return False
        server = self.conn.server
        entry = resp.entry
        key = entry.api_key
        body = resp.body
        if key == ApiKey.METADATA:
            server.topic_names.learn(messages.metadata_topic_ids(body))
        changed = 0
        if key == ApiKey.API_VERSIONS:
            messages.intersect_api_versions(body)
            changed = 1
        changed += messages.rewrite_addresses(key, entry.api_version, body, server.brokers.advertised)
        if changed:
            server.metrics.rewritten_addresses.inc(changed)
            resp.reencode = True
        return False
