"""GET /connections: the live client connections and what each does, for `kthrottle top`.

Each connection's counters are kept by its pipeline as plain integers (requests and bytes each
way, its latest client id); this reads them when asked, so it costs nothing between requests.
Rates here are over the connection's whole life; `kthrottle top` takes two readings and shows
the rates between them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

SORT_KEYS = ("bytes_in", "bytes_out", "requests", "throttle", "age")
MAX_ROWS = 10_000


class Shown(Protocol):
    """What a connection shows of itself here (read only)."""

    @property
    def id(self) -> int: ...
    @property
    def peer(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def client_id(self) -> str: ...
    @property
    def node_id(self) -> int | None: ...
    @property
    def opened_at(self) -> float: ...
    @property
    def requests_in(self) -> int: ...
    @property
    def bytes_in(self) -> int: ...
    @property
    def bytes_out(self) -> int: ...
    @property
    def in_flight(self) -> Any: ...
    @property
    def pause_reasons(self) -> list[str]: ...
    @property
    def listener_name(self) -> str: ...

    def throttle_left_ms(self, now: float) -> int: ...
    def exempt(self, client_id: str) -> bool: ...


def connection_row(conn: Shown, now: float) -> dict[str, Any]:
    age = max(now - conn.opened_at, 1e-3)
    return {
        "id": conn.id,
        "principal": conn.user,
        "client_id": conn.client_id,
        "source": conn.peer,
        "listener": conn.listener_name,
        "broker": conn.node_id,
        "age_s": round(age, 3),
        "requests": conn.requests_in,
        "bytes_in": conn.bytes_in,
        "bytes_out": conn.bytes_out,
        "requests_per_s": round(conn.requests_in / age, 3),
        "bytes_in_per_s": round(conn.bytes_in / age, 1),
        "bytes_out_per_s": round(conn.bytes_out / age, 1),
        "in_flight": len(conn.in_flight),
        "throttle_left_ms": conn.throttle_left_ms(now),
        "paused": conn.pause_reasons,
        "exempt": conn.exempt(conn.client_id),
    }


def _sort_value(row: dict[str, Any], key: str) -> float:
    if key == "throttle":
        return float(row["throttle_left_ms"])
    if key == "age":
        return float(row["age_s"])
    return float(row[key])


def connection_rows(
    connections: Iterable[Shown],
    now: float,
    *,
    user: str | None = None,
    client_id: str | None = None,
    broker: int | None = None,
    sort: str = "bytes_in",
    limit: int = 100,
) -> dict[str, Any]:
    """The connections matching the filters (a name exactly), the busiest first by ``sort``."""
    if sort not in SORT_KEYS:
        raise ValueError(f"sort by one of {', '.join(SORT_KEYS)}, not {sort!r}")
    rows = [
        connection_row(conn, now)
        for conn in connections
        if (user is None or conn.user == user)
        and (client_id is None or conn.client_id == client_id)
        and (broker is None or conn.node_id == broker)
    ]
    rows.sort(key=lambda row: _sort_value(row, sort), reverse=True)
    return {"total": len(rows), "sort": sort, "connections": rows[: max(0, min(limit, MAX_ROWS))]}
