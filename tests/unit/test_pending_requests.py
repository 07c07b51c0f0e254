"""The oldest request still waiting for its answer, by api, and the warning for one stalled."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from protocol.api_keys import ApiKey
from proxy.admin.pending_requests import (
    STALLED_SECONDS,
    PendingRequestsCollector,
    oldest_by_api,
    warn_stalled,
)
from proxy.pipeline.stages.base import InFlight


@dataclass
class Conn:
    id: int
    peer: str = "10.0.0.5:5000"
    in_flight: list[InFlight] = field(default_factory=list)


def entry(api: ApiKey, sent_at: float, throttle_ms: int = 0, correlation_id: int = 1) -> InFlight:
    return InFlight(int(api), 12, correlation_id, sent_at, client_id="app", throttle_ms=throttle_ms)


def test_the_oldest_of_each_api_over_all_connections() -> None:
    conns = [
        Conn(1, in_flight=[entry(ApiKey.FETCH, 90.0), entry(ApiKey.PRODUCE, 99.0)]),
        Conn(2, in_flight=[entry(ApiKey.FETCH, 40.0)]),
        Conn(3),
    ]
    assert oldest_by_api(conns, 100.0) == {int(ApiKey.FETCH): 60.0, int(ApiKey.PRODUCE): 1.0}
    registry = CollectorRegistry()
    registry.register(PendingRequestsCollector(lambda: conns, lambda: 100.0))
    text = generate_latest(registry).decode()
    assert 'kthrottle_oldest_pending_request_seconds{api="Fetch"} 60.0' in text
    conns.clear()  # none waiting: no sample at all, not a stale one
    assert "kthrottle_oldest_pending_request_seconds{" not in generate_latest(registry).decode()


def test_a_request_unanswered_past_the_limit_is_logged_once_its_throttle_is_allowed_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = 1000.0
    conns = [
        Conn(
            7,
            in_flight=[
                entry(ApiKey.FETCH, now - STALLED_SECONDS - 1, correlation_id=41),
                entry(ApiKey.FETCH, now - STALLED_SECONDS - 1, throttle_ms=5000),  # its throttle: not yet
                entry(ApiKey.JOIN_GROUP, now - 280),  # a group's wait, up to its rebalance timeout
            ],
        )
    ]
    with caplog.at_level(logging.WARNING, logger="proxy.admin.pending_requests"):
        assert warn_stalled(conns, now) == 1
    (record,) = caplog.records
    assert "conn 7 from 10.0.0.5:5000: Fetch request (client 'app', correlation id 41) unanswered" in (
        record.getMessage()
    )
