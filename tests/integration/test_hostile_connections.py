"""Hostile connection patterns against the real broker (issue 8): a slowloris, 5,000 idle
connections, and a reconnect storm. Each time a real client produces and consumes through the
same proxy meanwhile, and the proxy gives back every connection and descriptor afterwards.
(The hostile sockets are raw: no client library trickles bytes or opens thousands of sockets.)"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from dev.harness import KafkaCluster
from dev.proc import open_fds, own_tcp_connections_to, rss_bytes
from dev.proxy_process import ProxyProcess, gateway_config
from tests.integration.clients import assert_same_messages, kafka_python_roundtrip, messages
from tests.tools import unavailable

pytestmark = pytest.mark.integration

KiB, MiB = 1024, 1024 * 1024


def _api_versions_request(correlation_id: int) -> bytes:
    payload = struct.pack(">hhih", 18, 0, correlation_id, 4) + b"evil"
    return struct.pack(">i", len(payload)) + payload


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``, or None if it was closed first (a short read is not an answer)."""
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            return None
        got += chunk
    return got


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {timeout:.0f} s")
        time.sleep(0.25)


def _bystander(proxy: ProxyProcess, tag: str) -> None:
    sent = messages(300, tag)
    assert_same_messages(sent, kafka_python_roundtrip(proxy.bootstrap, f"{tag}-{uuid.uuid4().hex[:6]}", sent))


def proxy_ports(proxy: ProxyProcess) -> set[int]:
    """The proxy's client-facing ports (bootstrap and one per broker)."""
    gateway = proxy.config["gateway"]
    return {gateway["bootstrap_port"], *gateway["broker_ports"].values()}


def _active(proxy: ProxyProcess) -> float:
    return proxy.metric("kthrottle_connections_active")


@pytest.mark.timeout(180)
def test_slowloris_is_closed_and_others_go_on(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """Twenty sockets trickle a request a byte a second, twenty more send a size prefix
    claiming 100 MiB and a header, and stall: the stalled ones cost the proxy what they sent,
    not what they claimed (2 GB), and with client_frame_timeout_seconds 3 the proxy closes all
    forty, counts and logs each, while a real client produces and consumes through the same
    port."""
    cfg = gateway_config(kafka_broker, client_frame_timeout_seconds=3)
    with ProxyProcess(cfg, workdir=tmp_path) as proxy:
        assert proxy.proc is not None
        host, port = proxy.bootstrap.split(":")
        frame = _api_versions_request(1)
        rss_before = rss_bytes(proxy.proc.pid)
        trickling = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
        stalled = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
        for sock in stalled:
            sock.sendall(struct.pack(">i", 100 * MiB) + frame[4:])
        time.sleep(0.5)
        claimed = rss_bytes(proxy.proc.pid) - rss_before
        print(f"20 frames claiming 100 MiB each: proxy RSS grew {claimed / MiB:.1f} MiB")
        assert claimed < 64 * MiB
        closed_by_proxy: set[int] = set()
        stop = threading.Event()

        def trickle() -> None:
            for byte in frame:
                for i, sock in enumerate(trickling):
                    if i in closed_by_proxy:
                        continue
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        closed_by_proxy.add(i)
                if stop.wait(1.0):
                    return

        worker = threading.Thread(target=trickle, daemon=True)
        worker.start()
        try:
            _bystander(proxy, "beside-slowloris")
            for sock in stalled + trickling:
                sock.settimeout(30)
                # A reset (our unread bytes were in its buffer) is a close all the same.
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(100) == b"", "a slowloris got an answer"
        finally:
            stop.set()
            worker.join(10)
            for sock in stalled + trickling:
                sock.close()
        assert proxy.metric("kthrottle_rejected_frames_total", {"reason": "frame-timeout"}) == 40
        assert proxy.log_text().count("client_frame_timeout_seconds") >= 40
        _wait_for("all connections closed", lambda: _active(proxy) == 0)


@pytest.mark.timeout(240)
def test_five_thousand_idle_connections(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """5,000 connections held open at once (every tenth has done an ApiVersions exchange, the
    rest never said a word): all accepted, under 50 KiB of proxy memory each (the issue's
    target), a real client unaffected; closed, the proxy gives every descriptor back."""
    count = 5000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 1000:
        unavailable(f"open-files hard limit {hard} is below {count + 1000}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the proxy inherits it
    try:
        with ProxyProcess(gateway_config(kafka_broker), workdir=tmp_path) as proxy:
            assert proxy.proc is not None
            pid = proxy.proc.pid
            host, port = proxy.bootstrap.split(":")
            fds_before, rss_before = open_fds(pid), rss_bytes(pid)
            accepted_before = proxy.metric("kthrottle_connections_total")

            async def hold() -> tuple[list[asyncio.StreamWriter], int]:
                gate = asyncio.Semaphore(400)
                writers: list[asyncio.StreamWriter] = []
                failures = 0

                async def one(i: int) -> None:
                    nonlocal failures
                    async with gate:
                        try:
                            reader, writer = await asyncio.wait_for(
                                asyncio.open_connection(host, int(port)), 60
                            )
                            writers.append(writer)
                            if i % 10 == 0:
                                writer.write(_api_versions_request(i))
                                size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 60))[
                                    0
                                ]
                                await reader.readexactly(size)
                        except (OSError, TimeoutError, asyncio.IncompleteReadError):
                            failures += 1

                await asyncio.gather(*(one(i) for i in range(count)))
                return writers, failures

            loop = asyncio.new_event_loop()
            try:
                writers, failures = loop.run_until_complete(hold())
                assert failures == 0, f"{failures} of {count} connections failed"
                _wait_for(f"{count} connections active", lambda: _active(proxy) == count)
                assert proxy.metric("kthrottle_connections_total") - accepted_before == count
                time.sleep(2)  # the upstream connections settle
                per_connection = (rss_bytes(pid) - rss_before) / count
                print(f"{count} idle connections: {per_connection / KiB:.1f} KiB each")
                assert per_connection < 50 * KiB
                _bystander(proxy, "beside-5000")
                for writer in writers:
                    writer.close()
                loop.run_until_complete(asyncio.sleep(0.5))
            finally:
                loop.close()
            _wait_for("all connections closed", lambda: _active(proxy) == 0)
            _wait_for("descriptors given back", lambda: open_fds(pid) <= fds_before + 4)
            assert proxy.proc.poll() is None
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(180)
def test_reconnect_storm(kafka_broker: KafkaCluster, tmp_path: Path) -> None:
    """Eight threads connect, ask ApiVersions and hang up as fast as they can, and kafka-python
    clients come and go, for ten seconds, while a real client produces and consumes: every
    storm connection is answered, the bystander gets all its messages, and afterwards the proxy
    holds no connection and no descriptor more than before."""
    from kafka import KafkaConsumer

    with ProxyProcess(gateway_config(kafka_broker), workdir=tmp_path) as proxy:
        assert proxy.proc is not None
        pid = proxy.proc.pid
        host, port = proxy.bootstrap.split(":")
        _bystander(proxy, "warm-up")  # the proxy's own long-lived connections are open now
        fds_before = open_fds(pid)
        stop = threading.Event()
        answered: list[int] = []
        unanswered: list[int] = []  # connections the proxy closed before the answer's length came
        failed: list[BaseException] = []

        def storm() -> None:
            n = silent = 0
            while not stop.is_set():
                try:
                    with socket.create_connection((host, int(port)), timeout=30) as sock:
                        sock.sendall(_api_versions_request(n))
                        if _recv_exactly(sock, 4) is None:
                            silent += 1
                        else:
                            n += 1
                        # hang up without reading the rest: the proxy must not mind
                except OSError as exc:
                    failed.append(exc)
            answered.append(n)
            unanswered.append(silent)

        churned: list[int] = []
        churn_failed: list[BaseException] = []

        def churn() -> None:
            n = 0
            try:
                while not stop.is_set():
                    # A consumer whose constructor raises keeps its IO thread and its connection
                    # (kafka-python 3.0): a failure here must be seen, not leave a thread dead.
                    consumer = KafkaConsumer(bootstrap_servers=proxy.bootstrap, reconnect_backoff_ms=1)
                    try:
                        consumer.topics()
                    finally:
                        consumer.close()
                    n += 1
            except Exception as exc:
                churn_failed.append(exc)
            churned.append(n)

        workers = [threading.Thread(target=storm, name=f"storm-{i}", daemon=True) for i in range(8)]
        workers.append(threading.Thread(target=churn, name="churn", daemon=True))
        began = time.monotonic()
        for worker in workers:
            worker.start()
        try:
            _bystander(proxy, "in-storm")
            time.sleep(max(0.0, 10 - (time.monotonic() - began)))
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
        print(f"reconnect storm: {sum(answered)} connections answered, {sum(churned)} consumers churned")
        assert not churn_failed, f"a kafka-python consumer failed in the storm: {churn_failed[0]!r}"
        stuck = [worker.name for worker in workers if worker.is_alive()]
        if stuck:  # a client waiting on an answer: its connection shows what the proxy holds of it
            _status, connections = proxy.admin_get("/connections?sort=age&limit=20")
            raise AssertionError(f"{stuck} still running 30 s after the storm; connections: {connections}")
        assert not failed, f"{len(failed)} storm connections failed, first: {failed[0]!r}"
        assert sum(unanswered) == 0, f"{sum(unanswered)} storm connections closed without an answer"
        assert sum(answered) > 100
        assert proxy.metric("kthrottle_upstream_errors_total", {"kind": "connect"}) == 0
        try:
            _wait_for("all connections closed", lambda: _active(proxy) == 0)
        except AssertionError as exc:  # which connections stay, and why, for the one who debugs it
            _status, left = proxy.admin_get("/connections?sort=age&limit=20")
            held = own_tcp_connections_to(proxy_ports(proxy))
            raise AssertionError(f"{exc}; still open: {left}; the test's own sockets to it: {held}") from None
        _wait_for("descriptors given back", lambda: open_fds(pid) <= fds_before + 4)
        _bystander(proxy, "after-storm")
        assert proxy.proc.poll() is None
