"""Decode and encode the message bodies the proxy reads or changes.

Bodies are plain dicts (see ``protocol.schema``). Everything here is a pure function of bytes
and values: the proxy decides *when* to call them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from protocol.api_keys import ApiKey, api_name, has_schema
from protocol.errors import ErrorCode
from protocol.metadata_topics import ZERO_TOPIC_ID
from protocol.partition_bytes import PartitionBytes as PartitionBytes  # also messages.PartitionBytes
from protocol.records import complete_size, iter_batches
from protocol.schema import Buffer, SchemaError, message_codec, message_schema
from protocol.versions import ADDRESS_LEAKING_CAP, ADVERTISED_BELOW_ACCEPTED, DECODED_APIS, codec_versions

_I32 = struct.Struct(">i")

# throttle_time_ms is an int32 on the wire; a quota can decide more (a mutation burst far over a
# small controller_mutation_rate): the client is told the most the field holds, and stays muted
# for the whole throttle all the same.
MAX_THROTTLE_MS = 2**31 - 1


def wire_throttle_ms(throttle_ms: int) -> int:
    """A throttle time as throttle_time_ms can carry it."""
    return max(0, min(int(throttle_ms), MAX_THROTTLE_MS))


def _codec_name(api_key: int, response: bool) -> str:
    name = api_name(api_key)
    if name is None:
        raise SchemaError(f"unknown api key {api_key}")
    return f"{name}{'Response' if response else 'Request'}"


def decode(api_key: int, version: int, body: Buffer, *, response: bool) -> dict[str, Any]:
    """Decode a whole body; trailing bytes are an error (they would be lost on re-encode)."""
    codec = message_codec(_codec_name(api_key, response), version)
    view = memoryview(body)
    obj, end = codec.read(view, 0)
    if end != len(view):
        raise SchemaError(
            f"{len(view) - end} trailing bytes after {_codec_name(api_key, response)} v{version}"
        )
    result: dict[str, Any] = obj
    return result


def encode(api_key: int, version: int, obj: dict[str, Any], *, response: bool) -> bytearray:
    out = bytearray()
    message_codec(_codec_name(api_key, response), version).write(out, obj)
    return out


def response_codec_versions(api_key: int) -> tuple[int, int] | None:
    """Versions of this API's response the codec can read (None: no schema ships for it).

    Wider than ``codec_versions`` for APIs the proxy never decodes but may have to patch a
    throttle time into; a broker newer than the schemas answers versions outside this range.
    """
    if not has_schema(api_key):
        return None
    return message_schema(_codec_name(api_key, True)).valid


def can_read_response(api_key: int, version: int) -> bool:
    known = response_codec_versions(api_key)
    return known is not None and known[0] <= version <= known[1]


def decode_request(api_key: int, version: int, body: Buffer) -> dict[str, Any]:
    return decode(api_key, version, body, response=False)


def decode_response(api_key: int, version: int, body: Buffer) -> dict[str, Any]:
    if api_key == ApiKey.API_VERSIONS and len(body) >= 2:
        # A broker that does not support the requested ApiVersions version answers in v0.
        (err,) = struct.unpack_from(">h", body, 0)
        if err == ErrorCode.UNSUPPORTED_VERSION:
            version = 0
    return decode(api_key, version, body, response=True)


def encode_response(api_key: int, version: int, obj: dict[str, Any]) -> bytearray:
    if api_key == ApiKey.API_VERSIONS and obj.get("error_code") == ErrorCode.UNSUPPORTED_VERSION:
        version = 0
    return encode(api_key, version, obj, response=True)


# --- throttle_time_ms, patched in place -------------------------------------------------------


def throttle_time_offset(api_key: int, version: int, body: Buffer) -> int | None:
    """Where throttle_time_ms sits in a response body, or None if this version has none."""
    codec = message_codec(_codec_name(api_key, True), version)
    if not codec.field_names or "throttle_time_ms" not in codec.field_names:
        return None
    if codec.field_names[0] == "throttle_time_ms":
        return 0
    _obj, _end, positions = codec.read_with_positions(memoryview(body), 0)
    return positions.get("throttle_time_ms")


def patch_throttle_time(
    api_key: int, version: int, body: bytearray | memoryview, throttle_ms: int
) -> int | None:
    """Raise throttle_time_ms to at least ``throttle_ms`` without re-encoding; returns the value sent."""
    offset = throttle_time_offset(api_key, version, body)
    if offset is None:
        return None
    (current,) = _I32.unpack_from(body, offset)
    throttle_ms = wire_throttle_ms(throttle_ms)
    if throttle_ms > current:
        _I32.pack_into(body, offset, throttle_ms)
        return throttle_ms
    return int(current)


# --- ApiVersions ----------------------------------------------------------------------------


def intersect_api_versions(resp: dict[str, Any]) -> dict[str, Any]:
    """Limit the advertised APIs to what the proxy can carry.

    Decoded APIs are capped at the codec's versions; keys the proxy does not know are removed;
    address-bearing APIs it cannot rewrite are capped or removed.
    """
    kept = []
    for entry in resp.get("api_keys") or []:
        key = entry["api_key"]
        lo, hi = entry["min_version"], entry["max_version"]
        if api_name(key) is None:
            continue
        if key in DECODED_APIS:
            known = codec_versions(key)
            if known is None:
                continue
            hi = min(hi, known[1])
            if key not in ADVERTISED_BELOW_ACCEPTED:
                lo = max(lo, known[0])
        if key in ADDRESS_LEAKING_CAP:
            cap = ADDRESS_LEAKING_CAP[key]
            if cap is None:
                continue
            hi = min(hi, cap)
        if lo > hi:
            continue
        kept.append({**entry, "min_version": lo, "max_version": hi})
    resp["api_keys"] = kept
    return resp


def unsupported_api_versions_response() -> dict[str, Any]:
    """What the proxy answers to an ApiVersions request newer than it can decode (as brokers do)."""
    known = codec_versions(ApiKey.API_VERSIONS)
    assert known is not None
    return {
        "error_code": int(ErrorCode.UNSUPPORTED_VERSION),
        "api_keys": [{"api_key": int(ApiKey.API_VERSIONS), "min_version": known[0], "max_version": known[1]}],
    }


# --- broker addresses -------------------------------------------------------------------------

# (node_id, host, port) -> (host, port) the client should see instead.
AddressMap = Callable[[int, str, int], tuple[str, int]]


def _rewrite_nodes(nodes: list[dict[str, Any]] | None, id_field: str, amap: AddressMap) -> int:
    count = 0
    for node in nodes or []:
        node_id = node[id_field]
        if node_id < 0:
            continue
        node["host"], node["port"] = amap(node_id, node["host"], node["port"])
        count += 1
    return count


def rewrite_addresses(api_key: int, version: int, resp: dict[str, Any], amap: AddressMap) -> int:
    """Replace every broker address in a decoded response; returns how many were rewritten."""
    if api_key == ApiKey.METADATA:
        return _rewrite_nodes(resp.get("brokers"), "node_id", amap)
    if api_key == ApiKey.DESCRIBE_CLUSTER:
        return _rewrite_nodes(resp.get("brokers"), "broker_id", amap)
    if api_key == ApiKey.FIND_COORDINATOR:
        if "coordinators" in resp and resp["coordinators"] is not None and version >= 4:
            return _rewrite_nodes(resp["coordinators"], "node_id", amap)
        if resp.get("node_id", -1) >= 0 and resp.get("error_code", 0) == 0:
            resp["host"], resp["port"] = amap(resp["node_id"], resp["host"], resp["port"])
            return 1
        return 0
    if api_key in (ApiKey.PRODUCE, ApiKey.FETCH):
        return _rewrite_nodes(resp.get("node_endpoints"), "node_id", amap)
    return 0


def response_addresses(api_key: int, version: int, resp: dict[str, Any]) -> list[tuple[str, int]]:
    """Every (host, port) a decoded response shows the client (for tests and audits)."""
    found: list[tuple[str, int]] = []

    def collect(_node_id: int, host: str, port: int) -> tuple[str, int]:
        found.append((host, port))
        return host, port

    rewrite_addresses(api_key, version, resp, collect)
    return found


# --- Produce and Fetch summaries ------------------------------------------------------------


def _topic_key(topic: dict[str, Any]) -> str | bytes:
    """A topic's name (``name`` in Produce, ``topic`` in Fetch v4-12), else its 16-byte id (Produce
    v13+ and Fetch v13+ address topics by id only; ``proxy/shared/topic_names.py`` maps it to the name)."""
    name = topic.get("name")
    if name is None:
        name = topic.get("topic")
    if name is not None:
        return str(name)
    return bytes(topic.get("topic_id", b""))


def metadata_topic_ids(resp: dict[str, Any]) -> list[tuple[bytes, str]]:
    """(topic id, name) of every topic a Metadata response (v10+) shows with both and no error."""
    pairs = []
    for topic in resp.get("topics") or []:
        name, tid = topic.get("name"), topic.get("topic_id")
        if name is None or tid is None or int(topic.get("error_code", 0)) != 0:
            continue
        tid = bytes(tid)
        if tid != ZERO_TOPIC_ID:
            pairs.append((tid, str(name)))
    return pairs


def produce_request_partitions(req: dict[str, Any]) -> list[PartitionBytes]:
    """Per-partition record-set sizes, record counts and producer ids of a Produce request."""
    out = []
    for topic in req.get("topic_data") or []:
        key = _topic_key(topic)
        for part in topic.get("partition_data") or []:
            records = part.get("records")
            size = len(records) if records is not None else 0
            pb = PartitionBytes(key, part["index"], size)
            if records is not None:
                for batch in iter_batches(records):
                    pb.record_count += batch.record_count
                    if batch.producer_id >= 0:
                        pb.producer_ids.add(batch.producer_id)
            out.append(pb)
    return out


def produce_error_response(
    req: dict[str, Any], error_code: int, message: str | None, throttle_ms: int
) -> dict[str, Any]:
    """A Produce response answering every partition of ``req`` with ``error_code`` (nothing
    written: base offset -1), as the proxy answers a request it did not forward."""
    responses = []
    for topic in req.get("topic_data") or []:
        entry: dict[str, Any] = {k: topic[k] for k in ("name", "topic_id") if k in topic}
        entry["partition_responses"] = [
            {
                "index": part["index"],
                "error_code": error_code,
                "base_offset": -1,
                "log_append_time_ms": -1,
                "log_start_offset": -1,
                "record_errors": [],
                "error_message": message,
            }
            for part in topic.get("partition_data") or []
        ]
        responses.append(entry)
    return {"responses": responses, "throttle_time_ms": wire_throttle_ms(throttle_ms)}


def fetch_response_partitions(resp: dict[str, Any]) -> list[PartitionBytes]:
    """Per-partition record-set sizes in a Fetch response, and the trailing partial batch of each."""
    out = []
    for topic in resp.get("responses") or []:
        key = _topic_key(topic)
        for part in topic.get("partitions") or []:
            records = part.get("records")
            size = len(records) if records is not None else 0
            partial = size - complete_size(records) if size else 0
            out.append(PartitionBytes(key, part["partition_index"], size, partial=partial))
    return out


def produce_acks(req: dict[str, Any]) -> int:
    return int(req.get("acks", -1))


def is_known_response_error(code: int) -> bool:
    try:
        ErrorCode(code)
    except ValueError:
        return False
    return True
