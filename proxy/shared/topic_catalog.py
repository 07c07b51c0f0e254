"""What a partition mutation costs needs facts only the cluster has: a topic's current partition
count (DeleteTopics, CreatePartitions) and the default partition count (CreateTopics with -1).

The proxy asks on its own connection (with its own SASL login when configured), not on the
client's, so a client's ACLs or session never change what it is charged. Answers are cached
briefly: admin requests come in bursts over the same topics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import metadata_topic_ids
from protocol.mutations import TopicRef
from proxy.net.upstream_client import METADATA_VERSION, UpstreamLogin, request

log = logging.getLogger(__name__)

DESCRIBE_CONFIGS_VERSION = 4
BROKER_RESOURCE = 4  # ConfigResource.Type.BROKER
KAFKA_DEFAULT_PARTITIONS = 1  # num.partitions when the broker does not say


class TopicCatalog:
    def __init__(
        self,
        addresses: Callable[[], Sequence[tuple[str, int]]],
        node_ids: Callable[[], Sequence[int]],
        timeout: float,
        credentials: Callable[[], UpstreamLogin],
        ttl_seconds: float = 5.0,
    ) -> None:
        self._addresses = addresses
        self._node_ids = node_ids
        self._timeout = timeout
        self._credentials = credentials
        self._ttl = ttl_seconds
        self._default: tuple[float, int] | None = None
        self._lock = asyncio.Lock()

    async def _ask(self, api_key: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        last: BaseException | None = None
        for host, port in self._addresses():
            try:
                return await request(host, port, api_key, version, body, self._timeout, self._credentials())
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
                last = exc
        raise ConnectionError(f"no broker answered: {last!r}")

    async def partition_counts(self, refs: Sequence[TopicRef]) -> dict[str | bytes, int]:
        """Current partition count by topic name and by topic id, for the topics that exist."""
        by_id = any(r.topic_id is not None for r in refs)
        names = sorted({r.name for r in refs if r.name is not None})
        body: dict[str, Any] = {
            # All topics when some are named by id only: Kafka answers Metadata by name.
            "topics": None if by_id else [{"name": n, "topic_id": bytes(16)} for n in names],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        resp = await self._ask(ApiKey.METADATA, METADATA_VERSION, body)
        counts: dict[str | bytes, int] = {}
        for topic in resp.get("topics") or []:
            if int(topic.get("error_code", 0)) != ErrorCode.NONE:
                continue
            n = len(topic.get("partitions") or [])
            if topic.get("name"):
                counts[topic["name"]] = n
            if topic.get("topic_id"):
                counts[topic["topic_id"]] = n
        return counts

    async def topic_ids(self) -> list[tuple[bytes, str]]:
        """(id, name) of every topic of the cluster (Metadata for all topics)."""
        body: dict[str, Any] = {
            "topics": None,
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        }
        return metadata_topic_ids(await self._ask(ApiKey.METADATA, METADATA_VERSION, body))

    async def default_partitions(self) -> int:
        """The cluster's num.partitions (what CreateTopics with -1 partitions gets)."""
        async with self._lock:
            now = time.monotonic()
            if self._default is not None and now - self._default[0] < self._ttl * 12:
                return self._default[1]
            value = KAFKA_DEFAULT_PARTITIONS
            nodes = list(self._node_ids())
            body = {
                "resources": [
                    {
                        "resource_type": BROKER_RESOURCE,
                        "resource_name": str(nodes[0]) if nodes else "",
                        "configuration_keys": ["num.partitions"],
                    }
                ],
                "include_synonyms": False,
                "include_documentation": False,
            }
            resp = await self._ask(ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, body)
            for result in resp.get("results") or []:
                for entry in result.get("configs") or []:
                    if entry.get("name") == "num.partitions" and entry.get("value"):
                        value = int(entry["value"])
            self._default = (now, value)
            return value
