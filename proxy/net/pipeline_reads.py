"""The compiled half of the two socket protocols: the calls the event loop makes on every read.

uvloop keeps a protocol's bound ``data_received``, or a buffered one's ``get_buffer`` and
``buffer_updated``, and calls them on each read; defined here, in a compiled class, they cost a
C call each instead of an interpreted frame (3% of the proxy's CPU per small request). The
protocols in ``transports.py`` subclass these in Python, beside ``asyncio.Protocol`` (read as
bytes) or ``asyncio.BufferedProtocol`` (read into the decoder's buffers): the event loops choose
by that base class which of the two ways they read, and a compiled class cannot subclass a
Python class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from proxy.pipeline.connection import Pipeline


@mypyc_attr(allow_interpreted_subclasses=True)  # the protocols of transports.py, and their subclasses
class ClientReads:
    """A client connection's reads go straight into its pipeline's request decoder. ``pipeline``
    is set once the transport is made (``connection_made``, in the subclass)."""

    def __init__(self) -> None:
        self.pipeline: Pipeline | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        pipeline = self.pipeline
        assert pipeline is not None
        return pipeline.requests.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        pipeline = self.pipeline
        assert pipeline is not None
        pipeline.client_written(nbytes)

    def data_received(self, data: bytes) -> None:
        pipeline = self.pipeline
        assert pipeline is not None
        pipeline.client_data(data)

    def eof_received(self) -> bool | None:
        return None  # close our side too; the upstream is closed in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pipeline is not None:
            self.pipeline.client_lost(exc)

    def pause_writing(self) -> None:
        if self.pipeline is not None:
            self.pipeline.pause_upstream("client-backpressure")

    def resume_writing(self) -> None:
        if self.pipeline is not None:
            self.pipeline.resume_upstream("client-backpressure")


@mypyc_attr(allow_interpreted_subclasses=True)  # transports.UpstreamProtocol
class UpstreamReads:
    """The pipeline's broker connection: its reads go straight into the response decoder."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pipeline.responses.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.pipeline.upstream_written(nbytes)

    def data_received(self, data: bytes) -> None:
        self.pipeline.upstream_data(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipeline.upstream_lost(exc)

    def pause_writing(self) -> None:
        self.pipeline.pause_client("upstream-backpressure")

    def resume_writing(self) -> None:
        self.pipeline.resume_client("upstream-backpressure")
