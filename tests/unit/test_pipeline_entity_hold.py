"""One quota across connections, in the pipeline: once a client is throttled on one connection, its
other connections' next Produce waits unread, and whatever that connection pipelined behind it is
answered after it, in order (a stub upstream; the quota decisions are the real ones)."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from dev.loadgen import produce_request
from protocol import messages
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.frames import FrameDecoder, RequestHeader, encode_request_header, parse_request_header
from tests.unit.conftest import proxy_in_front_of, recv_exactly

QUOTAS = """
quotas:
  hold_across_connections: true
  window: {num: 2, size_seconds: 0.2}
  clients:
    app: {producer_byte_rate: 50000}
"""


def _frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    payload = encode_request_header(RequestHeader(api_key, version, correlation_id, "app", 0)) + body
    return struct.pack(">i", len(payload)) + payload


def _produce(correlation_id: int, value_size: int) -> bytes:
    return bytes(produce_request("t", correlation_id, b"v" * value_size, client_id="app"))


def _list_offsets(correlation_id: int) -> bytes:
    return _frame(ApiKey.LIST_OFFSETS, 5, correlation_id, b"\xff\xff\xff\xff\x00\x00\x00\x00\x00")


PRODUCE_RESPONSE: dict[str, Any] = {
    "responses": [
        {
            "name": "t",
            "partition_responses": [
                {
                    "index": 0,
                    "error_code": 0,
                    "base_offset": 0,
                    "log_append_time_ms": -1,
                    "log_start_offset": 0,
                    "record_errors": [],
                    "error_message": None,
                }
            ],
        }
    ],
    "throttle_time_ms": 0,
}


async def _broker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers Produce v9 (a flexible response header, then the body) and anything else with a byte."""
    decoder = FrameDecoder()
    while data := await reader.read(65536):
        for frame in decoder.feed(data):
            api_key = struct.unpack_from(">h", frame, 0)[0]
            if api_key == ApiKey.METADATA:  # the proxy's own discovery: not a broker here
                writer.close()
                return
            if api_key == ApiKey.PRODUCE:
                body = b"\x00" + bytes(messages.encode(ApiKey.PRODUCE, 9, PRODUCE_RESPONSE, response=True))
            else:
                body = b"x"
            reply = frame[4:8] + body
            writer.write(struct.pack(">i", len(reply)) + reply)
    writer.close()


def _correlation_ids(sock: socket.socket, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        ids.append(struct.unpack_from(">i", recv_exactly(sock, size), 0)[0])
    return ids


def test_a_held_connection_answers_in_order_after_the_throttle() -> None:
    with proxy_in_front_of(_broker, QUOTAS) as (_loop, port, server):
        with (
            socket.create_connection(("127.0.0.1", port), timeout=30) as first,
            socket.create_connection(("127.0.0.1", port), timeout=30) as second,
        ):
            first.sendall(_produce(1, 40_000))  # over 50 kB/s in a 0.2 s window: throttled
            assert _correlation_ids(first, 1) == [1]
            # The same client id on another connection: its Produce waits for the throttle, and
            # the request pipelined behind it is answered after it.
            second.sendall(_produce(7, 100) + _list_offsets(8) + _produce(9, 100))
            assert _correlation_ids(second, 3) == [7, 8, 9]
        held = server.metrics.registry.get_sample_value("kthrottle_entity_holds_total", {"api": "Produce"})
        assert held is not None and held >= 1


def test_a_request_held_again_when_its_mute_ends_keeps_newer_requests_behind_it() -> None:
    """The hold can outlast the mute (another throttle meanwhile, or timers a millisecond apart):
    the request is held again, and a request sent after that must still be answered after it."""
    import threading

    with proxy_in_front_of(_broker, QUOTAS) as (_loop, port, server):
        held_again = threading.Event()
        holds = [50, 500]  # first hold, then held again when its mute ends; then free

        def hold_ms(produce: bool, user: str, client_id: str) -> int:
            if not holds:
                return 0
            ms = holds.pop(0)
            if not holds:
                held_again.set()
            return ms

        server.enforcer.hold_ms = hold_ms  # type: ignore[method-assign]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(_produce(7, 100) + _list_offsets(8))
            assert held_again.wait(10), "the request was not held a second time"
            conn.sendall(_list_offsets(9))  # read while the first request is held again
            assert _correlation_ids(conn, 3) == [7, 8, 9]


# --- a throttled mutation holds its connection as the broker does (KIP-599, KIP-219) ----------


def _create_topics(correlation_id: int, partitions: int) -> bytes:
    req = {
        "topics": [
            {
                "name": "t",
                "num_partitions": partitions,
                "replication_factor": 1,
                "assignments": [],
                "configs": [],
            }
        ],
        "timeout_ms": 1000,
        "validate_only": False,
    }
    body = bytes(messages.encode(ApiKey.CREATE_TOPICS, 7, req, response=False))
    return _frame(ApiKey.CREATE_TOPICS, 7, correlation_id, body)


async def _controller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[int]) -> None:
    """Creates every topic asked for; notes the api key of each request as it arrives."""
    decoder = FrameDecoder()
    while data := await reader.read(65536):
        for frame in decoder.feed(data):
            api_key = struct.unpack_from(">h", frame, 0)[0]
            if api_key == ApiKey.METADATA:
                writer.close()
                return
            seen.append(api_key)
            if api_key == ApiKey.CREATE_TOPICS:
                body_at = parse_request_header(frame).size
                req = messages.decode_request(ApiKey.CREATE_TOPICS, 7, frame[body_at:])
                topics = [
                    {
                        "name": t["name"],
                        "topic_id": b"\x01" * 16,
                        "error_code": 0,
                        "error_message": None,
                        "num_partitions": t["num_partitions"],
                        "replication_factor": 1,
                        "configs": [],
                    }
                    for t in req["topics"]
                ]
                resp = {"throttle_time_ms": 0, "topics": topics}
                body = b"\x00" + bytes(messages.encode(ApiKey.CREATE_TOPICS, 7, resp, response=True))
            else:
                body = b"x"
            reply = frame[4:8] + body
            writer.write(struct.pack(">i", len(reply)) + reply)
    writer.close()


def test_nothing_after_a_throttled_mutation_is_read_before_its_throttle() -> None:
    """The broker reads a connection's next request only after a throttled CreateTopics has been
    answered and its throttle has passed; the proxy holds the pipelined request the same way."""
    seen: list[int] = []
    quotas = (
        "quotas:\n  controller_window: {num: 2, size_seconds: 1}\n"
        "  clients:\n    app: {controller_mutation_rate: 100}\n"
    )

    async def controller(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _controller(reader, writer, seen)

    with (
        proxy_in_front_of(controller, quotas) as (_loop, port, _server),
        socket.create_connection(("127.0.0.1", port), timeout=30) as conn,
    ):
        # 300 partitions against a bucket of 200: admitted, leaving it 100 short (Kafka's strict
        # quota throttles the next request, not this one).
        conn.sendall(_create_topics(1, 300))
        assert _correlation_ids(conn, 1) == [1]
        conn.sendall(_create_topics(2, 1) + _list_offsets(3))
        (size,) = struct.unpack(">i", recv_exactly(conn, 4))
        answer = recv_exactly(conn, size)
        assert struct.unpack_from(">i", answer, 0)[0] == 2
        body = messages.decode_response(ApiKey.CREATE_TOPICS, 7, answer[5:])
        assert body["topics"][0]["error_code"] == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert body["throttle_time_ms"] >= 900
        assert seen == [ApiKey.CREATE_TOPICS], "the request behind the throttled one was read at once"
        assert _correlation_ids(conn, 1) == [3]
        assert seen == [ApiKey.CREATE_TOPICS, ApiKey.LIST_OFFSETS]
