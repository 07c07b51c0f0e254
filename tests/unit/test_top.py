"""GET /connections' rows (proxy/admin/connections.py) and `kthrottle top`'s rates and table
(proxy/admin/top_cli.py), from fake connections and readings."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from proxy.admin.connections import connection_rows
from proxy.admin.top_cli import rates, render


@dataclass
class Conn:
    id: int
    user: str = "ANONYMOUS"
    client_id: str = "app"
    node_id: int | None = 1
    bytes_in: int = 0
    bytes_out: int = 0
    requests_in: int = 0
    peer: str = "10.0.0.5:5000"
    opened_at: float = 90.0
    listener_name: str = "broker-1"
    in_flight: deque[Any] = field(default_factory=deque)
    pause_reasons: list[str] = field(default_factory=list)
    mute_until: float = 0.0

    def throttle_left_ms(self, now: float) -> int:
        return max(0, round((self.mute_until - now) * 1000))

    def exempt(self, client_id: str) -> bool:
        return client_id == "ops"


def test_rows_filter_sort_and_say_what_holds_each_back() -> None:
    conns = [
        Conn(1, bytes_in=5_000, requests_in=10),
        Conn(
            2,
            user="alice",
            client_id="etl",
            node_id=2,
            bytes_in=90_000,
            mute_until=100.4,
            pause_reasons=["throttle"],
        ),
        Conn(3, client_id="ops", node_id=None, listener_name="bootstrap", bytes_out=1_000_000),
    ]
    answer = connection_rows(conns, 100.0)
    assert [r["id"] for r in answer["connections"]] == [2, 1, 3] and answer["total"] == 3
    busy = answer["connections"][0]
    assert (busy["principal"], busy["client_id"], busy["broker"], busy["throttle_left_ms"]) == (
        "alice",
        "etl",
        2,
        400,
    )
    assert busy["paused"] == ["throttle"] and busy["bytes_in_per_s"] == 9_000.0  # over its 10 s
    assert connection_rows(conns, 100.0, sort="bytes_out")["connections"][0]["exempt"] is True
    assert [r["id"] for r in connection_rows(conns, 100.0, user="alice")["connections"]] == [2]
    assert [r["id"] for r in connection_rows(conns, 100.0, broker=1)["connections"]] == [1]
    assert connection_rows(conns, 100.0, limit=1)["total"] == 3
    with pytest.raises(ValueError, match="sort by one of"):
        connection_rows(conns, 100.0, sort="nonsense")


def _reading(*rows: dict[str, Any]) -> dict[str, Any]:
    base = {
        "principal": "u",
        "client_id": "c",
        "source": "s",
        "broker": 1,
        "age_s": 10.0,
        "throttle_left_ms": 0,
        "paused": [],
        "exempt": False,
        "listener": "broker-1",
        "in_flight": 0,
    }
    return {"total": len(rows), "connections": [{**base, **r} for r in rows]}


def test_rates_are_between_two_readings_and_a_new_connection_over_its_age() -> None:
    before = _reading({"id": 1, "requests": 10, "bytes_in": 1000, "bytes_out": 0})
    after = _reading(
        {"id": 1, "requests": 30, "bytes_in": 5000, "bytes_out": 200},
        {"id": 2, "requests": 4, "bytes_in": 400, "bytes_out": 40, "age_s": 0.5},
    )
    got = {r["id"]: r for r in rates(before, after, 2.0)}
    assert (got[1]["requests_per_s"], got[1]["bytes_in_per_s"], got[1]["bytes_out_per_s"]) == (
        10.0,
        2000.0,
        100.0,
    )
    assert got[2]["bytes_in_per_s"] == 800.0


def test_the_table_shows_the_busiest_first_with_throttle_and_state() -> None:
    rows = rates(
        _reading(),
        _reading(
            {"id": 1, "requests": 10, "bytes_in": 10, "bytes_out": 0},
            {
                "id": 7,
                "requests": 5,
                "bytes_in": 3 * 1024 * 1024,
                "bytes_out": 0,
                "throttle_left_ms": 850,
                "paused": ["throttle"],
                "client_id": "a-very-long-generated-client-id-0123456789",
            },
        ),
        1.0,
    )
    lines = render(rows, "bytes_in", 2)
    assert lines[1].split()[:3] == ["ID", "PRINCIPAL", "CLIENT"]
    assert lines[2].split()[0] == "7" and "850ms" in lines[2] and "throttle" in lines[2]
    assert "~" in lines[2]  # a long client id is cut to its column
    assert lines[3].split()[0] == "1"
