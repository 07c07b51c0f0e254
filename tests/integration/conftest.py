"""Real-broker fixtures: one KRaft cluster per size per test session (starting one costs seconds)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from dev.harness import KafkaCluster

log = logging.getLogger(__name__)


def _started(brokers: int) -> KafkaCluster:
    """Start a cluster and log how long it took (visible with -o log_cli=true, or on failure)."""
    began = time.monotonic()
    cluster = KafkaCluster(brokers=brokers)
    cluster.start()  # stops its nodes and raises with their log tails if they do not come up
    log.info(
        "%d-node kafka cluster up in %.1fs at %s",
        brokers,
        time.monotonic() - began,
        cluster.bootstrap_servers,
    )
    return cluster


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    """A single KRaft broker+controller on loopback, shared by the session."""
    cluster = _started(1)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3() -> Iterator[KafkaCluster]:
    """Three KRaft broker+controller nodes (ids 1..3) with a static quorum, shared by the session."""
    cluster = _started(3)
    try:
        yield cluster
    finally:
        cluster.stop()
