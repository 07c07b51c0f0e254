"""kafka-python group members that start with their topics' partitions known.

kafka-python 3.0.12 (the pinned client) can leave a group leader with no assignment and no
heartbeat for good: when a rebalance that a metadata change started has its SyncGroup answer
arrive after ``poll``'s timeout, the next ``poll`` no longer sees a rejoin pending and never
collects the answer (docs/operations.md, "kafka-python: a leader that stops after a metadata
change"; `dev/kafka_python_stall.py` reproduces it against a real broker).

The harness's consumers start right after their topics are created, and kafka-python's first
JoinGroup can beat its first Metadata answer naming the topic: the leader assigns nothing,
the answer then changes its metadata snapshot, and that is the metadata-started rebalance.
Subscribing and waiting until the group coordinator's snapshot knows every topic's partitions
before the first ``poll`` removes that precondition; the stall itself is kafka-python's to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dev.waiting import wait_until


def group_consumer(topics: str | Sequence[str], *, timeout: float = 30.0, **config: Any) -> Any:
    """A ``KafkaConsumer`` subscribed to ``topics`` whose first join already knows their partitions.

    ``config`` is KafkaConsumer's (``group_id`` required). Raises ``WaitTimeout`` naming the
    topics when their partitions are not known within ``timeout`` seconds."""
    from kafka import KafkaConsumer

    if not config.get("group_id"):
        raise ValueError("group_consumer is for group members: give group_id")
    names = [topics] if isinstance(topics, str) else list(topics)
    consumer = KafkaConsumer(**config)
    try:
        consumer.subscribe(names)
        # kafka-python's I/O thread sends the Metadata request subscribe() asked for and applies the
        # answer; the snapshot is what a leader assigns from (a private attribute: kafka-python is
        # pinned below 3.1).
        coordinator = consumer._coordinator
        wait_until(
            lambda: all(coordinator._metadata_snapshot.get(name) for name in names),
            timeout,
            f"kafka-python learned no partitions of {names} within {timeout:g} s",
            every=0.02,
        )
    except BaseException:
        consumer.close()
        raise
    return consumer
