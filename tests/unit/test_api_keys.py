"""The per-request path's plain lookups agree with the cached ones they stand in for."""

from __future__ import annotations

from protocol.api_keys import (
    API_VERSIONS_KEY,
    FETCH_KEY,
    METADATA_KEY,
    PRODUCE_KEY,
    ApiKey,
    api_name,
    is_known_key,
)
from protocol.versions import header_flexible, is_flexible, request_header_version


def test_the_plain_key_constants_are_the_enum_values() -> None:
    assert (PRODUCE_KEY, FETCH_KEY, METADATA_KEY, API_VERSIONS_KEY) == (
        ApiKey.PRODUCE,
        ApiKey.FETCH,
        ApiKey.METADATA,
        ApiKey.API_VERSIONS,
    )


def test_a_key_is_known_exactly_when_it_has_a_name() -> None:
    for key in range(-3, 300):
        for _ in range(2):  # asked, then remembered
            assert is_known_key(key) == (api_name(key) is not None), key


def test_header_flexibility_matches_the_schemas_for_every_key_and_version() -> None:
    for key in range(-1, 300):
        for version in (0, 1, 2, 3, 5, 8, 9, 12, 13, 16, 17, 32767):
            assert header_flexible(key, version) == is_flexible(key, version), (key, version)
    assert request_header_version(ApiKey.PRODUCE, 8) == 1
    assert request_header_version(ApiKey.PRODUCE, 9) == 2
