"""API version facts: header versions, what the codec decodes, and Kafka's behavioural thresholds.

One place for every version threshold; import these, never retype a number.
"""

from __future__ import annotations

from functools import cache
from typing import Final

from protocol.api_keys import API_VERSIONS_KEY, ApiKey, api_name, has_schema
from protocol.schema import MAX_VERSION, message_schema

# KIP-219: from these versions on, the client backs off by itself on throttle_time_ms, so the
# broker sends the response at once and mutes the channel; older versions get a delayed response.
CLIENT_THROTTLES_FROM: Final[dict[int, int]] = {
    ApiKey.PRODUCE: 6,
    ApiKey.FETCH: 8,
    ApiKey.METADATA: 6,
    ApiKey.FIND_COORDINATOR: 2,
    ApiKey.API_VERSIONS: 2,
    ApiKey.CREATE_TOPICS: 3,
    ApiKey.DELETE_TOPICS: 2,
    ApiKey.INIT_PRODUCER_ID: 1,
    ApiKey.CREATE_PARTITIONS: 1,
    ApiKey.SASL_AUTHENTICATE: 1,
    ApiKey.DESCRIBE_CLUSTER: 0,
}

# KIP-599: from these versions on, mutation requests over quota fail per topic with
# THROTTLING_QUOTA_EXCEEDED (strict); older versions are always admitted (permissive).
STRICT_MUTATION_FROM: Final[dict[int, int]] = {
    ApiKey.CREATE_TOPICS: 6,
    ApiKey.CREATE_PARTITIONS: 3,
    ApiKey.DELETE_TOPICS: 5,
}

# Tagged NodeEndpoints (leader hints with broker addresses) appear in these responses.
NODE_ENDPOINTS_FROM: Final[dict[int, int]] = {ApiKey.PRODUCE: 10, ApiKey.FETCH: 16}

# Address-bearing APIs the proxy cannot rewrite: hidden from ApiVersions (or capped) so no client
# ever learns a broker or controller address through them.
ADDRESS_LEAKING_CAP: Final[dict[int, int | None]] = {
    ApiKey.DESCRIBE_QUORUM: 1,  # v2+ lists the controllers' listeners
    ApiKey.SHARE_FETCH: None,  # NodeEndpoints, no schema to rewrite them with
    ApiKey.SHARE_ACKNOWLEDGE: None,
}

# Kafka 4 still advertises these APIs from v0 although it refuses versions below the value here
# (librdkafka checks for Produce v0, KAFKA-18659). The proxy passes the advertised minimum on
# unchanged and, like the broker, refuses the versions below.
ADVERTISED_BELOW_ACCEPTED: Final[dict[int, int]] = {ApiKey.PRODUCE: 3}

# The APIs whose messages the proxy decodes: their versions are capped at what the codec knows.
DECODED_APIS: Final[frozenset[int]] = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.METADATA,
        ApiKey.FIND_COORDINATOR,
        ApiKey.API_VERSIONS,
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.SASL_HANDSHAKE,
        ApiKey.SASL_AUTHENTICATE,
        ApiKey.DESCRIBE_CLUSTER,
        # KIP-546: the proxy answers these itself (quota_api.mode proxy/both).
        ApiKey.DESCRIBE_CLIENT_QUOTAS,
        ApiKey.ALTER_CLIENT_QUOTAS,
    }
)


@cache
def codec_versions(api_key: int) -> tuple[int, int] | None:
    """Inclusive version range the codec can decode for ``api_key`` (None: no schema)."""
    if not has_schema(api_key):
        return None
    name = api_name(api_key)
    req = message_schema(f"{name}Request")
    resp = message_schema(f"{name}Response")
    lo = max(req.valid[0], resp.valid[0])
    hi = min(req.valid[1], resp.valid[1])
    return (lo, hi) if lo <= hi else None


@cache
def is_flexible(api_key: int, version: int) -> bool:
    """Whether this request/response version uses compact encodings and tagged fields.

    Keys without a schema are newer than KIP-482 and flexible from their first version.
    """
    if not has_schema(api_key):
        return True
    return message_schema(f"{api_name(api_key)}Request").is_flexible(version)


# Each api key's flexible versions (first, last), filled as keys are first seen: every request
# and response header asks, and ``is_flexible``'s cached call (a boxed key tuple hashed into a
# dict) cost more than the rest of a header's parse. A first of -1: not looked up yet.
_FLEXIBLE_SLOTS: Final = 256
_flexible_first: Final[list[int]] = [-1] * _FLEXIBLE_SLOTS
_flexible_last: Final[list[int]] = [-1] * _FLEXIBLE_SLOTS


def header_flexible(api_key: int, version: int) -> bool:
    """``is_flexible``, from plain lists (for the header of every request and response)."""
    if not 0 <= api_key < _FLEXIBLE_SLOTS:
        return is_flexible(api_key, version)
    first = _flexible_first[api_key]
    if first < 0:
        if not has_schema(api_key):
            first, last = 0, MAX_VERSION
        else:
            found = message_schema(f"{api_name(api_key)}Request").flexible
            first, last = found if found is not None else (MAX_VERSION + 1, MAX_VERSION + 1)
        _flexible_last[api_key] = last
        _flexible_first[api_key] = first
    return first <= version <= _flexible_last[api_key]


def request_header_version(api_key: int, version: int) -> int:
    return 2 if header_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    # ApiVersions responses keep header v0 so that a client of any version can read them.
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if header_flexible(api_key, version) else 0
