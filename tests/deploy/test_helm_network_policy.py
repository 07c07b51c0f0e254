"""The chart's NetworkPolicy (issue 30): on for the gateway by default, off for the sidecar; the
Kafka ports open to clients, the admin port to the proxy's own pods and to adminFrom only."""

from __future__ import annotations

from typing import Any

from tests.deploy.test_helm_chart import docs_of, render


def _policy(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return found[0] if found else None


def test_the_gateway_has_one_by_default_and_the_sidecar_none(helm: str) -> None:
    gateway = _policy(docs_of(render(helm, None)))
    assert gateway is not None
    assert gateway["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    clients, admin = gateway["spec"]["ingress"]
    assert [p["port"] for p in clients["ports"]] == ["kafka", "broker-0", "broker-1", "broker-2"]
    assert "from" not in clients  # any client
    assert admin["ports"] == [{"port": 9644, "protocol": "TCP"}]
    own, *others = admin["from"]
    assert own["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"
    assert others == [{"namespaceSelector": {}}]  # the cluster's pods (Prometheus), nothing outside
    assert _policy(docs_of(render(helm, None, "mode=sidecar"))) is None
    assert _policy(docs_of(render(helm, None, "networkPolicy.enabled=false"))) is None


def test_it_can_be_narrowed_and_turned_on_for_the_sidecar(helm: str) -> None:
    sets = (
        "networkPolicy.adminFrom[0].namespaceSelector.matchLabels.team=monitoring",
        "networkPolicy.clientFrom[0].namespaceSelector.matchLabels.kafka-clients=yes",
    )
    policy = _policy(docs_of(render(helm, None, *sets)))
    assert policy is not None
    clients, admin = policy["spec"]["ingress"]
    assert clients["from"] == [{"namespaceSelector": {"matchLabels": {"kafka-clients": "yes"}}}]
    assert admin["from"][1] == {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}
    sidecar = _policy(
        docs_of(
            render(
                helm,
                None,
                "mode=sidecar",
                "networkPolicy.enabled=true",
                "networkPolicy.extraIngress[0].ports[0].port=9093",  # the broker's own listener
            )
        )
    )
    assert sidecar is not None
    assert sidecar["spec"]["ingress"][0]["ports"] == [{"port": 9092, "protocol": "TCP"}]
    assert sidecar["spec"]["ingress"][2] == {"ports": [{"port": 9093}]}
