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

Usage: source dev/setup.sh && python bench/request_cost.py [--rounds 5] [--baseline ../old]
"""

from __future__ import annotations

import argparse
import functools
import json
import socket
import statistics
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import relay_floor

from dev.harness import free_port
from dev.loadgen import record_batch
from dev.proxy_process import ProxyProcess
from protocol import messages
from protocol.frames import RequestHeader, encode_request_header, encode_response_header

VERSION = 13  # the Java 4.1 producer's Produce version
PARTITIONS = 6
RECORD_BYTES = 1400  # six batches of about this: the ~9 KiB of a small_5k request
RATE = 590  # requests/s: small_5k's 5,000 msg/s at 8.5 records a request
TOPIC_ID = uuid.UUID(int=0x6B746872).bytes


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


REQUEST, RESPONSE = produce_frames()


class Responder:
    """The broker's part: answers every Produce frame on every connection, its correlation id copied."""

    def __init__(self) -> None:
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
        buffer = bytearray()
        answer = bytearray(RESPONSE)
        while data := conn.recv(1 << 16):
            buffer += data
            while len(buffer) >= 4:
                size = int.from_bytes(buffer[:4], "big")
                if len(buffer) < 4 + size:
                    break
                answer[4:8] = buffer[8:12]  # the request's correlation id
                del buffer[: 4 + size]
                conn.sendall(answer)


def drive(address: tuple[str, int], requests: int, rate: float) -> None:
    """``requests`` Produce round trips at ``rate`` a second, one in flight, correlation ids counted."""
    sock = relay_floor.nodelay(socket.create_connection(address))
    frame = bytearray(REQUEST)
    start = time.perf_counter()
    for n in range(requests):
        frame[8:12] = struct.pack(">i", n)
        sock.sendall(frame)
        got = 0
        while got < len(RESPONSE):
            chunk = sock.recv(len(RESPONSE) - got)
            if not chunk:
                raise ConnectionError(f"connection closed after {n} responses")
            got += len(chunk)
        pause = start + (n + 1) / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    sock.close()


def relay_cost(
    relay: Callable[[socket.socket, socket.socket], None], responder: Responder, requests: int, rate: float
) -> float:
    return relay_floor.relay_cpu(relay, lambda address: drive(address, requests, rate), responder.socket)


def proxy_cost(proxy: ProxyProcess, port: int, requests: int, rate: float) -> float:
    assert proxy.proc is not None
    pid = proxy.proc.pid
    before = sum(relay_floor.cpu_times(pid))
    drive(("127.0.0.1", port), requests, rate)
    return sum(relay_floor.cpu_times(pid)) - before


def sidecar(upstream: tuple[str, int], source: Path | None) -> tuple[ProxyProcess, int]:
    port = free_port()
    config = {
        "mode": "sidecar",
        "sidecar": {"listen_port": port, "upstream": f"{upstream[0]}:{upstream[1]}"},
        "admin": {"host": "127.0.0.1", "port": free_port()},
        "log_level": "WARNING",
    }
    proxy = ProxyProcess(config, source=source) if source else ProxyProcess(config)
    return proxy, port


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=RATE * 10, help="requests per contender per round")
    parser.add_argument("--rate", type=float, default=RATE, help="requests per second")
    parser.add_argument("--baseline", type=Path, help="another checkout's source tree, run side by side")
    args = parser.parse_args()
    print(
        f"request {len(REQUEST)} bytes, response {len(RESPONSE)} bytes, {args.requests} per run", flush=True
    )
    responder = Responder()
    proxies = {"kthrottle": sidecar(responder.address, None)}
    if args.baseline:
        proxies["baseline"] = sidecar(responder.address, args.baseline.resolve())
    for proxy, port in proxies.values():
        proxy.start()
        drive(("127.0.0.1", port), 300, args.rate * 10)  # its first connection's one-time work
    others: dict[str, Callable[[], float]] = {
        "selector": functools.partial(
            relay_cost, relay_floor.selector_relay, responder, args.requests, args.rate
        ),
        "uvloop": functools.partial(
            relay_cost, relay_floor.uvloop_relay, responder, args.requests, args.rate
        ),
    }
    proxy, port = proxies["kthrottle"]
    ours = functools.partial(proxy_cost, proxy, port, args.requests, args.rate)
    if "baseline" in proxies:
        others["baseline"] = functools.partial(proxy_cost, *proxies["baseline"], args.requests, args.rate)
    costs: dict[str, list[float]] = {name: [] for name in ["kthrottle", *others]}
    ratios: dict[str, list[float]] = {name: [] for name in others}
    try:
        for rnd in range(args.rounds):
            for name, other in others.items():
                mine, theirs = together(ours, other)
                costs["kthrottle"].append(mine / args.requests * 1e6)
                costs[name].append(theirs / args.requests * 1e6)
                ratios[name].append(mine / theirs)
            done = ", ".join(
                f"{name} {costs[name][-1]:.1f} (kthrottle {ratios[name][-1]:.2f}x)" for name in others
            )
            print(f"round {rnd}: us per request: {done}", flush=True)
    finally:
        for proxy, _ in proxies.values():
            proxy.stop()
    med = statistics.median
    figures: dict[str, float] = {f"{name}_us_per_request": round(med(v), 1) for name, v in costs.items()}
    figures["kthrottle_to_selector_relay"] = round(med(ratios["selector"]), 2)
    figures["kthrottle_to_uvloop_relay"] = round(med(ratios["uvloop"]), 2)
    if "baseline" in ratios:
        figures["kthrottle_to_baseline"] = round(med(ratios["baseline"]), 3)
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
