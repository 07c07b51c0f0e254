"""What one small request costs kthrottle, against bare relays, with no Kafka and no Java around.

`bench/passthrough.py`'s small_5k reads the proxy's CPU per request beside a Java producer and a
Java broker on the same two cores, whose load moves the figure by a factor of two from round to
round. Here the same shape of traffic goes through each contender, in one run: a client thread
sends real Produce v13 requests (about 9 KiB: six partitions' batches, as the Java producer's
small_5k requests) at a steady rate, one in flight, and a responder thread answers each with a
real Produce v13 response carrying its correlation id. The contenders:

  selector   the selector relay of bench/relay_floor.py (the floor of small_request_cpu_to_floor)
  uvloop     relay_floor's relay on uvloop's transports and buffered protocols, as kthrottle reads
             and writes: the event loop's cost before any of kthrottle's code
  kthrottle  `kthrottle run` in sidecar mode, no quotas (as passthrough.py runs it), this checkout
  baseline   the same from another checkout (``--baseline DIR``), side by side

Each one runs at the same time as kthrottle, both driven at the rate by a thread of their own
(one pair after another, each round): run apart, a run's CPU moves by a fifth from one window to
the next on this machine; run together, the pair sees the same machine. CPU is utime + stime of
each one's own process. Prints per-round figures, then one JSON line of medians:

  <contender>_us_per_request       CPU microseconds per request/response pair (two requests at a
                                   time on two cores: higher than one alone)
  kthrottle_to_selector_relay      kthrottle over the selector relay, window by window
  kthrottle_to_uvloop_relay        kthrottle over the uvloop relay (its own work, and its loop's)
  kthrottle_to_baseline            with --baseline

With ``--workload fetch`` the same contenders carry bulk fetches instead: real Fetch v17
requests for six partitions, each answered by a real Fetch v17 response of 1 MiB a partition
(16 KiB record batches, as a bulk consumer's), as fast as they go, one in flight: the shape of
passthrough.py's bulk_fetch without the Java consumer and broker beside it. Its figures are named
``fetch_<contender>_s_per_gb`` (CPU seconds per GB of responses) and ``fetch_kthrottle_to_<...>``.

With ``--tls`` the proxy's client listener and its broker link are TLS (the responder and the
client threads speak TLS too), and the uvloop relay runs with uvloop's TLS on both sides (the
selector relay does not run): what TLS on this event loop costs before any of kthrottle's code,
and, with ``--baseline``, a change to the TLS path measured by the proxy's own CPU, with no Java
beside it to move the figure. Its figures are prefixed ``tls_``.

Usage: source dev/setup.sh && python bench/request_cost.py [--workload fetch] [--tls] [--rounds 5]
       [--baseline ../old] [--baseline-python OTHER_VENV/bin/python]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay_floor

from dev.certs import CertFiles, CertificateAuthority
from dev.harness import free_port
from dev.loadgen import record_batch
from dev.proxy_process import REPO, ProxyProcess
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.frames import RequestHeader, encode_request_header, encode_response_header

VERSION = 13  # the Java 4.1 producer's Produce version
FETCH_VERSION = 17  # the Java 4.1 consumer's Fetch version
PARTITIONS = 6
RECORD_BYTES = 1400  # six batches of about this: the ~9 KiB of a small_5k request
RATE = 590  # requests/s: small_5k's 5,000 msg/s at 8.5 records a request
FETCH_BATCH_BYTES = 16384  # a bulk producer's batch, as the consumer reads it back
FETCH_PARTITION_BYTES = 1 << 20  # the consumer's max.partition.fetch.bytes, filled
TOPIC_ID = uuid.UUID(int=0x6B746872).bytes
TOPIC = "bench"
METADATA = ApiKey.METADATA


def produce_frames() -> tuple[bytes, bytes]:
    """(request, response): whole frames, size prefix included, correlation id 0 in both."""
    batch = record_batch(bytes(RECORD_BYTES), timestamp_ms=1_700_000_000_000)
    request = {
        "transactional_id": None,
        "acks": 1,
        "timeout_ms": 30000,
        "topic_data": [
            {
                "topic_id": TOPIC_ID,
                "partition_data": [{"index": i, "records": batch} for i in range(PARTITIONS)],
            }
        ],
    }
    answer = {
        "index": 0,
        "error_code": 0,
        "base_offset": 1,
        "log_append_time_ms": -1,
        "log_start_offset": 0,
        "record_errors": [],
        "error_message": None,
    }
    response = {
        "responses": [
            {
                "topic_id": TOPIC_ID,
                "partition_responses": [{**answer, "index": i} for i in range(PARTITIONS)],
            }
        ],
        "throttle_time_ms": 0,
    }
    req = encode_request_header(RequestHeader(0, VERSION, 0, "perf-producer-1", 0))
    req += messages.encode(0, VERSION, request, response=False)
    resp = encode_response_header(0, VERSION, 0) + messages.encode(0, VERSION, response, response=True)
    return struct.pack(">i", len(req)) + req, struct.pack(">i", len(resp)) + resp


def fetch_frames() -> tuple[bytes, bytes]:
    """(request, response) of a bulk fetch: whole frames, size prefix included, correlation id 0
    (the fields not given take their schema defaults)."""
    wanted = [{"partition": i, "partition_max_bytes": FETCH_PARTITION_BYTES} for i in range(PARTITIONS)]
    request = {
        "max_wait_ms": 500,
        "min_bytes": 1,
        "max_bytes": 52428800,
        "topics": [{"topic_id": TOPIC_ID, "partitions": wanted}],
    }
    batch = record_batch(bytes(FETCH_BATCH_BYTES - 70), timestamp_ms=1_700_000_000_000)
    records = batch * (FETCH_PARTITION_BYTES // len(batch))
    answers = [
        {"partition_index": i, "high_watermark": 1 << 30, "last_stable_offset": 1 << 30, "records": records}
        for i in range(PARTITIONS)
    ]
    response = {"responses": [{"topic_id": TOPIC_ID, "partitions": answers}]}
    req = encode_request_header(RequestHeader(1, FETCH_VERSION, 0, "perf-consumer-1", 0))
    req += messages.encode(1, FETCH_VERSION, request, response=False)
    resp = encode_response_header(1, FETCH_VERSION, 0)
    resp += messages.encode(1, FETCH_VERSION, response, response=True)
    return struct.pack(">i", len(req)) + req, struct.pack(">i", len(resp)) + resp


class Tls:
    """Certificates for --tls: the responder's (the broker's) and the proxy's listener's, both
    for 127.0.0.1, and the client contexts that trust them."""

    def __init__(self) -> None:
        ca = CertificateAuthority(Path(tempfile.mkdtemp(prefix="kthrottle-request-cost-")))
        self.ca = ca.cert_path
        self.broker = ca.issue("broker", "broker", ips=("127.0.0.1",))
        self.proxy = ca.issue("proxy", "proxy", ips=("127.0.0.1",))

    @staticmethod
    def _serving(files: CertFiles) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(files.cert, files.key)
        return context

    def server(self) -> ssl.SSLContext:
        """The responder's side, as a broker's."""
        return self._serving(self.broker)

    def listener(self) -> ssl.SSLContext:
        """The proxy's side toward its clients, for the TLS relay."""
        return self._serving(self.proxy)

    def client(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(self.ca)
        return context

    def proxy_config(self) -> dict[str, object]:
        return {
            "tls": {"enabled": True, "certfile": str(self.proxy.cert), "keyfile": str(self.proxy.key)},
            "upstream_tls": {"enabled": True, "cafile": str(self.ca)},
        }


def metadata_answer(version: int, correlation: bytes, address: tuple[str, int]) -> bytes:
    """A Metadata response naming the topic of the bench's requests, from the one broker at
    ``address``: what a broker tells kthrottle's topic id lookup (the requests name the topic by
    id), so that the proxy learns it once, as it does beside a real broker."""
    partitions = [
        {"partition_index": i, "leader_id": 0, "replica_nodes": [0], "isr_nodes": [0]}
        for i in range(PARTITIONS)
    ]
    body = {
        "brokers": [{"node_id": 0, "host": address[0], "port": address[1]}],
        "cluster_id": "bench",
        "controller_id": 0,
        "topics": [{"name": TOPIC, "topic_id": TOPIC_ID, "partitions": partitions}],
    }
    frame = encode_response_header(METADATA, version, int.from_bytes(correlation, "big", signed=True))
    frame += messages.encode(METADATA, version, body, response=True)
    return struct.pack(">i", len(frame)) + frame


class Responder:
    """The broker's part: answers every request frame on every connection with ``response``, its
    correlation id copied (over TLS when given a server context)."""

    def __init__(self, response: bytes, tls: ssl.SSLContext | None = None) -> None:
        self.response = response
        self.tls = tls
        self.socket = relay_floor.listener()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return self.socket.getsockname()  # type: ignore[no-any-return]

    def _accept(self) -> None:
        while True:
            conn, _ = self.socket.accept()
            threading.Thread(target=self._serve, args=(relay_floor.nodelay(conn),), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        # A proxy stopping resets its upstream mid-answer; a client missing an answer says so.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError, ssl.SSLError):
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = bytearray()
        answer = bytearray(self.response)
        while data := conn.recv(1 << 16):
            buffer += data
            while len(buffer) >= 4:
                size = int.from_bytes(buffer[:4], "big")
                if len(buffer) < 4 + size:
                    break
                if int.from_bytes(buffer[4:6], "big") == METADATA:
                    # the proxy's own lookup of the topic id the requests name
                    conn.sendall(
                        metadata_answer(int.from_bytes(buffer[6:8], "big"), bytes(buffer[8:12]), self.address)
                    )
                else:
                    answer[4:8] = buffer[8:12]  # the request's correlation id
                    conn.sendall(answer)
                del buffer[: 4 + size]


def drive(
    address: tuple[str, int],
    frames: tuple[bytes, bytes],
    requests: int,
    rate: float,
    in_flight: int = 1,
    tls: ssl.SSLContext | None = None,
) -> None:
    """``requests`` round trips of ``frames`` (request, response) at ``rate`` a second (or as fast
    as they go), correlation ids counted. ``in_flight`` requests go out in one write and their
    answers are read before the next ones: a pipelining client's shape (several frames in one
    read of the proxy's). Over TLS when given a client context."""
    sock = relay_floor.nodelay(socket.create_connection(address))
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname=address[0])
    step = len(frames[0])
    burst = bytearray(frames[0] * in_flight)
    size = len(frames[1])
    into = memoryview(bytearray(size * in_flight))
    start = time.perf_counter()
    for n in range(0, requests, in_flight):
        count = min(in_flight, requests - n)
        for i in range(count):
            burst[i * step + 8 : i * step + 12] = struct.pack(">i", n + i)
        sock.sendall(memoryview(burst)[: count * step])
        got = 0
        while got < size * count:
            received = sock.recv_into(into[got:])
            if not received:
                raise ConnectionError(f"connection closed after {n + got // size} responses")
            got += received
        if not rate:
            continue
        pause = start + (n + count) / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    sock.close()


def relay_cost(
    relay: Callable[[socket.socket, socket.socket], None],
    responder: Responder,
    frames: tuple[bytes, bytes],
    requests: int,
    rate: float,
    tls: ssl.SSLContext | None = None,
) -> float:
    run = functools.partial(drive, frames=frames, requests=requests, rate=rate, tls=tls)
    return float(relay_floor.relay_cpu(relay, run, responder.socket))


def proxy_cost(
    proxy: ProxyProcess,
    port: int,
    frames: tuple[bytes, bytes],
    requests: int,
    rate: float,
    tls: ssl.SSLContext | None = None,
) -> float:
    assert proxy.proc is not None
    pid = proxy.proc.pid
    before = sum(relay_floor.cpu_times(pid))
    drive(("127.0.0.1", port), frames, requests, rate, tls=tls)
    return float(sum(relay_floor.cpu_times(pid)) - before)


def sidecar(
    upstream: tuple[str, int], source: Path | None, python: str = sys.executable, tls: Tls | None = None
) -> tuple[ProxyProcess, int]:
    port = free_port()
    config = {
        "mode": "sidecar",
        "sidecar": {"listen_port": port, "upstream": f"{upstream[0]}:{upstream[1]}"},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "log_level": "WARNING",
        **(tls.proxy_config() if tls is not None else {}),
    }
    proxy = ProxyProcess(config, source=source or REPO, python=python)
    return proxy, port


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=("produce", "fetch"), default="produce")
    parser.add_argument("--tls", action="store_true", help="TLS both sides (proxy, uvloop relay)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, help="per contender per round (produce 5,900, fetch 300)")
    parser.add_argument("--rate", type=float, help="requests per second; 0: as fast as they go (fetch's)")
    parser.add_argument("--baseline", type=Path, help="another checkout's source tree, run side by side")
    parser.add_argument(
        "--baseline-python",
        help="the interpreter the baseline runs on (a virtualenv's python): this checkout on another "
        "interpreter when --baseline is not given",
    )
    args = parser.parse_args()
    fetch = args.workload == "fetch"
    frames = fetch_frames() if fetch else produce_frames()
    requests = args.requests or (300 if fetch else RATE * 10)
    rate = args.rate if args.rate is not None else (0 if fetch else RATE)
    print(f"request {len(frames[0])} bytes, response {len(frames[1])} bytes, {requests} per run", flush=True)
    tls = Tls() if args.tls else None
    client_tls = tls.client() if tls is not None else None
    responder = Responder(frames[1], tls.server() if tls is not None else None)
    proxies = {"kthrottle": sidecar(responder.address, None, tls=tls)}
    if args.baseline or args.baseline_python:
        source = args.baseline.resolve() if args.baseline else None
        python = args.baseline_python or sys.executable
        proxies["baseline"] = sidecar(responder.address, source, python, tls=tls)
    for proxy, port in proxies.values():
        proxy.start()
        # its first connection's one-time work
        drive(("127.0.0.1", port), frames, 30 if fetch else 300, 0, tls=client_tls)
    relay = functools.partial(
        relay_cost, responder=responder, frames=frames, requests=requests, rate=rate, tls=client_tls
    )
    others: dict[str, Callable[[], float]] = {}
    if tls is None:
        others["selector"] = functools.partial(relay, relay_floor.selector_relay)
        others["uvloop"] = functools.partial(relay, relay_floor.uvloop_relay)
    else:
        tls_relay = functools.partial(relay_floor.uvloop_relay, tls=(tls.listener(), tls.client()))
        others["uvloop"] = functools.partial(relay, tls_relay)
    cost = functools.partial(proxy_cost, frames=frames, requests=requests, rate=rate, tls=client_tls)
    ours = functools.partial(cost, *proxies["kthrottle"])
    if "baseline" in proxies:
        others["baseline"] = functools.partial(cost, *proxies["baseline"])
    # CPU per request (produce) or per GB of responses (fetch)
    unit, per = ("s_per_gb", requests * len(frames[1]) / 1e9) if fetch else ("us_per_request", requests / 1e6)
    costs: dict[str, list[float]] = {name: [] for name in ["kthrottle", *others]}
    ratios: dict[str, list[float]] = {name: [] for name in others}
    try:
        for rnd in range(args.rounds):
            for name, other in others.items():
                mine, theirs = together(ours, other)
                costs["kthrottle"].append(mine / per)
                costs[name].append(theirs / per)
                ratios[name].append(mine / theirs)
            done = ", ".join(
                f"{name} {costs[name][-1]:.2f} (kthrottle {ratios[name][-1]:.2f}x)" for name in others
            )
            print(f"round {rnd}: {unit.replace('_', ' ')}: {done}", flush=True)
    finally:
        for proxy, _ in proxies.values():
            proxy.stop()
    med = statistics.median
    prefix = ("tls_" if tls is not None else "") + ("fetch_" if fetch else "")
    figures = {f"{prefix}{name}_{unit}": round(med(v), 3 if fetch else 1) for name, v in costs.items()}
    for relay_name in ("selector", "uvloop"):
        if relay_name in ratios:
            figures[f"{prefix}kthrottle_to_{relay_name}_relay"] = round(med(ratios[relay_name]), 2)
    if "baseline" in ratios:
        figures[f"{prefix}kthrottle_to_baseline"] = round(med(ratios["baseline"]), 3)
    print(json.dumps(figures))


def together(first: Callable[[], float], second: Callable[[], float]) -> tuple[float, float]:
    """Both runs at once, each in a thread of its own: the CPU seconds of each."""
    out: list[float] = [0.0, 0.0]

    def run(i: int, work: Callable[[], float]) -> None:
        out[i] = work()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out[0], out[1]


if __name__ == "__main__":
    main()
