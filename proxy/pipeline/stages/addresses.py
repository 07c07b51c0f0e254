"""What a client learns about the cluster goes through the proxy: broker addresses in Metadata,
FindCoordinator, DescribeCluster and the other address-bearing responses are rewritten to the
proxy's; ApiVersions is cut to what the proxy can carry; Metadata's topic ids are learned (a
Produce or Fetch v13+ names its topics by id)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Final

from protocol import messages
from protocol.api_keys import API_VERSIONS_KEY, METADATA_KEY, ApiKey
from protocol.metadata_brokers import rewrite_metadata_brokers
from protocol.node_endpoints import TailFinder, has_node_endpoints, withhold_node_endpoints
from protocol.versions import NODE_ENDPOINTS_FROM
from proxy.pipeline.stages.base import WHOLE, Connection, InFlight, Request, Response, Stage, StreamFilter
from proxy.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
withheld_log: Final = RateLimitedLog(log)

# Responses that may carry broker addresses or capabilities the proxy must change.
_REWRITE_ALWAYS: Final = frozenset(
    {ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER}
)
_KEYS: Final = _REWRITE_ALWAYS | frozenset(NODE_ENDPOINTS_FROM)
# Per api key, read as a list (a set's or a dict's lookup boxes and hashes the key, a request):
# the first version whose response this stage reads (_NEVER: none), and whether that response
# may carry NodeEndpoints.
_NEVER: Final = 1 << 15
_ANSWER_FROM: Final[list[int]] = [
    0 if key in _REWRITE_ALWAYS else NODE_ENDPOINTS_FROM.get(key, _NEVER) for key in range(max(_KEYS) + 1)
]
_HAS_NODE_ENDPOINTS: Final[list[bool]] = [key in NODE_ENDPOINTS_FROM for key in range(max(_KEYS) + 1)]


class AddressStage(Stage):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def request_keys(self) -> Collection[int]:
        return _KEYS

    def stream_filter(self, entry: InFlight) -> StreamFilter | None:
        """A streamed Produce or Fetch response (a large one, which no other stage reads) goes
        out as it arrives up to its last field; NodeEndpoints there, if any, is withheld."""
        if entry.api_key in _REWRITE_ALWAYS:
            return WHOLE
        return NodeEndpointsFilter(self.conn, entry)

    def reads_request_body(self, api_key: int, api_version: int) -> bool:
        return False

    def on_request(self, req: Request) -> bool:
        header = req.header  # its key is one of _KEYS: the stage is asked for no other
        if header.api_version >= _ANSWER_FROM[header.api_key]:
            req.want_response(self)
        return False

    def on_response(self, resp: Response) -> bool:
        if resp.replacement is not None:
            return False
        entry = resp.entry
        key = entry.api_key
        # Most Produce and Fetch responses carry no addresses: look at their last field (found
        # without decoding them) before decoding them to rewrite it.
        if (
            _HAS_NODE_ENDPOINTS[key]
            and not resp.decoded
            and not has_node_endpoints(key, entry.api_version, resp.frame)
        ):
            return False
        server = self.conn.server
        if key == METADATA_KEY and not resp.decoded:
            self._pass_metadata_on(resp)
            return False
        body = resp.body
        if key == METADATA_KEY:
            server.topic_names.learn(messages.metadata_topic_ids(body))
        changed = 0
        if key == API_VERSIONS_KEY:
            messages.intersect_api_versions(body)
            changed = 1
        changed += messages.rewrite_addresses(key, entry.api_version, body, server.brokers.advertised)
        if changed:
            server.metrics.rewritten_addresses.inc(changed)
            resp.reencode = True
        return False

    def _pass_metadata_on(self, resp: Response) -> None:
        """The broker list rewritten, the topics passed on as the broker's bytes and kept to be
        read only when a request names a topic id the proxy does not know."""
        server = self.conn.server
        entry = resp.entry
        hsize = resp.header_size
        body = memoryview(resp.frame)[hsize:]
        prefix, rest, changed = rewrite_metadata_brokers(entry.api_version, body, server.brokers.advertised)
        out = bytearray(resp.frame[:hsize])
        out += prefix
        server.topic_names.learn_later(entry.api_version, body)
        resp.frame = out  # a throttle is patched into it as into any response
        resp.tail = body[rest:]  # the topics go out as the broker's bytes, not copied
        if changed:
            server.metrics.rewritten_addresses.inc(changed)


class NodeEndpointsFilter:
    """Lets a streamed response out up to its top-level tagged fields; withholds NodeEndpoints
    there (the response's length cannot change once its size went out). The client then finds a
    new leader by a Metadata request, through the proxy, as clients did before KIP-951."""

    def __init__(self, conn: Connection, entry: InFlight) -> None:
        self.conn = conn
        self.entry = entry
        self.finder = TailFinder(entry.api_key, entry.api_version)

    def feed(self, data: memoryview | bytes) -> int:
        return self.finder.feed(data)

    def skippable(self) -> int:
        return self.finder.skippable()

    def skip(self, n: int) -> None:
        self.finder.skip(n)

    def finish(self, tail: bytearray) -> None:
        if not withhold_node_endpoints(tail):
            return
        conn, entry = self.conn, self.entry
        conn.server.metrics.node_endpoints_withheld.inc()
        withheld_log.log(
            logging.INFO,
            "node-endpoints",
            "conn %d: a streamed %s v%d response named new leaders' addresses; withheld (the client "
            "asks Metadata through the proxy instead)",
            conn.id,
            "Fetch" if entry.api_key == ApiKey.FETCH else "Produce",
            entry.api_version,
        )
