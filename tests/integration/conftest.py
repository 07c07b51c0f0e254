"""Real-broker fixtures: one KRaft cluster per size per test session (starting one costs seconds).

The 3-node cluster is three JVMs that cost CPU even when idle, so the modules that use it run
first (each module whole, in its own order) and the cluster stops after its last user rather
than idling through the rest of the suite. The single broker with a SASL listener, shared by the
modules whose clients log in, also stops after its last user.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.harness import KafkaCluster

log = logging.getLogger(__name__)


#: Who may log in to ``kafka_sasl_broker`` (PLAIN or SCRAM-SHA-256), with random passwords: a test
#: can look for them where no secret may appear.
SASL_USERS = {name: f"{name}-pw-{uuid.uuid4().hex}" for name in ("admin", "alice", "bob")}


def _started(
    brokers: int, relayed_listeners: tuple[str, ...] = (), sasl_users: dict[str, str] | None = None
) -> KafkaCluster:
    """Start a cluster and log how long it took (visible with -o log_cli=true, or on failure)."""
    began = time.monotonic()
    cluster = KafkaCluster(brokers=brokers, relayed_listeners=relayed_listeners, sasl_users=sasl_users)
    cluster.start()  # stops its nodes and raises with their log tails if they do not come up
    log.info(
        "%d-node kafka cluster up in %.1fs at %s",
        brokers,
        time.monotonic() - began,
        cluster.bootstrap_servers,
    )
    return cluster


def discard_cluster(cluster: KafkaCluster) -> None:
    """Stop a cluster whose data nobody reads again: SIGKILL rather than a controlled shutdown,
    which three nodes shutting down together take about 6 s over (one node, under half a second)."""
    for node in cluster.nodes:
        cluster._signal(node, signal.SIGKILL)
    cluster.stop()  # reaps the nodes and removes the workdir it made


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaCluster]:
    """A single KRaft broker+controller on loopback, shared by the session. Its listener RELAY is
    advertised at a port where a test may put a relay (a client's answers held there)."""
    cluster = _started(1, relayed_listeners=("RELAY",))
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
    _early_stop["kafka_cluster3"] = cluster
    try:
        yield cluster
    finally:
        discard_cluster(cluster)


@pytest.fixture(scope="session")
def kafka_sasl_broker() -> Iterator[KafkaCluster]:
    """One KRaft broker with a SASL_PLAINTEXT listener where ``SASL_USERS`` log in (its PLAINTEXT
    listener stays for tools and checks), shared by the session until its last user has run."""
    cluster = _started(1, sasl_users=SASL_USERS)
    _early_stop["kafka_sasl_broker"] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()


_HERE = Path(__file__).resolve().parent
_EARLY_STOPPED = ("kafka_cluster3", "kafka_sasl_broker")
_BREAKS_NODES = frozenset({"test_faults.py"})  # its tests kill, pause and restart the 3 nodes
_early_stop: dict[str, KafkaCluster] = {}  # fixture name -> its running cluster
_last_user: dict[str, str] = {}  # fixture name -> node id of the last test that uses it


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the integration modules that use ``kafka_cluster3`` first among the integration tests
    (whole modules, order otherwise kept, those that break its nodes last), and note the last
    test that uses each shared cluster stopped early."""
    here = [i for i, item in enumerate(items) if Path(str(item.path)).parent == _HERE]
    if not here:
        return
    ours = [items[i] for i in here]
    users = {item.path for item in ours if "kafka_cluster3" in getattr(item, "fixturenames", ())}
    # Stable: module order kept, but the modules that kill or pause its nodes go last of its users.
    ordered = sorted(ours, key=lambda item: (item.path not in users, item.path.name in _BREAKS_NODES))
    for i, item in zip(here, ordered, strict=True):
        items[i] = item
    for name in _EARLY_STOPPED:
        for item in reversed(ordered):
            if name in getattr(item, "fixturenames", ()):
                _last_user[name] = item.nodeid
                break


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After the last test that uses the 3-node cluster (or the SASL broker), stop it (its
    fixture's own teardown at the end of the session then finds nothing left to stop)."""
    for name, last in _last_user.items():
        if item.nodeid == last and name in _early_stop:
            log.info("stopping %s after its last user, %s", name, item.nodeid)
            discard_cluster(_early_stop.pop(name))
