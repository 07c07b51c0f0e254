"""quotas.client_id_policy: the id a request's quotas see (quota/client_id_policy.py), the
proxy's refusal answers (protocol/refusals.py) at the oldest and newest versions, and the
config's refusals with their line and field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.refusals import REFUSABLE_APIS, refusal_response
from protocol.versions import codec_versions
from proxy.config import ConfigError, parse_config
from quota.client_id_policy import REQUIRED_MESSAGE, ClientIdPolicy
from quota.config import ClientIdPolicyConfig

BASE = "gateway: {upstream_bootstrap: [b:9092]}\n"


def policy(**cfg: Any) -> ClientIdPolicy:
    return ClientIdPolicy(ClientIdPolicyConfig.model_validate(cfg))


def test_by_default_every_id_is_kept_and_none_is_required() -> None:
    p = policy()
    assert not p.rewrites and not p.refuses("") and not p.refuses(None)
    assert p.quota_client_id("", "alice", "10.0.0.1", "bootstrap") == ""


def test_a_template_rewrites_empty_and_shared_ids_only() -> None:
    p = policy(template="anon-{principal}-{source_ip}", shared_ids=["rdkafka", "producer-*"])
    ask: Callable[[str], str] = lambda cid: p.quota_client_id(cid, "alice", "10.0.0.1", "brokers")  # noqa: E731
    assert ask("") == "anon-alice-10.0.0.1"
    assert ask("rdkafka") == "anon-alice-10.0.0.1"
    assert ask("producer-17") == "anon-alice-10.0.0.1"
    assert ask("rdkafka-2") == "rdkafka-2"  # a pattern is matched whole
    assert ask("orders-app") == "orders-app"
    p2 = policy(template="{client_id}@{listener}", shared_ids=["rdkafka"])
    assert p2.quota_client_id("rdkafka", "bob", "::1", "bootstrap") == "rdkafka@bootstrap"


def test_required_refuses_only_a_missing_id() -> None:
    p = policy(required=True)
    assert p.refuses("") and p.refuses(None) and not p.refuses("app")


@pytest.mark.parametrize(
    ("section", "field", "why"),
    [
        ("{template: 'anon'}", "quotas.client_id_policy.template", "names nothing of the client"),
        ("{template: 'anon-{user}'}", "quotas.client_id_policy.template", "{user} is not a placeholder"),
        ("{template: 'a-{principal!r}'}", "quotas.client_id_policy.template", "is not a placeholder"),
        ("{template: 'a-{principal'}", "quotas.client_id_policy.template", "template 'a-{principal'"),
        ("{shared_ids: [rdkafka]}", "quotas.client_id_policy", "set template as well"),
        ("{template: 'a-{principal}', shared_ids: ['*']}", "quotas.client_id_policy.shared_ids", "every"),
        ("{required: maybe}", "quotas.client_id_policy.required", "valid boolean"),
        ("{requires: true}", "quotas.client_id_policy.requires", "Extra inputs are not permitted"),
    ],
)
def test_a_malformed_policy_is_refused_with_its_line_and_field(section: str, field: str, why: str) -> None:
    text = BASE + "quotas:\n  window: {num: 11, size_seconds: 1}\n  client_id_policy: " + section + "\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "kthrottle.yaml")
    assert f"kthrottle.yaml:4: {field}" in str(err.value) and why in str(err.value), str(err.value)


def _requests(version: int) -> dict[int, dict[str, Any]]:
    """A request body of each refusable API, with two topics where it has topics."""
    topic_id = bytes(range(1, 17))
    return {
        ApiKey.PRODUCE: {
            "acks": 1,
            "timeout_ms": 1000,
            "topic_data": [
                {"name": "a", "topic_id": topic_id, "partition_data": [{"index": 0, "records": None}]},
                {"name": "b", "topic_id": topic_id, "partition_data": [{"index": 3, "records": None}]},
            ],
        },
        ApiKey.FETCH: {
            "max_wait_ms": 500,
            "min_bytes": 1,
            "topics": [
                {"topic": "a", "topic_id": topic_id, "partitions": [{"partition": 2, "fetch_offset": 0}]}
            ],
        },
        ApiKey.CREATE_TOPICS: {"topics": [{"name": "a", "num_partitions": 3, "replication_factor": 1}]},
        ApiKey.CREATE_PARTITIONS: {"topics": [{"name": "a", "count": 6}], "timeout_ms": 1000},
        ApiKey.DELETE_TOPICS: {"topic_names": ["a"], "topics": [{"name": "a", "topic_id": topic_id}]},
        ApiKey.INIT_PRODUCER_ID: {"transactional_id": None, "transaction_timeout_ms": 1000},
    }


def _errors(api_key: int, body: dict[str, Any]) -> list[int]:
    """Every error code in a decoded response, wherever this API keeps them."""
    if api_key == ApiKey.PRODUCE:
        return [p["error_code"] for t in body["responses"] for p in t["partition_responses"]]
    if api_key == ApiKey.FETCH:
        top = [body["error_code"]] if "error_code" in body else []
        return top + [p["error_code"] for t in body["responses"] for p in t["partitions"]]
    if api_key == ApiKey.INIT_PRODUCER_ID:
        return [body["error_code"]]
    fields: dict[int, str] = {ApiKey.CREATE_TOPICS: "topics", ApiKey.CREATE_PARTITIONS: "results"}
    field = fields.get(api_key, "responses")
    return [r["error_code"] for r in body[field]]


@pytest.mark.parametrize("api_key", sorted(REFUSABLE_APIS))
@pytest.mark.parametrize("newest", [False, True], ids=["oldest", "newest"])
def test_every_refusable_api_is_answered_with_the_error_at_its_oldest_and_newest_version(
    api_key: int, newest: bool
) -> None:
    versions = codec_versions(api_key)
    assert versions is not None
    version = versions[1] if newest else versions[0]
    request = messages.decode_request(
        api_key, version, messages.encode(api_key, version, _requests(version)[api_key], response=False)
    )
    answer = refusal_response(api_key, version, request, ErrorCode.POLICY_VIOLATION, REQUIRED_MESSAGE)
    decoded = messages.decode_response(api_key, version, messages.encode_response(api_key, version, answer))
    errors = _errors(api_key, decoded)
    assert errors and set(errors) == {ErrorCode.POLICY_VIOLATION}, decoded
    if api_key == ApiKey.PRODUCE:
        assert [t["partition_responses"][0]["base_offset"] for t in decoded["responses"]] == [-1, -1]
    if api_key == ApiKey.INIT_PRODUCER_ID:
        assert decoded["producer_id"] == -1
