"""The CPU floor of any proxy on this machine: a minimal TCP relay, no Kafka, no kthrottle.

`bench/passthrough.py` gives kthrottle's CPU seconds per GB. This says how much of that any
relay on loopback pays, so the two can be read together. The relay is a child process whose
CPU (utime + stime) is read with getrusage; the sender and receiver are threads of the parent.
Prints per-round figures, then one JSON line of medians over the rounds:

  bulk_copy_cpu_s_per_gb      2 GiB one way, recv_into/sendall of 256 KiB: every byte is
                              copied into and out of user space, as kthrottle's streamed frames are
  bulk_splice_cpu_s_per_gb    the same bytes moved with splice(2) through a pipe: no user-space
                              copy, the zero-copy lever an in-path proxy has left
  small_request_cpu_s_per_gb  request/response pairs through a selector loop, 9 KiB requests and
                              80-byte responses at 590/s: the shape of kthrottle's small_5k
                              workload (5,000 msg/s of 1 KiB, about 8.5 records per request)
  small_request_cpu_us        the same, CPU microseconds per request: six syscalls (two epoll
                              waits, two reads, two writes) and nothing else
  small_request_uvloop_cpu_us the same requests through a relay on uvloop's transports and
                              buffered protocols, as kthrottle reads and writes (the same
                              syscalls): what its event loop costs before kthrottle's own code

Usage: python bench/relay_floor.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import resource
import selectors
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

BULK_BYTES = 2 << 30
BULK_CHUNK = 256 << 10
SMALL_REQUEST = 8 * 1024 + 700
SMALL_RESPONSE = 80
SMALL_RATE = 590
SMALL_SECONDS = 10
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = 1031


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process so far, in seconds (Linux /proc): a proxy's, read around a run."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def nodelay(sock: socket.socket) -> socket.socket:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def relay_cpu(
    relay: Callable[[socket.socket, socket.socket], None],
    drive: Callable[[tuple[str, int]], None],
    target: socket.socket,
) -> float:
    """Fork a relay from a fresh listener to ``target``; run ``drive`` against it; the relay's CPU seconds."""
    front = listener()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the relay
        os.close(reader)
        upstream, _ = front.accept()
        downstream = socket.create_connection(target.getsockname())
        relay(nodelay(upstream), nodelay(downstream))
        downstream.close()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        os.write(writer, f"{usage.ru_utime + usage.ru_stime}".encode())
        os._exit(0)
    os.close(writer)
    drive(front.getsockname())
    os.waitpid(pid, 0)
    with os.fdopen(reader) as result:
        return float(result.read())


def copy_relay(upstream: socket.socket, downstream: socket.socket) -> None:
    buffer = bytearray(BULK_CHUNK)
    view = memoryview(buffer)
    while received := upstream.recv_into(buffer):
        downstream.sendall(view[:received])


def splice_relay(upstream: socket.socket, downstream: socket.socket) -> None:
    reader, writer = os.pipe()
    fcntl.fcntl(writer, F_SETPIPE_SZ, PIPE_SIZE)
    while moved := os.splice(upstream.fileno(), writer, PIPE_SIZE, flags=os.SPLICE_F_MOVE):
        while moved:
            moved -= os.splice(reader, downstream.fileno(), moved, flags=os.SPLICE_F_MOVE)


def selector_relay(upstream: socket.socket, downstream: socket.socket) -> None:
    """Each read into one buffer, reused: a fresh 256 KiB bytes per ``recv`` would be a fresh
    mapping, and the page faults of filling it cost this relay as much as the rest of its work
    on some days and nothing on others."""
    selector = selectors.DefaultSelector()
    selector.register(upstream, selectors.EVENT_READ, downstream)
    selector.register(downstream, selectors.EVENT_READ, upstream)
    buffer = bytearray(1 << 18)
    view = memoryview(buffer)
    while True:
        for key, _ in selector.select():
            received = key.fileobj.recv_into(buffer)  # type: ignore[union-attr]
            if not received:
                return
            key.data.sendall(view[:received])


def selector_relay_server(front: socket.socket, target: tuple[str, int]) -> None:
    """selector_relay's work (each read into one reused buffer, written whole to the other side)
    for every connection ``front`` accepts, each to a connection of its own to ``target``: the
    bare relay in front of a broker, for Kafka's own clients (the broker advertises the relay's
    port: dev.harness's relayed listeners). Runs until killed."""
    selector = selectors.DefaultSelector()
    selector.register(front, selectors.EVENT_READ, None)
    buffer = bytearray(1 << 18)
    view = memoryview(buffer)
    while True:
        for key, _ in selector.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            peer: socket.socket | None = key.data
            if peer is None:
                client, _ = front.accept()
                upstream = nodelay(socket.create_connection(target))
                selector.register(nodelay(client), selectors.EVENT_READ, upstream)
                selector.register(upstream, selectors.EVENT_READ, client)
                continue
            if sock.fileno() < 0:
                continue  # closed with its peer earlier in this batch of events
            try:
                received = sock.recv_into(buffer)
                if received:
                    peer.sendall(view[:received])
            except OSError:
                received = 0
            if not received:
                for side in (sock, peer):
                    selector.unregister(side)
                    side.close()


class RelayServer:
    """A bare relay in a process of its own (``python bench/relay_floor.py --serve``), from
    ``port`` to ``target``: ``selector_relay_server``, or with ``tls`` (paths: ``certfile``,
    ``keyfile`` and ``cafile`` of its listener, which asks for client certificates, and
    ``upstream_certfile``, ``upstream_keyfile`` for its own to ``target``) ``uvloop_relay_server``
    with uvloop's TLS both sides, as kthrottle's TLS listener and broker link. Its pid for its CPU."""

    def __init__(self, port: int, target: tuple[str, int], tls: dict[str, str] | None = None) -> None:
        self.port, self.target, self.tls = port, target, tls
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RelayServer:
        command = [sys.executable, __file__, "--serve", f"{self.port}:{self.target[0]}:{self.target[1]}"]
        if self.tls is not None:
            command += ["--tls-files", json.dumps(self.tls)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"listening":
            raise RuntimeError(f"the relay on port {self.port} did not start (exit {self.proc.wait(10)})")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def _tls_contexts(files: dict[str, str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    listener = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    listener.load_cert_chain(files["certfile"], files["keyfile"])
    listener.load_verify_locations(files["cafile"])
    listener.verify_mode = ssl.CERT_REQUIRED
    upstream = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    upstream.load_verify_locations(files["cafile"])
    upstream.load_cert_chain(files["upstream_certfile"], files["upstream_keyfile"])
    return listener, upstream


def _serve(spec: str, tls_files: str | None) -> None:
    port, host, target_port = spec.split(":")
    front = socket.socket()
    front.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    front.bind(("127.0.0.1", int(port)))
    front.listen(128)
    print("listening", flush=True)
    if tls_files is None:
        selector_relay_server(front, (host, int(target_port)))
    else:
        uvloop_relay_server(front, (host, int(target_port)), _tls_contexts(json.loads(tls_files)))


class _RelaySide(asyncio.BufferedProtocol):
    """One side of a relayed connection on uvloop: each read into the side's buffer, copied out
    and written whole to the peer's transport; a side lost closes its peer and calls ``lost``."""

    def __init__(self, lost: Callable[[], None] | None = None) -> None:
        self.buffer = bytearray(1 << 18)
        self.view = memoryview(self.buffer)
        self.lost = lost
        self.made: Callable[[], None] | None = None
        self.transport: asyncio.Transport | None = None
        self.peer: _RelaySide | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.made is not None:
            self.made()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        assert self.peer is not None and self.peer.transport is not None
        self.peer.transport.write(self.buffer[:nbytes])

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        if self.lost is not None:
            self.lost()


def uvloop_relay(
    upstream: socket.socket,
    downstream: socket.socket,
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
) -> None:
    """The selector relay's work on uvloop's transports and buffered protocols, as kthrottle
    reads and writes: each read into a buffer of the protocol's, copied out and written to the
    other side. What the event loop costs before any of kthrottle's own code runs. With ``tls``
    (a server context for the upstream side, a client one for the downstream, both for
    127.0.0.1), uvloop's TLS on both sides, as kthrottle's TLS listener and broker link."""
    import uvloop

    async def relay() -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def lost() -> None:
            if not done.done():
                done.set_result(None)

        front, back = _RelaySide(lost), _RelaySide(lost)
        front.peer, back.peer = back, front
        if tls is None:
            await loop.connect_accepted_socket(lambda: back, downstream)
            await loop.connect_accepted_socket(lambda: front, upstream)
        else:
            await loop.create_connection(
                lambda: back, sock=downstream, ssl=tls[1], server_hostname="127.0.0.1"
            )
            await loop.connect_accepted_socket(lambda: front, upstream, ssl=tls[0])
        await done

    uvloop.run(relay())


def uvloop_relay_server(
    front: socket.socket, target: tuple[str, int], tls: tuple[ssl.SSLContext, ssl.SSLContext] | None
) -> None:
    """uvloop_relay's work for every connection ``front`` accepts, each to a connection of its
    own to ``target`` (with ``tls``: uvloop's TLS both sides, a server context for the clients and
    a client one for ``target``), as a bare relay in front of a broker for Kafka's own clients.
    A client is not read from until its connection to ``target`` is up. Runs until killed."""
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        connecting: set[asyncio.Task[None]] = set()

        def accepted() -> _RelaySide:
            client, upstream = _RelaySide(), _RelaySide()
            client.peer, upstream.peer = upstream, client

            async def connect() -> None:
                assert client.transport is not None
                try:
                    await loop.create_connection(
                        lambda: upstream,
                        *target,
                        ssl=tls[1] if tls else None,
                        server_hostname=target[0] if tls else None,
                    )
                except OSError:
                    client.transport.close()
                    return
                client.transport.resume_reading()

            def made() -> None:
                assert client.transport is not None
                client.transport.pause_reading()
                task = loop.create_task(connect())
                connecting.add(task)
                task.add_done_callback(connecting.discard)

            client.made = made
            return client

        server = await loop.create_server(accepted, sock=front, ssl=tls[0] if tls else None)
        await server.serve_forever()

    uvloop.run(serve())


def bulk(relay: Callable[[socket.socket, socket.socket], None]) -> float:
    """CPU seconds per GB of the relay moving BULK_BYTES one way."""
    sink = listener()

    def receive() -> None:
        conn, _ = sink.accept()
        buffer = bytearray(1 << 20)
        while conn.recv_into(buffer):
            pass

    def send(address: tuple[str, int]) -> None:
        sock = socket.create_connection(address)
        chunk = b"x" * (1 << 20)
        for _ in range(BULK_BYTES // len(chunk)):
            sock.sendall(chunk)
        sock.close()

    receiver = threading.Thread(target=receive)
    receiver.start()
    cpu = relay_cpu(relay, send, sink)
    receiver.join()
    return cpu / (BULK_BYTES / 1e9)


def small(relay: Callable[[socket.socket, socket.socket], None] | None = None) -> float:
    """CPU seconds of ``relay`` (the selector relay by default) for SMALL_RATE * SMALL_SECONDS
    request/response pairs."""
    server_socket = listener()

    def serve() -> None:
        conn, _ = server_socket.accept()
        nodelay(conn)
        pending = 0
        while data := conn.recv(1 << 16):
            pending += len(data)
            while pending >= SMALL_REQUEST:
                pending -= SMALL_REQUEST
                conn.sendall(b"r" * SMALL_RESPONSE)

    def client(address: tuple[str, int]) -> None:
        sock = nodelay(socket.create_connection(address))
        request = b"q" * SMALL_REQUEST
        start = time.perf_counter()
        for n in range(SMALL_RATE * SMALL_SECONDS):
            sock.sendall(request)
            got = 0
            while got < SMALL_RESPONSE:
                got += len(sock.recv(SMALL_RESPONSE - got))
            pause = start + (n + 1) / SMALL_RATE - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        sock.close()

    server = threading.Thread(target=serve)
    server.start()
    cpu = relay_cpu(relay or selector_relay, client, server_socket)
    server.join()
    return cpu


def small_cpu_s_per_gb() -> float:
    """``small`` as CPU seconds per GB of request bytes (kthrottle's small_5k is per GB of records)."""
    return small() / (SMALL_RATE * SMALL_SECONDS * SMALL_REQUEST / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--serve", metavar="PORT:HOST:TARGET_PORT", help="only relay PORT to HOST:TARGET_PORT until killed"
    )
    parser.add_argument("--tls-files", help="with --serve: TLS both sides, RelayServer's paths as JSON")
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve, args.tls_files)
        return
    copies, splices, smalls, uvloop_smalls = [], [], [], []
    requests = SMALL_RATE * SMALL_SECONDS
    for rnd in range(args.rounds):
        copies.append(bulk(copy_relay))
        splices.append(bulk(splice_relay))
        smalls.append(small())
        uvloop_smalls.append(small(uvloop_relay))
        print(
            f"round {rnd}: copy {copies[-1]:.3f} s/GB, splice {splices[-1]:.3f} s/GB, "
            f"small requests {smalls[-1] / requests * 1e6:.1f} us each "
            f"(on uvloop {uvloop_smalls[-1] / requests * 1e6:.1f} us)",
            flush=True,
        )
    small_cpu, uvloop_cpu = statistics.median(smalls), statistics.median(uvloop_smalls)
    figures = {
        "bulk_copy_cpu_s_per_gb": round(statistics.median(copies), 3),
        "bulk_splice_cpu_s_per_gb": round(statistics.median(splices), 3),
        "small_request_cpu_s_per_gb": round(small_cpu / (requests * SMALL_REQUEST / 1e9), 2),
        "small_request_cpu_us": round(small_cpu / requests * 1e6, 1),
        "small_request_uvloop_cpu_us": round(uvloop_cpu / requests * 1e6, 1),
        "rounds": args.rounds,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
