"""An event loop with virtual time and in-memory transports, so a real Pipeline runs without sockets.

The fuzz target drives both peers of a pipeline by hand: it feeds the client's bytes, answers as
the broker, and moves the clock so throttle mutes and connection holds end without waiting.
The transports behave like asyncio's where the pipeline can tell: reads stop while paused and
resume from the loop, ``close`` reports ``connection_lost`` on a later loop turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

Reads = asyncio.Protocol | asyncio.BufferedProtocol  # what a transport hands its reads to
READ_BYTES = 256 * 1024  # what uvloop reads into its own buffer at most, for a plain protocol


class FakeTransport(asyncio.Transport):
    """One side of a connection held in memory: what the proxy writes, and what it is sent."""

    def __init__(self, loop: FuzzLoop, protocol: Reads, peer: tuple[str, int]) -> None:
        super().__init__()
        self._loop = loop
        self.protocol = protocol
        self.extra: dict[str, Any] = {"peername": peer, "sockname": ("127.0.0.1", 1)}
        self.written = bytearray()  # everything the proxy wrote here, in order
        self.writes_after_close = 0
        self.inbox = bytearray()  # bytes the peer sent that the proxy has not read yet
        self.paused = False
        self.closed = False  # close() was called (by the proxy, or the peer went away)
        self.lost = False  # connection_lost was delivered

    # --- the proxy's side -------------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            self.writes_after_close += 1
            return
        self.written += data

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self._loop.call_soon(self.deliver)

    def is_reading(self) -> bool:
        return not self.paused and not self.closed

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, (asyncio.Protocol, asyncio.BufferedProtocol))
        self.protocol = protocol  # the next read goes to it, as asyncio's and uvloop's do

    def get_protocol(self) -> Reads:
        return self.protocol

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    # --- the peer's side ------------------------------------------------------------------------

    def send(self, data: bytes | bytearray | memoryview) -> None:
        """The peer sends ``data``: the proxy reads it now, or when it resumes reading."""
        if self.closed:
            return
        self.inbox += data
        self.deliver()

    def deliver(self) -> None:
        """Hand pending bytes to the protocol the way a transport does: into a buffered
        protocol's own buffer, or to a plain one as ``bytes`` (at most READ_BYTES a read, as
        uvloop's reads)."""
        while self.inbox and not self.paused and not self.closed:
            protocol = self.protocol
            if isinstance(protocol, asyncio.BufferedProtocol):
                buf = memoryview(protocol.get_buffer(-1))
                n = min(len(buf), len(self.inbox))
                if n == 0:
                    raise AssertionError("get_buffer returned an empty buffer")
                buf[:n] = self.inbox[:n]
                del self.inbox[:n]
                protocol.buffer_updated(n)
            else:
                data = bytes(self.inbox[:READ_BYTES])
                del self.inbox[: len(data)]
                protocol.data_received(data)

    def hang_up(self) -> None:
        """The peer closes its socket: EOF, then the connection is lost."""
        if self.closed:
            return
        self.protocol.eof_received()
        self.closed = True
        self._loop.call_soon(self._connection_lost, None)

    def _connection_lost(self, exc: Exception | None) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(exc)


class FuzzLoop(asyncio.SelectorEventLoop):
    """A selector loop whose clock moves only when told, and whose connections are FakeTransports."""

    def __init__(self) -> None:
        self._now = time.monotonic()
        super().__init__()
        self.on_connection: Callable[[FakeTransport], None] | None = None

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **_kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        protocol = protocol_factory()
        assert isinstance(protocol, (asyncio.Protocol, asyncio.BufferedProtocol))
        transport = FakeTransport(self, protocol, (host or "", port or 0))
        protocol.connection_made(transport)
        if self.on_connection is not None:
            self.on_connection(transport)
        return transport, protocol

    def settle(self, max_turns: int = 200) -> None:
        """Run loop turns until nothing is ready (timers due at the virtual time included)."""
        for _ in range(max_turns):
            self.call_soon(self.stop)
            self.run_forever()
            if not self._ready:  # type: ignore[attr-defined]
                return
        raise AssertionError(f"the loop did not settle in {max_turns} turns")
