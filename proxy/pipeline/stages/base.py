"""What a stage is, and what it shares with the pipeline and the other stages.

A stage is one concern of the proxy (a quota family, address rewriting, capture, ...). The
pipeline owns the connection; for each request it runs the stages that asked for the request's
API key, in order, each able to let it pass, add a throttle, hold it, answer it itself or take it
over. A stage that wants to see the response says so on the request, and its ``on_response``
runs when the answer comes back. A request no stage asked for is forwarded without being decoded.

Stages are made per connection (``StageFactory``), so per-connection state lives in the stage.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Callable, Collection, Coroutine
from typing import TYPE_CHECKING, Any, Final, Protocol

from mypy_extensions import mypyc_attr

from protocol import messages
from protocol.api_keys import PRODUCE_KEY
from protocol.frames import FrameError, RequestHeader, response_header_size
from protocol.produce_scan import read_produce_acks
from protocol.sasl import SaslTracker

if TYPE_CHECKING:
    from proxy.capture.rows import CaptureDraft
    from proxy.pipeline.host import Host
    from proxy.shared.admission import MutationState
    from proxy.shared.quota_api import QuotaAlterBoth
    from proxy.shared.throttling import FetchCharge, FetchRequestInfo

EVERY_KEY: Final[None] = None  # ``Stage.request_keys`` answer: every API key


class StreamFilter(Protocol):
    """A stage's part in a response streamed to the client (``Stage.stream_filter``)."""

    def feed(self, data: memoryview | bytes) -> int:
        """The frame's next bytes went by: how many of them may go out now (the rest, and all
        that follows, is held until ``finish``)."""
        ...

    def finish(self, tail: bytearray) -> None:
        """The frame is complete: change the held bytes in place (never their length)."""
        ...

    def skippable(self) -> int:
        """How many of the frame's next bytes the filter need not see (0: it looks at them);
        those may go by without being fed (spliced: ``proxy/net/splice.py``), then ``skip``."""
        ...

    def skip(self, n: int) -> None:
        """``n`` (at most ``skippable()``) of the frame's next bytes went by unseen."""
        ...


class _Whole:
    """``Stage.stream_filter`` answer: this response must be gathered whole (never fed)."""

    def feed(self, data: memoryview | bytes) -> int:
        raise AssertionError("a response a stage needs whole is not streamed")

    def finish(self, tail: bytearray) -> None:
        raise AssertionError("a response a stage needs whole is not streamed")

    def skippable(self) -> int:
        raise AssertionError("a response a stage needs whole is not streamed")

    def skip(self, n: int) -> None:
        raise AssertionError("a response a stage needs whole is not streamed")


WHOLE: Final[StreamFilter] = _Whole()


class InFlight:
    """A request forwarded (or held, or answered by the proxy) whose response is still to go out.

    A plain class, not a dataclass: compiled, a dataclass's generated ``__init__`` stays
    interpreted, and one is built per request (docs/architecture.md, "The compiled hot path")."""

    __slots__ = (
        "api_key",
        "api_version",
        "busy",
        "capture",
        "charge_time",
        "client_id",
        "correlation_id",
        "exempt",
        "fetch",
        "fetch_charge",
        "holds_reads",
        "local_response",
        "mutation",
        "quota_alter",
        "sent_at",
        "stages",
        "throttle_ms",
        "watchers",
    )

    def __init__(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        sent_at: float,
        local_response: bytes | None = None,
        client_id: str = "",
        throttle_ms: int = 0,
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.sent_at = sent_at
        self.local_response: bytes | None = local_response  # answered by the proxy itself, in its turn
        self.client_id = client_id
        self.throttle_ms = throttle_ms  # the proxy's throttle for this request
        self.stages: tuple[Stage, ...] = ()  # whose on_response runs when the answer comes
        self.watchers: tuple[Stage, ...] = ()  # whose on_done runs once the answer went out
        self.holds_reads = False  # a throttled request: reads stay paused until its response
        self.charge_time = False  # its upstream time counts against request_percentage
        self.exempt = False  # quotas.exempt lets it through (Request.exempt)
        self.busy = 0.0  # seconds the broker spent on it, as far as the proxy can tell
        self.fetch: FetchRequestInfo | None = None  # set when the fetch quota needs the response
        self.fetch_charge: FetchCharge | None = None  # what the fetch quota charged its response
        self.mutation: MutationState | None = None  # set when the mutation quota needs the response
        self.capture: CaptureDraft | None = None  # what the capture record needs, while capture is on
        self.quota_alter: QuotaAlterBoth | None = None  # quota_api.mode both: the proxy's part of an alter

    def __repr__(self) -> str:
        return (
            f"InFlight(api_key={self.api_key}, api_version={self.api_version}, "
            f"correlation_id={self.correlation_id}, client_id={self.client_id!r})"
        )


class Request:
    """One request frame while the stages look at it; its body is decoded once, when first asked."""

    __slots__ = (
        "_acks",
        "_body",
        "capture",
        "charge_time",
        "client_id",
        "exempt",
        "fetch",
        "frame",
        "header",
        "stages",
        "throttle_ms",
        "watchers",
    )

    def __init__(self, header: RequestHeader, frame: bytes | bytearray) -> None:
        self.header = header
        self.frame = frame
        self._body: dict[str, Any] | None = None
        self._acks: int | None = None
        self.throttle_ms = 0  # applied: a response is held until it goes out, else a mute
        self.stages: tuple[Stage, ...] = ()
        self.watchers: tuple[Stage, ...] = ()
        self.charge_time = False
        self.exempt = False  # quotas.exempt: decided once, when the pipeline reads the request
        self.client_id = header.client_id or ""  # the id its quotas see (quotas.client_id_policy)
        self.fetch: FetchRequestInfo | None = None
        self.capture: CaptureDraft | None = None

    @property
    def body(self) -> dict[str, Any]:
        """The decoded request (SchemaError for a malformed one: the pipeline rejects it)."""
        if self._body is None:
            header = self.header
            self._body = messages.decode_request(
                header.api_key, header.api_version, memoryview(self.frame)[header.size :]
            )
        return self._body

    @property
    def acks(self) -> int | None:
        """A Produce request's acks (read from the bytes unless the body is decoded); None otherwise."""
        if self._acks is None and self.header.api_key == PRODUCE_KEY:
            header = self.header
            if self._body is not None:
                self._acks = messages.produce_acks(self._body)
            else:
                self._acks = read_produce_acks(header.api_version, self.frame, header.size)
        return self._acks

    @property
    def expects_response(self) -> bool:
        if self.header.api_key != PRODUCE_KEY:
            return True
        acks = self.acks  # narrowed, compiled, the comparison is of two ints, not two objects
        return acks is None or acks != 0

    def want_response(self, stage: Stage) -> None:
        """``stage.on_response`` runs on this request's response."""
        # Most requests have one such stage: a new 1-tuple, not one joined to the empty one.
        self.stages = (*self.stages, stage) if self.stages else (stage,)

    def watch(self, stage: Stage) -> None:
        """``stage.on_done`` runs once the exchange is over (answer sent, or none to wait for)."""
        self.watchers += (stage,)


class Response:
    """One response frame while the stages look at it: decoded once, when first asked; a stage
    may replace it whole or ask for it to be re-encoded from its (changed) body. A stage that
    changes only the start of a large answer keeps the rest as the broker's bytes, ``tail``: it
    goes out after ``frame`` uncopied and is joined to it only if a stage decodes the answer."""

    __slots__ = ("_body", "_hsize", "entry", "frame", "reencode", "replacement", "tail")

    def __init__(self, entry: InFlight, frame: bytes | bytearray) -> None:
        self.entry = entry
        self.frame = frame
        self._hsize: int | None = None
        self._body: dict[str, Any] | None = None
        self.replacement: bytearray | None = None  # what goes out instead (no throttle patch)
        self.reencode = False  # the body changed: encode it (with the throttle) instead
        self.tail: memoryview | None = None  # the broker's bytes that follow ``frame``, unchanged

    @property
    def header_size(self) -> int:
        if self._hsize is None:
            self._hsize = response_header_size(self.entry.api_key, self.entry.api_version, self.frame)
        return self._hsize

    @property
    def size(self) -> int:
        """The bytes that go out (without the size prefix) if no stage changes them."""
        tail = self.tail
        return len(self.frame) if tail is None else len(self.frame) + len(tail)

    @property
    def body(self) -> dict[str, Any]:
        """The decoded response (SchemaError, FrameError or LookupError for one the codec cannot
        read: the pipeline closes the connection)."""
        if self._body is None:
            tail = self.tail
            if tail is not None:  # a stage reads all of it: one buffer again
                joined = bytearray(self.frame)
                joined += tail
                self.frame = joined
                self.tail = None
            entry = self.entry
            view = memoryview(self.frame)[self.header_size :]
            self._body = messages.decode_response(entry.api_key, entry.api_version, view)
        return self._body

    @property
    def decoded(self) -> bool:
        return self._body is not None

    def replace_body(self, body: dict[str, Any]) -> bytearray:
        """Send ``body`` encoded in place of the broker's (its header kept); returns it."""
        entry = self.entry
        out = bytearray(self.frame[: self.header_size])
        out += messages.encode_response(entry.api_key, entry.api_version, body)
        self.replacement = out
        return out

    def finished(self) -> bytes | bytearray:
        """The bytes to send: replaced, re-encoded with the throttle, or patched in place (then
        followed by ``tail``, if one is left)."""
        if self.replacement is not None:
            self.tail = None
            return self.replacement
        entry = self.entry
        key, version = entry.api_key, entry.api_version
        if self.reencode:
            body = self.body
            body["throttle_time_ms"] = messages.wire_throttle_ms(
                max(int(body.get("throttle_time_ms", 0)), entry.throttle_ms)
            )
            return self.replace_body(body)  # compiled, self.replacement stays narrowed to None
        if entry.throttle_ms and messages.can_read_response(key, version):
            # An API or version newer than the shipped schemas goes out unchanged; the mute that
            # follows still throttles the client. Only what comes before throttle_time_ms is read
            # (nothing, where it comes first): a throttled answer of 100,000 partitions is not
            # decoded to patch four bytes.
            self._body = None  # the record views into frame must go before it is patched
            hsize = self.header_size
            frame = self.frame
            if not isinstance(frame, bytearray):
                frame = self.frame = bytearray(frame)  # the decoder's frames are immutable bytes
            try:
                messages.patch_throttle_time(key, version, memoryview(frame)[hsize:], entry.throttle_ms)
            except struct.error as short:  # not `exc`: compiled, a name has one type
                raise FrameError(f"no room for throttle_time_ms: {short}") from short
        return self.frame


class Connection(Protocol):
    """What a stage may use of its connection (the pipeline)."""

    id: int
    peer: str
    user: str
    node_id: int | None
    sasl: SaslTracker
    server: Host
    loop: asyncio.AbstractEventLoop
    closed: bool
    in_flight: deque[InFlight]
    requests_in: int  # requests read and counted so far (forwarded or answered)

    def exempt(self, client_id: str) -> bool: ...
    def read_client_id(self, req: Request) -> None: ...
    def reject(self, reason: str, label: str) -> None: ...
    def close(self, reason: str | None = None, *, level: int = logging.WARNING) -> None: ...
    def mute(self, throttle_ms: int) -> None: ...
    def wait_before(self, frame: bytes | bytearray, wait_ms: int) -> None: ...
    def hold(self, reason: str) -> None: ...
    def release(self, reason: str) -> None: ...
    def hold_until_answered(self, entry: InFlight) -> None: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...
    def spawn_held(
        self, reason: str, work: Coroutine[Any, Any, bool | None], what: str
    ) -> asyncio.Task[None]: ...
    def send(self, frame: bytes | bytearray) -> None: ...
    def entry_for(self, req: Request, counted: bool = True) -> InFlight: ...
    def encoded_answer(self, header: RequestHeader, body: dict[str, Any]) -> bytes: ...
    def answer(self, entry: InFlight, payload: bytes) -> None: ...
    def flush_local(self) -> None: ...


@mypyc_attr(allow_interpreted_subclasses=True)  # every other stage is pure Python
class Stage:
    """One concern of the proxy, made per connection. Every hook is optional."""

    def request_keys(self) -> Collection[int] | None:
        """The API keys whose requests ``on_request`` sees (``EVERY_KEY``: all), given the config
        in force; asked again when the quotas are reconfigured."""
        return ()

    def wants_version(self, api_key: int, api_version: int) -> bool:
        """Whether ``on_request`` sees this version of a key it asked for (resolved once per
        connection and version, like ``request_keys``)."""
        return True

    def reads_request_body(self, api_key: int, api_version: int) -> bool:
        """False for a stage whose ``on_request`` reads only the header of these requests (and
        never takes them over): a large one may then be streamed, the stage seeing its header."""
        return True

    def on_request(self, req: Request) -> bool:
        """Look at a request before it is forwarded. True: the stage took it over (answered it,
        held it, queued its entry itself); later stages do not see it and it is not forwarded."""
        return False

    def stream_filter(self, entry: InFlight) -> StreamFilter | None:
        """For a large response this stage asked for: ``WHOLE`` (the default) when it must see the
        response whole; None when it does not mind it streamed; or a filter that sees the bytes
        as they go by."""
        return WHOLE

    def on_response(self, resp: Response) -> bool:
        """Look at the response of a request this stage asked for (``Request.want_response``).
        True: the stage took it over (the pipeline sends nothing for it now)."""
        return False

    def on_done(self, entry: InFlight, upstream_ms: float) -> None:
        """The exchange is over (``upstream_ms`` -1 when the broker did not answer it)."""

    def on_close(self) -> None:
        """The connection closed (requests still in flight will not be answered)."""


StageFactory = Callable[["Connection"], Stage]
