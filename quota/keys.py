"""Quota key names, exactly as Kafka spells them. One place for them; import, never retype."""

from __future__ import annotations

from typing import Final

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
CONTROLLER_MUTATION_RATE: Final = "controller_mutation_rate"
PRODUCER_IDS_RATE: Final = "producer_ids_rate"

CLIENT_QUOTA_KEYS: Final = (
    PRODUCER_BYTE_RATE,
    CONSUMER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    CONTROLLER_MUTATION_RATE,
    PRODUCER_IDS_RATE,
)

# Consumer-group guard rails: the proxy's own keys (no broker has them), requests per second.
JOIN_GROUP_RATE: Final = "join_group_rate"
REJOIN_GROUP_RATE: Final = "rejoin_group_rate"
SYNC_GROUP_RATE: Final = "sync_group_rate"
OFFSET_COMMIT_RATE: Final = "offset_commit_rate"
GROUP_RATE_KEYS: Final = (JOIN_GROUP_RATE, REJOIN_GROUP_RATE, SYNC_GROUP_RATE, OFFSET_COMMIT_RATE)

# KIP-1010 topic-partition quotas use Kafka's topic config spelling.
TOPIC_PRODUCER_BYTE_RATE: Final = "producer.byte.rate"
TOPIC_CONSUMER_BYTE_RATE: Final = "consumer.byte.rate"
TOPIC_QUOTA_KEYS: Final = (TOPIC_PRODUCER_BYTE_RATE, TOPIC_CONSUMER_BYTE_RATE)

DEFAULT: Final = "<default>"  # Kafka's name for the default user, client id or topic
ANONYMOUS: Final = "ANONYMOUS"  # the principal of an unauthenticated connection
