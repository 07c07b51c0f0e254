"""Where the proxy asks for the cluster's brokers: not only the configured bootstrap addresses."""

from __future__ import annotations

from proxy.config import parse_config
from proxy.net.brokers import BrokerDirectory


def directory(mode: str) -> BrokerDirectory:
    if mode == "gateway":
        cfg = parse_config("gateway: {upstream_bootstrap: ['kafka-0:9092']}")
    else:
        cfg = parse_config("mode: sidecar\nsidecar: {upstream: '127.0.0.1:9093'}")
    return BrokerDirectory(cfg)


def test_a_gateway_asks_every_broker_it_learned_after_its_bootstrap() -> None:
    """One bootstrap broker restarting must not leave every replica unable to refresh (and
    unready) at once: the brokers learned since are asked too."""
    brokers = directory("gateway")
    assert brokers.discovery_addresses() == [("kafka-0", 9092)]
    brokers.learn(2, "kafka-2", 9092)
    brokers.learn(1, "kafka-1", 9092)
    brokers.learn(0, "kafka-0", 9092)  # the bootstrap address itself is not asked twice
    assert brokers.discovery_addresses() == [("kafka-0", 9092), ("kafka-1", 9092), ("kafka-2", 9092)]
    # The one that answered last is asked first: a bootstrap broker that is down costs nothing.
    assert brokers.discovery_addresses(("kafka-2", 9092))[0] == ("kafka-2", 9092)


def test_a_sidecar_asks_its_own_broker_only() -> None:
    brokers = directory("sidecar")
    brokers.learn(7, "10.0.0.7", 9092)
    assert brokers.discovery_addresses() == [("127.0.0.1", 9093)]
