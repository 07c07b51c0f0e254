"""The whole Pipeline, fed arbitrary client bytes and broker answers through in-memory transports.

Input: one byte choosing a proxy setup (see ``SETUPS``) and how the sockets are read (as bytes,
plain reads, or into the pipeline's buffers: the byte over the number of setups, odd for
buffered), then records ``op (1) | n (2) | n bytes``:

- op 0: the client sends the bytes (any stream: partial frames, several frames, garbage);
- op 1: the broker answers the oldest request it was sent that expects an answer: size,
  that request's correlation id, then the bytes (a response header and body);
- op 2: the broker sends the bytes as they are (framing and correlation are the input's);
- op 3: the clock moves ``n`` ms (no bytes follow): throttle mutes and holds may end;
- op 4: the client hangs up; op 5: the broker hangs up.

After every record the loop runs until nothing is ready, then the invariants are checked:

- no exception escaped a callback (the loop's exception handler fails the input) and nothing
  was logged as an unexpected error (the pipeline's catch-alls around its tasks);
- the frame decoders hold at most ``max_frame_bytes`` plus their scratch buffer, and the requests
  held while muted or before the upstream connected at most one read's worth past that;
- the connection is open on both sides, or closed on both sides and gone from the server;
- at most one ``kthrottle_rejected_frames_total`` increment per connection, each with its log
  line, and only on a closed connection.

At the end the client hangs up and the clock runs an hour on: the connection must be closed on
both sides with no task or timer left behind.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from fuzz.fakenet import FakeTransport, FuzzLoop
from protocol import messages
from protocol.frames import FrameDecoder
from protocol.mutations import TopicRef
from proxy.config import ProxyConfig, parse_config
from proxy.net.transports import ClientProtocol, PlainClientProtocol, PlainUpstreamProtocol, UpstreamProtocol
from proxy.pipeline.connection import Pipeline
from proxy.pipeline.stages import proxy_stages
from proxy.server import ProxyServer

MAX_FRAME_BYTES = 256 * 1024
SCRATCH_BYTES = 32 * 1024  # FrameDecoder's default scratch buffer
_SIZE = struct.Struct(">i")
_REC = struct.Struct(">BH")

_QUOTAS = """
quotas:
  dry_run: {dry_run}
  window: {{num: 2, size_seconds: 1}}
  users:
    <default>: {{producer_ids_rate: 1}}
  clients:
    <default>: {{producer_byte_rate: 200, consumer_byte_rate: 200, controller_mutation_rate: 1,
                request_percentage: 1}}
  topics:
    <default>: {{producer.byte.rate: 100, consumer.byte.rate: 100}}
"""

_SIDECAR = "mode: sidecar\nsidecar: {listen_port: 19092, upstream: '127.0.0.1:9092'}\n"
_GATEWAY = (
    "mode: gateway\nadvertised_host: proxy.example\n"
    "gateway: {bootstrap_port: 19092, broker_port_base: 19100, upstream_bootstrap: ['127.0.0.1:9092']}\n"
)
# Connections are opened ahead of the inputs and the fake clock jumps: none is closed for silence.
_COMMON = (
    f"admin: {{enabled: false}}\nmax_frame_bytes: {MAX_FRAME_BYTES}\nmetadata_refresh_seconds: 3600\n"
    "silent_connection_close_seconds: null\n"
)

# name, config text, whether a capture sink is attached
SETUPS: list[tuple[str, str, bool]] = [
    ("sidecar", _SIDECAR + _COMMON, False),
    ("sidecar+quotas+capture", _SIDECAR + _COMMON + _QUOTAS.format(dry_run="false"), True),
    ("gateway+quotas", _GATEWAY + _COMMON + _QUOTAS.format(dry_run="false"), False),
    ("gateway+dry-run+capture", _GATEWAY + _COMMON + _QUOTAS.format(dry_run="true"), True),
]


class FuzzFailure(AssertionError):
    """The pipeline broke an invariant (or let an exception escape) on this input."""


class _Catalog:
    """Stands in for the cluster the mutation quota asks for partition counts."""

    async def partition_counts(self, refs: list[TopicRef]) -> dict[str | bytes, int]:
        return {r.name: 3 for r in refs if r.name}

    async def default_partitions(self) -> int:
        return 1

    async def topic_ids(self) -> list[tuple[bytes, str]]:
        return [(bytes(range(16)), "fuzz-topic")]  # any other id the input names stays unknown


class _Capture:
    """A capture sink that keeps nothing (the rows are built all the same)."""

    instance = "fuzz"

    def __init__(self) -> None:
        self.rows = 0

    def record(self, row: tuple[Any, ...]) -> None:
        self.rows += 1


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class _Broker:
    """The upstream side: which forwarded requests still wait for an answer."""

    transport: FakeTransport
    decoder: FrameDecoder = field(default_factory=lambda: FrameDecoder(2**31 - 1))
    seen: int = 0
    waiting: list[int] = field(default_factory=list)  # correlation ids, oldest first

    def take_requests(self) -> None:
        data = self.transport.written[self.seen :]
        self.seen = len(self.transport.written)
        for frame in self.decoder.feed(data):
            if len(frame) < 8:
                continue
            key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
            if key == 0 and _acks_zero(frame, version):
                continue
            self.waiting.append(correlation_id)


def _acks_zero(frame: bytearray, version: int) -> bool:
    from protocol.frames import FrameError, parse_request_header
    from protocol.schema import SchemaError

    try:
        header = parse_request_header(frame)
        body = messages.decode_request(0, version, memoryview(frame)[header.size :])
    except (FrameError, SchemaError):
        return False
    return messages.produce_acks(body) == 0


STREAM_FROM = 600  # inputs are small: large-frame streaming must be fuzzed too


def in_memory_server(cfg: ProxyConfig, loop: FuzzLoop, capture: bool = False) -> ProxyServer:
    """A ProxyServer for the in-memory transports: on ``loop``'s clock, a cluster that is a stub
    (no broker answers its own queries), no listeners opened, a capture sink keeping nothing."""
    server = ProxyServer(cfg)
    server.catalog = _Catalog()  # type: ignore[assignment]
    server.topic_lookup.catalog = server.catalog
    server.brokers.on_new_node = None  # gateway mode would open real listeners
    server.enforcer.clock = loop.time
    if capture:
        server.capture = _Capture()  # type: ignore[assignment]
        server.stages = proxy_stages(server)
    return server


class PipelineFuzzer:
    """One loop and one ProxyServer per setup, reused across inputs (as a proxy is)."""

    def __init__(self) -> None:
        self.loop = FuzzLoop()
        self.errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, ctx: self.errors.append(ctx))
        self.log = _Records()
        self.brokers: list[_Broker] = []
        proxy_log = logging.getLogger("proxy")
        proxy_log.addHandler(self.log)
        if proxy_log.getEffectiveLevel() > logging.INFO:
            proxy_log.setLevel(logging.INFO)  # the rejection log lines are part of the invariant
        self.servers = [self._server(parse_config(text), capture) for _name, text, capture in SETUPS]
        # One idle connection per server that must outlive every input: bad input closes the
        # connection that sent it, never another one.
        self.bystanders = [self._connect(server) for server in self.servers]
        self.loop.settle()

    def _server(self, cfg: ProxyConfig, capture: bool) -> ProxyServer:
        return in_memory_server(cfg, self.loop, capture)

    def _connect(self, server: ProxyServer, buffered: bool = False) -> tuple[Pipeline, FakeTransport]:
        listener = next(iter(server.listeners.values()), None) or _listener(server)
        kind = ClientProtocol if buffered else PlainClientProtocol
        protocol = kind(lambda transport: Pipeline(server, listener, transport, stream_from=STREAM_FROM))
        client = FakeTransport(self.loop, protocol, ("127.0.0.1", 40000))

        async def accept() -> None:
            protocol.connection_made(client)

        self.loop.run_until_complete(accept())
        assert protocol.pipeline is not None
        return protocol.pipeline, client

    def run(self, data: bytes) -> FakeTransport | None:
        """Play one input; returns the client's transport (what the proxy wrote to the client)."""
        if not data:
            return None
        server = self.servers[data[0] % len(self.servers)]
        self.errors.clear()
        self.log.records.clear()
        rejected_before = _total(server.metrics.rejected_frames)
        buffered = (data[0] // len(self.servers)) % 2 == 1
        brokers: list[_Broker] = []
        self.brokers = brokers  # the last input's upstream side, for tests to look at

        def connected(transport: FakeTransport) -> None:
            protocol = transport.protocol
            if buffered and isinstance(protocol, PlainUpstreamProtocol):
                transport.set_protocol(UpstreamProtocol(protocol.pipeline))
            brokers.append(_Broker(transport))

        self.loop.on_connection = connected
        pipeline, client = self._connect(server, buffered)
        self._settle(server, pipeline, client, brokers, rejected_before)
        pos = 1
        while pos + _REC.size <= len(data):
            op, n = _REC.unpack_from(data, pos)
            pos += _REC.size
            op %= 6
            if op == 3:
                self.loop.advance(n / 1000.0)
            elif op == 4:
                client.hang_up()
            elif op == 5:
                if brokers:
                    brokers[0].transport.hang_up()
            else:
                chunk = data[pos : pos + n]
                pos += n
                if op == 0:
                    client.send(chunk)
                elif brokers:
                    broker = brokers[0]
                    broker.take_requests()
                    if op == 1 and broker.waiting:
                        payload = _SIZE.pack(broker.waiting.pop(0)) + chunk
                        broker.transport.send(_SIZE.pack(len(payload)) + payload)
                    else:
                        broker.transport.send(chunk)
            self._settle(server, pipeline, client, brokers, rejected_before)
        client.hang_up()
        self.loop.advance(3600.0)
        self._settle(server, pipeline, client, brokers, rejected_before)
        if not pipeline.closed or not client.lost or any(not b.transport.lost for b in brokers):
            raise FuzzFailure("the connection is not fully closed after the client hung up")
        if pipeline in server.pipelines:
            raise FuzzFailure("a closed pipeline is still registered with the server")
        if pipeline._tasks:
            raise FuzzFailure(f"{len(pipeline._tasks)} tasks left after the connection closed")
        bystander, bystander_client = self.bystanders[data[0] % len(self.servers)]
        if bystander.closed or bystander_client.closed or bystander not in server.pipelines:
            raise FuzzFailure("another connection was closed by this input")
        return client

    def _settle(
        self,
        server: ProxyServer,
        pipeline: Pipeline,
        client: FakeTransport,
        brokers: list[_Broker],
        rejected_before: float,
    ) -> None:
        self.loop.settle()
        self._check(server, pipeline, client, brokers, rejected_before)

    def _check(
        self,
        server: ProxyServer,
        pipeline: Pipeline,
        client: FakeTransport,
        brokers: list[_Broker],
        rejected_before: float,
    ) -> None:
        if self.errors:
            ctx = self.errors[0]
            raise FuzzFailure(f"exception in a loop callback: {ctx.get('message')}") from ctx.get("exception")
        for record in self.log.records:
            if record.levelno >= logging.ERROR:
                raise FuzzFailure(f"error logged: {record.getMessage()}") from (
                    record.exc_info[1] if record.exc_info else None
                )
        for name, decoder in (("request", pipeline.requests), ("response", pipeline.responses)):
            held = _decoder_bytes(decoder)
            if held > MAX_FRAME_BYTES + SCRATCH_BYTES:
                raise FuzzFailure(f"{name} decoder holds {held} bytes")
        queued = sum(len(f) for f in pipeline.held)
        if queued > MAX_FRAME_BYTES + SCRATCH_BYTES:
            raise FuzzFailure(f"{queued} request bytes queued in the proxy")
        upstream_open = [not b.transport.closed for b in brokers]
        if pipeline.closed:
            if not client.closed or any(upstream_open):
                raise FuzzFailure("half-open: the pipeline closed but a transport is still open")
            if pipeline in server.pipelines:
                raise FuzzFailure("a closed pipeline is still registered with the server")
        else:
            if client.closed or (brokers and not all(upstream_open)):
                raise FuzzFailure("half-open: a transport closed but the pipeline is still open")
        rejected = _total(server.metrics.rejected_frames) - rejected_before
        logged = sum(1 for r in self.log.records if "closed: rejected:" in r.getMessage())
        if rejected > 1:
            raise FuzzFailure(f"{rejected} rejections counted for one connection")
        if rejected != logged:
            raise FuzzFailure(f"{rejected} rejections counted, {logged} logged")
        if rejected and not pipeline.closed:
            raise FuzzFailure("a rejected connection is still open")


def _listener(server: ProxyServer) -> Any:
    from proxy.pipeline.host import Listener

    listener = Listener("fuzz", "127.0.0.1", 19092, None)
    server.listeners["fuzz"] = listener
    return listener


def _decoder_bytes(decoder: FrameDecoder) -> int:
    return decoder.allocated


def _total(counter: Any) -> float:
    return float(
        sum(s.value for metric in counter.collect() for s in metric.samples if s.name.endswith("_total"))
    )


_fuzzer: PipelineFuzzer | None = None


def shared_fuzzer() -> PipelineFuzzer:
    """One PipelineFuzzer per process: the servers and the loop are reused across inputs."""
    global _fuzzer
    if _fuzzer is None:
        _fuzzer = PipelineFuzzer()
    return _fuzzer


def pipeline_target(data: bytes) -> None:
    """The atheris entry point: one connection per input."""
    shared_fuzzer().run(data)
