"""The codec covers every version the pinned broker advertises for the APIs the proxy decodes,
and clients see through the proxy exactly the broker's versions, minus what it cannot carry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster
from dev.proxy_process import ProxyProcess, gateway_config
from protocol.api_keys import ApiKey, api_name
from protocol.versions import ADDRESS_LEAKING_CAP, ADVERTISED_BELOW_ACCEPTED, DECODED_APIS, codec_versions
from proxy.net.upstream_client import request

pytestmark = pytest.mark.integration


def _api_versions(address: str) -> dict[int, tuple[int, int]]:
    host, port = address.rsplit(":", 1)
    body = {"client_software_name": "kthrottle-test", "client_software_version": "1"}
    resp = asyncio.run(request(host, int(port), ApiKey.API_VERSIONS, 3, body, 30))
    assert resp["error_code"] == 0
    return {e["api_key"]: (e["min_version"], e["max_version"]) for e in resp["api_keys"]}


@pytest.fixture(scope="module")
def proxy(kafka_broker: KafkaCluster) -> Iterator[ProxyProcess]:
    with ProxyProcess(gateway_config(kafka_broker)) as proc:
        yield proc


@pytest.mark.timeout(60)
def test_codec_covers_every_advertised_version(kafka_broker: KafkaCluster) -> None:
    broker = _api_versions(kafka_broker.nodes[0].address)
    for key in DECODED_APIS:
        assert key in broker, f"broker does not advertise {api_name(key)}"
        known = codec_versions(key)
        assert known is not None
        lo, hi = broker[key]
        lo = max(lo, ADVERTISED_BELOW_ACCEPTED.get(key, lo))
        assert known[0] <= lo and hi <= known[1], f"{api_name(key)}: broker {lo}-{hi}, codec {known}"


@pytest.mark.timeout(60)
def test_clients_see_broker_versions_minus_what_cannot_be_carried(
    kafka_broker: KafkaCluster, proxy: ProxyProcess
) -> None:
    broker = _api_versions(kafka_broker.nodes[0].address)
    seen = _api_versions(proxy.bootstrap)
    for key, (lo, hi) in seen.items():
        assert api_name(key) is not None
        assert broker[key][0] <= lo <= hi <= broker[key][1]
    for key, rng in broker.items():
        if api_name(key) is None or (key in ADDRESS_LEAKING_CAP and ADDRESS_LEAKING_CAP[key] is None):
            assert key not in seen
        elif key in ADDRESS_LEAKING_CAP:
            assert seen[key][1] == min(rng[1], ADDRESS_LEAKING_CAP[key] or 0)
        else:
            assert seen[key] == rng, api_name(key)
