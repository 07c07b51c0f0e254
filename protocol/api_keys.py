"""Kafka API keys: the ones the proxy acts on, and the name of every key it lets through.

One place for this fact. Names of keys whose schemas ship with kafka-python come from those
schemas; the few newer keys they lack are listed here so the proxy can pass them through
(their request headers have the same layout as every other flexible request).
"""

from __future__ import annotations

import enum
from functools import cache
from importlib import resources
from typing import Final


class ApiKey(enum.IntEnum):
    """Keys the proxy decodes or changes; everything else is forwarded byte for byte."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    SYNC_GROUP = 14
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    DESCRIBE_CONFIGS = 32
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DESCRIBE_QUORUM = 55
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_CLUSTER = 60
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


# The keys the per-request path compares with, as plain ints. Compiled, a comparison with an
# IntEnum member is a generic call after a lookup of the member on its class; one with a Final
# int is a machine compare. (tests/unit/test_api_keys.py holds them equal to ApiKey's.)
PRODUCE_KEY: Final = 0
FETCH_KEY: Final = 1
METADATA_KEY: Final = 3
API_VERSIONS_KEY: Final = 18

# Keys newer than the schemas kafka-python ships: passed through, never decoded.
_EXTRA_NAMES: Final[dict[int, str]] = {
    38: "CreateDelegationToken",
    39: "RenewDelegationToken",
    40: "ExpireDelegationToken",
    41: "DescribeDelegationToken",
    56: "AlterPartition",
    58: "Envelope",
    64: "UnregisterBroker",
    67: "AllocateProducerIds",
    68: "ConsumerGroupHeartbeat",
    69: "ConsumerGroupDescribe",
    71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
    76: "ShareGroupHeartbeat",
    77: "ShareGroupDescribe",
    78: "ShareFetch",
    79: "ShareAcknowledge",
    80: "AddRaftVoter",
    81: "RemoveRaftVoter",
    82: "UpdateRaftVoter",
    83: "InitializeShareGroupState",
    84: "ReadShareGroupState",
    85: "WriteShareGroupState",
    86: "DeleteShareGroupState",
    87: "ReadShareGroupStateSummary",
    88: "StreamsGroupHeartbeat",
    89: "StreamsGroupDescribe",
    90: "DescribeShareGroupOffsets",
    91: "AlterShareGroupOffsets",
    92: "DeleteShareGroupOffsets",
}


@cache
def schema_names() -> dict[int, str]:
    """api key -> message base name ('Produce') for every request schema kafka-python ships."""
    import json
    import re

    names: dict[int, str] = {}
    package = resources.files("kafka.protocol.schemas.resources")
    for entry in package.iterdir():
        if not entry.name.endswith("Request.json") or entry.name == "RequestHeader.json":
            continue
        text = re.sub(r"(?m)^\s*//.*$", "", entry.read_text(encoding="utf-8"))
        names[int(json.loads(text)["apiKey"])] = entry.name[: -len("Request.json")]
    return names


@cache
def api_name(api_key: int) -> str | None:
    """The API's name, or None for a key the proxy does not know (such frames close the connection)."""
    return schema_names().get(api_key) or _EXTRA_NAMES.get(api_key)


_KEY_SLOTS: Final = 256
_known: Final[list[int]] = [-1] * _KEY_SLOTS  # per api key: 1 known, 0 not, -1 not asked yet


def is_known_key(api_key: int) -> bool:
    """``api_name(api_key) is not None``, for the check every request header gets: a plain list
    (the cached function's call, its boxed argument hashed into a dict, cost more than the rest
    of the header parse)."""
    if not 0 <= api_key < _KEY_SLOTS:
        return api_name(api_key) is not None
    known = _known[api_key]
    if known < 0:
        known = _known[api_key] = 0 if api_name(api_key) is None else 1
    return known == 1


def has_schema(api_key: int) -> bool:
    return api_key in schema_names()
