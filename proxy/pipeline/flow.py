"""A client connection's flow control: when its reads pause, mutes (KIP-219), holds while a
stage works on a request, and the requests read meanwhile, replayed in order afterwards.

``Pipeline`` builds on it; the stages use it through the pipeline (``proxy.pipeline.stages.Connection``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, Final

from proxy.net import transports
from proxy.net.transports import peer_has_closed
from proxy.pipeline.stages import InFlight
from proxy.pipeline.tasks import held

log = logging.getLogger("proxy.pipeline.connection")  # a held task's failure is the connection's

# Reasons a connection reads nothing new until they pass (other pauses only stop the socket).
_THROTTLE: Final = "throttle"  # muted for a throttle time
_THROTTLE_PENDING: Final = "throttle-pending"  # a throttled request's response has not gone out yet
_HOLD_REASONS: Final = frozenset({_THROTTLE, _THROTTLE_PENDING, "admission", "volume-pause", "quota-api"})


class Shutdown:
    """Whether the proxy drains for shutdown: one object the server and every connection share,
    compiled, so the look after each response is a native read (on the interpreted server it
    was an attribute lookup, 200 instructions a response)."""

    __slots__ = ("draining",)

    def __init__(self) -> None:
        self.draining = False


class ConnectionFlow:
    """Pauses, mutes and holds of one connection (the socket work is the pipeline's)."""

    id: int
    client: asyncio.Transport
    upstream: asyncio.Transport | None
    loop: asyncio.AbstractEventLoop
    closed: bool

    def __init__(self) -> None:
        self._client_pauses: set[str] = set()
        self._upstream_pauses: set[str] = set()
        self._mute_until = 0.0
        self._mute_handle: asyncio.TimerHandle | None = None
        self._watch_handle: asyncio.TimerHandle | None = None  # looks for the client leaving while paused
        self._pending_throttles = 0  # throttled requests whose response is still to come
        # Loop time the current incomplete request frame began arriving (reading time only: a
        # pause restarts it), or None between frames: the slowloris deadline.
        self.frame_started: float | None = None
        self.held: deque[bytes | bytearray] = deque()  # requests read while the connection was muted
        self._tasks: set[asyncio.Task[None]] = set()

    def close(self, reason: str | None = None, *, level: int = logging.WARNING) -> None:
        raise NotImplementedError

    def _request(self, frame: bytes | bytearray) -> None:
        raise NotImplementedError

    def pause_client(self, reason: str) -> None:
        if not self._client_pauses and not self.closed:
            self.client.pause_reading()
            if self._watch_handle is None:
                self._watch_handle = self.loop.call_later(
                    transports.PAUSED_PEER_CHECK_SECONDS, self._watch_client
                )
        self._client_pauses.add(reason)

    def hold(self, reason: str) -> None:
        """A stage holds the connection: nothing new is read until it releases ``reason``."""
        self.pause_client(reason)

    def _watch_client(self) -> None:
        """While reads are paused, close the connection once the client has left."""
        self._watch_handle = None
        if self.closed or not self._client_pauses:
            return
        if peer_has_closed(self.client):
            paused = ", ".join(sorted(self._client_pauses))
            self.close(f"client left while its reads were paused ({paused})", level=logging.INFO)
            return
        self._watch_handle = self.loop.call_later(transports.PAUSED_PEER_CHECK_SECONDS, self._watch_client)

    def resume_client(self, reason: str) -> None:
        self._client_pauses.discard(reason)
        if self._client_pauses or self.closed:
            return
        self._release_held()

    def release(self, reason: str) -> None:
        """A stage's hold is over: requests read meanwhile go first, then reading resumes."""
        self._client_pauses.discard(reason)
        self._release_held()

    def failed(self, what: str) -> None:
        """In an ``except`` block of a timer or a task: unlike a socket callback's, its exception
        would close nothing, and the client would wait for good, its reads paused, on a request
        never sent. A bug closes the connection instead, its traceback logged at ERROR."""
        log.exception("conn %d: %s failed", self.id, what)
        self.close(f"{what} failed")

    def _release_held(self) -> None:
        """Requests read while held go first, in order; one of them may hold the connection again.
        Called from timers and tasks too (a mute ending, a stage's hold ending), hence the guard."""
        try:
            while self.held and not self.holding and not self.closed:
                self._request(self.held.popleft())
        except Exception:
            self.failed("replaying a held request")
            return
        if not self._client_pauses and not self.closed:
            self.client.resume_reading()
            if self.frame_started is not None:
                self.frame_started = self.loop.time()  # the pause was ours, not the client's

    @property
    def holding(self) -> bool:
        pauses = self._client_pauses
        return bool(pauses) and not _HOLD_REASONS.isdisjoint(pauses)  # no new set, asked per request

    def throttle_left_ms(self, now: float) -> int:
        """What is left of the current throttle mute (0: none)."""
        return max(0, round((self._mute_until - now) * 1000)) if self._mute_until else 0

    @property
    def pause_reasons(self) -> list[str]:
        """Why the client side is not read now (throttle, a hold, backpressure), sorted."""
        return sorted(self._client_pauses)

    def frame_overdue(self, now: float, timeout: float) -> bool:
        """True when a request frame has been arriving for longer than ``timeout`` seconds of
        reading time (paused connections are never overdue: we are the ones not reading)."""
        started = self.frame_started
        return started is not None and not self._client_pauses and not self.closed and now - started > timeout

    def pause_upstream(self, reason: str) -> None:
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.pause_reading()
        self._upstream_pauses.add(reason)

    def resume_upstream(self, reason: str) -> None:
        self._upstream_pauses.discard(reason)
        if not self._upstream_pauses and self.upstream is not None and not self.closed:
            self.upstream.resume_reading()

    def mute(self, throttle_ms: int) -> None:
        """Stop reading from the client for ``throttle_ms`` (KIP-219's channel mute)."""
        until = self.loop.time() + throttle_ms / 1000.0
        if until <= self._mute_until or self.closed:
            return
        self._mute_until = until
        self.pause_client(_THROTTLE)
        if self._mute_handle is not None:
            self._mute_handle.cancel()
        self._mute_handle = self.loop.call_at(until, self._unmute)

    def _unmute(self) -> None:
        self._mute_handle = None
        self._mute_until = 0.0
        self.resume_client(_THROTTLE)

    def wait_before(self, frame: bytes | bytearray, wait_ms: int) -> None:
        """Put a request back, unread, and mute the connection ``wait_ms``: it is read again then."""
        self.held.appendleft(frame)
        self.mute(wait_ms)

    def hold_until_answered(self, entry: InFlight) -> None:
        """Read nothing more until ``entry``'s response has gone out (its mute follows)."""
        entry.holds_reads = True
        self._pending_throttles += 1
        self.pause_client(_THROTTLE_PENDING)

    def _answered(self, entry: InFlight) -> None:
        if entry.holds_reads:
            entry.holds_reads = False
            self._pending_throttles -= 1
            if not self._pending_throttles:
                self.resume_client(_THROTTLE_PENDING)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of this connection: cancelled when it closes."""
        task = self.loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_held(
        self, reason: str, work: Coroutine[Any, Any, bool | None], what: str
    ) -> asyncio.Task[None]:
        """Run ``work`` with the connection held for ``reason`` (nothing new is read meanwhile);
        the hold ends when it does, unless it returns True (then its hold ends elsewhere). An
        exception closes the connection: a bug must not leave it held for good."""
        self.pause_client(reason)
        return self.spawn(held(self, reason, work, what))
