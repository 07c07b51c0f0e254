"""Requests still waiting for their answer: how long the oldest of each API has waited, and a
warning for any that waits far longer than a Kafka request should.

A client whose request is never answered sees nothing until its own request timeout (30 s for
the Java and kafka-python 3 clients; a JoinGroup's is the group's rebalance timeout plus 5 s,
305 s by default), and a consumer group then goes quiet with no error. This tells at once
whether such a request is waiting in the proxy (for the broker's answer, or behind a throttle)
or was never sent to it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.api_keys import ApiKey, api_name
from proxy.pipeline.stages.base import InFlight
from proxy.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
stall_log = RateLimitedLog(log, interval=60.0)

# Longer than a broker takes to answer in health (a Fetch waits at most its max_wait, 500 ms by
# default; a Produce or a topic change at most the timeout it carries, which clients set to their
# request timeout), and shorter than the clients' 30 s request timeout, so it is said while the
# client still waits (it closes the connection then). The proxy's throttles are added to this.
# JoinGroup and SyncGroup wait for the whole group, up to its rebalance timeout (a consumer's
# max.poll.interval.ms, 5 minutes by default), so they are left out of the warning (not of the
# gauge).
STALLED_SECONDS = 20.0
_GROUP_WAITS = frozenset({ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})


class Waiting(Protocol):
    """What a connection shows of itself here (read only)."""

    @property
    def id(self) -> int: ...
    @property
    def peer(self) -> str: ...
    @property
    def in_flight(self) -> Iterable[InFlight]: ...


def oldest_by_api(connections: Iterable[Waiting], now: float) -> dict[int, float]:
    """Seconds the oldest unanswered request of each API key has waited."""
    oldest: dict[int, float] = {}
    for conn in connections:
        for entry in conn.in_flight:
            age = now - entry.sent_at
            if age > oldest.get(entry.api_key, -1.0):
                oldest[entry.api_key] = age
    return oldest


def warn_stalled(connections: Iterable[Waiting], now: float) -> int:
    """Log each request waiting past ``STALLED_SECONDS`` beyond its throttle (rate-limited);
    returns how many there are."""
    stalled = 0
    for conn in connections:
        for entry in conn.in_flight:
            waited = now - entry.sent_at - entry.throttle_ms / 1000
            if waited < STALLED_SECONDS or entry.api_key in _GROUP_WAITS:
                continue
            stalled += 1
            stall_log.log(
                logging.WARNING,
                "stalled",
                "conn %d from %s: %s request (client %r, correlation id %d) unanswered after %.0f s%s",
                conn.id,
                conn.peer,
                api_name(entry.api_key) or entry.api_key,
                entry.client_id,
                entry.correlation_id,
                now - entry.sent_at,
                f" ({entry.throttle_ms} ms of it the proxy's throttle)" if entry.throttle_ms else "",
            )
    return stalled


class PendingRequestsCollector(Collector):
    """kthrottle_oldest_pending_request_seconds{api}, computed at scrape time."""

    def __init__(self, connections: Callable[[], Iterable[Waiting]], clock: Callable[[], float]) -> None:
        self._connections = connections
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "kthrottle_oldest_pending_request_seconds",
            "How long the oldest request of each api still waiting for its answer has waited "
            "(throttles included); absent when none waits",
            labels=["api"],
        )
        for key, age in sorted(oldest_by_api(self._connections(), self._clock()).items()):
            gauge.add_metric([api_name(key) or "unknown"], age)
        yield gauge
