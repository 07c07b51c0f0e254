"""The image step's broker: one real KRaft broker on loopback for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    with KafkaCluster(brokers=1) as cluster:
        yield cluster
