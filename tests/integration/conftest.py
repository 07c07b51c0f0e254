"""Real-broker fixtures: one KRaft cluster per size per test session (starting one costs seconds).

The 3-node cluster is three JVMs that cost CPU even when idle, so the modules that use it run
first (each module whole, in its own order) and the cluster stops after its last user rather
than idling through the rest of the suite.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.harness import KafkaCluster

log = logging.getLogger(__name__)


def _started(brokers: int, relayed_listeners: tuple[str, ...] = ()) -> KafkaCluster:
    """Start a cluster and log how long it took (visible with -o log_cli=true, or on failure)."""
    began = time.monotonic()
    cluster = KafkaCluster(brokers=brokers, relayed_listeners=relayed_listeners)
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
    """Three KRaft broker+controller nodes (ids 1..3) with a static quorum, shared by the session
    until its last user has run. Its listener EXCHANGE is advertised at ports where a test may
    put a relay, to cut one gateway replica off the cluster-quota exchange alone."""
    cluster = _started(3, relayed_listeners=("EXCHANGE",))
    _early_stop["cluster"] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()


_HERE = Path(__file__).resolve().parent
_early_stop: dict[str, KafkaCluster] = {}
_last_cluster3_user: list[str] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the integration modules that use ``kafka_cluster3`` first among the integration tests
    (whole modules, order otherwise kept), and note the last test that uses it."""
    here = [i for i, item in enumerate(items) if Path(str(item.path)).parent == _HERE]
    if not here:
        return
    ours = [items[i] for i in here]
    users = {item.path for item in ours if "kafka_cluster3" in getattr(item, "fixturenames", ())}
    ordered = sorted(ours, key=lambda item: item.path not in users)  # stable: module order kept
    for i, item in zip(here, ordered, strict=True):
        items[i] = item
    last = [item.nodeid for item in ordered if "kafka_cluster3" in getattr(item, "fixturenames", ())]
    _last_cluster3_user[:] = last[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After the last test that uses the 3-node cluster, stop it (its fixture's own teardown at
    the end of the session then finds nothing left to stop)."""
    if _last_cluster3_user and item.nodeid == _last_cluster3_user[0] and "cluster" in _early_stop:
        log.info("stopping the 3-node cluster after its last user, %s", item.nodeid)
        _early_stop.pop("cluster").stop()
