"""Topic ids to names for the cluster behind the proxy.

Produce v13+ and Fetch v13+ (what current Java clients send) address topics by a 16-byte id only,
while quotas, capture and the tuning job speak of topics by name. The names are learned from the
Metadata responses that pass through (a client asks Metadata before it produces or fetches) and,
for an id nobody has shown yet (the proxy restarted under clients with cached metadata, or the
client bootstrapped elsewhere), from the proxy's own Metadata request (``TopicCatalog.topic_ids``).

Plain state, no I/O: the pipeline feeds it and the server runs the lookups.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.messages import ZERO_TOPIC_ID, PartitionBytes

MAX_TOPICS = 200_000  # ids kept; past it the least recently shown go (a lookup finds them again)


class TopicNames:
    """id -> name, one name per id and one live id per name (a re-created topic gets a new id)."""

    def __init__(self, max_topics: int = MAX_TOPICS) -> None:
        self.max_topics = max_topics
        self._names: dict[bytes, str] = {}  # in the order last shown: deleted topics age out
        self._ids: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._names)

    def name(self, topic_id: bytes) -> str | None:
        return self._names.get(topic_id)

    def learn(self, pairs: Iterable[tuple[bytes, str]], *, every_topic: bool = False) -> None:
        """Take (id, name) pairs from a Metadata answer. ``every_topic``: the answer listed all the
        cluster's topics, so ids it does not show belong to deleted topics and are forgotten."""
        pairs = list(pairs)
        if every_topic:
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
        return unknown
