"""Topic ids to names for the cluster behind the proxy.

Produce v13+ and Fetch v13+ (what current Java clients send) address topics by a 16-byte id only,
while quotas, capture and the tuning job speak of topics by name. The names are learned from the
Metadata responses that pass through (a client asks Metadata before it produces or fetches) and,
for an id nobody has shown yet (the proxy restarted under clients with cached metadata, or the
client bootstrapped elsewhere), from the proxy's own Metadata request (``TopicCatalog.topic_ids``).

A Metadata answer is passed on without reading its topics (``protocol/metadata_brokers.py``): on a
large cluster that is megabytes of partitions per answer. Its bytes are kept instead, and read
only when a request names an id the table does not know; most answers are never read, and the
oldest kept go first once they hold more than ``MAX_PENDING_BYTES``.

Plain state, no I/O: the pipeline feeds it and the server runs the lookups.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable

from protocol.frames import FrameError
from protocol.messages import PartitionBytes
from protocol.metadata_topics import FIRST_VERSION, ZERO_TOPIC_ID, metadata_topic_ids_from_bytes
from protocol.schema import SchemaError

log = logging.getLogger(__name__)

MAX_TOPICS = 200_000  # ids kept; past it the least recently shown go (a lookup finds them again)
# Metadata answers kept unread; past it the oldest go (an id only they showed is looked up).
MAX_PENDING_BYTES = 32 * 1024 * 1024
TOPIC_IDS_FROM = FIRST_VERSION  # the first MetadataResponse version with topic ids


class TopicNames:
    """id -> name, one name per id and one live id per name (a re-created topic gets a new id)."""

    def __init__(
        self,
        max_topics: int = MAX_TOPICS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        on_unreadable: Callable[[], None] | None = None,
    ) -> None:
        self.max_topics = max_topics
        self.max_pending_bytes = max_pending_bytes
        self.on_unreadable = on_unreadable  # a kept Metadata answer could not be read (counted)
        self._names: dict[bytes, str] = {}  # in the order last shown: deleted topics age out
        self._ids: dict[str, bytes] = {}
        self._pending: deque[tuple[int, memoryview]] = deque()  # (version, body), oldest first
        self._pending_bytes = 0

    def learn_later(self, version: int, body: memoryview) -> None:
        """Keep a Metadata answer's body (``version``) to read when an unknown id is met."""
        if version < TOPIC_IDS_FROM:
            return
        self._pending.append((version, body))
        self._pending_bytes += len(body)
        while self._pending_bytes > self.max_pending_bytes and len(self._pending) > 1:
            _version, old = self._pending.popleft()
            self._pending_bytes -= len(old)

    def learn_pending(self) -> bool:
        """Read the kept Metadata answers, oldest first (the newest name wins); whether any was."""
        if not self._pending:
            return False
        pending, self._pending, self._pending_bytes = self._pending, deque(), 0
        for version, body in pending:
            try:
                # Names and ids only, the partitions stepped over: a 100,000-partition answer
                # is read in milliseconds, not the 0.7 s a whole decode holds the loop.
                pairs = metadata_topic_ids_from_bytes(version, body)
            except (SchemaError, FrameError, LookupError, ValueError) as exc:
                log.warning(
                    "a Metadata v%d answer's topics could not be read (%s): its ids were not learned",
                    version,
                    exc,
                )
                if self.on_unreadable is not None:
                    self.on_unreadable()
                continue
            self.learn(pairs)
        return True

    def __len__(self) -> int:
        return len(self._names)

    def name(self, topic_id: bytes) -> str | None:
        name = self._names.get(topic_id)
        if name is None and self.learn_pending():
            name = self._names.get(topic_id)
        return name

    def learn(self, pairs: Iterable[tuple[bytes, str]], *, every_topic: bool = False) -> None:
        """Take (id, name) pairs from a Metadata answer. ``every_topic``: the answer listed all the
        cluster's topics, so ids it does not show belong to deleted topics and are forgotten."""
        pairs = list(pairs)
        if every_topic:
            self._pending.clear()  # answers older than this one: what they show is known or gone
            self._pending_bytes = 0
            self._names.clear()
            self._ids.clear()
        for topic_id, name in pairs:
            if topic_id == ZERO_TOPIC_ID:
                continue
            old = self._ids.get(name)
            if old is not None and old != topic_id:
                self._names.pop(old, None)  # deleted and re-created: the old id names nothing now
            stale = self._names.pop(topic_id, None)
            if stale is not None and stale != name:
                self._ids.pop(stale, None)
            self._names[topic_id] = name
            self._ids[name] = topic_id
        if len(self._names) > self.max_topics:
            # Topics created and deleted by the thousand (no DeleteTopics is watched for them).
            for topic_id in list(self._names)[: len(self._names) - self.max_topics]:
                self.forget(topic_id)

    def forget(self, topic_id: bytes) -> None:
        """The broker answered UNKNOWN_TOPIC_ID for it: it names nothing any more."""
        self.learn_pending()  # an older answer kept unread must not show it again
        name = self._names.pop(topic_id, None)
        if name is not None and self._ids.get(name) == topic_id:
            del self._ids[name]

    def rename(self, parts: Iterable[PartitionBytes]) -> list[PartitionBytes]:
        """Replace the ids of ``parts`` by names where known; returns the parts still keyed by id."""
        unknown = []
        for part in parts:
            if isinstance(part.topic, bytes):
                name = self._names.get(part.topic)
                if name is None:
                    unknown.append(part)
                else:
                    part.topic = name
        if unknown and self.learn_pending():
            return self.rename(unknown)
        return unknown
