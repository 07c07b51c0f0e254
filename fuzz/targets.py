"""Sans-IO fuzz targets: the request and response decoding the pipeline does, and its rewrites.

Each target takes one input and either returns (the input was handled or cleanly refused) or
raises (a bug). A clean refusal is what the pipeline catches at the same place and turns into a
counted close: FrameError and SchemaError for requests; for responses also LookupError, which
``Pipeline._response`` catches around ``_rewrite``. Everything else escapes the pipeline's
callbacks, and is a crash here too.

Beyond "no exception", the targets check what the proxy relies on: a decoded body re-encodes to
no more bytes than it came in (no amplification from re-encoding), re-encoding is stable
(decode(encode(x)) == x), and in-place patches (throttle time, fetch max_bytes) keep the frame
decodable and change only the field they patch.
"""

from __future__ import annotations

import struct
from typing import Any

from protocol import messages, mutations
from protocol.api_keys import ApiKey, api_name
from protocol.frames import FrameError, parse_request_header, response_header_size
from protocol.records import iter_batches
from protocol.sasl import PLAIN, SaslTracker
from protocol.schema import SchemaError
from protocol.versions import DECODED_APIS, NODE_ENDPOINTS_FROM, codec_versions
from proxy.shared import admission
from proxy.shared.throttling import (
    FetchRequestInfo,
    cap_fetch_max_bytes,
    fetch_request_info,
    throttled_fetch_response,
)

CLEAN_REQUEST_ERRORS: tuple[type[Exception], ...] = (FrameError, SchemaError)
CLEAN_RESPONSE_ERRORS: tuple[type[Exception], ...] = (FrameError, SchemaError, LookupError)
_KV = struct.Struct(">hh")
_MECHANISMS = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class InvariantError(AssertionError):
    """An input broke a property the proxy relies on (not a plain exception)."""


def _address_map(node_id: int, host: str, port: int) -> tuple[str, int]:
    return "proxy.example", 9092 + node_id % 1000


def _check_reencode(api_key: int, version: int, body: dict[str, Any], size: int, *, response: bool) -> None:
    """A decoded body re-encodes to at most its wire size, and decodes back to itself."""
    out = messages.encode(api_key, version, body, response=response)
    if len(out) > size:
        raise InvariantError(f"{api_name(api_key)} v{version}: {size} bytes re-encode to {len(out)}")
    again = messages.decode(api_key, version, out, response=response)
    if _plain(again) != _plain(body):
        raise InvariantError(f"{api_name(api_key)} v{version}: re-encoding changed the message")


def _plain(value: Any) -> Any:
    """Record views compare by content."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# --- requests ---------------------------------------------------------------------------------


def request_target(data: bytes) -> None:
    """One request frame payload (no size prefix), read as ``Pipeline._request`` reads it."""
    try:
        _request(bytearray(data))
    except CLEAN_REQUEST_ERRORS:
        return


def _request(frame: bytearray) -> None:
    header = parse_request_header(frame)
    key, version = header.api_key, header.api_version
    if header.size > len(frame):
        raise InvariantError("header size past the frame")
    if key not in DECODED_APIS:
        return
    known = codec_versions(key)
    if known is None or not known[0] <= version <= known[1]:
        if key == ApiKey.API_VERSIONS:
            messages.encode_response(key, version, messages.unsupported_api_versions_response())
        return
    body_view = memoryview(frame)[header.size :]
    body = messages.decode_request(key, version, body_view)
    selector = header.correlation_id & 0xFFFF
    if key == ApiKey.PRODUCE:
        messages.produce_acks(body)
        parts = messages.produce_request_partitions(body)
        if sum(p.size for p in parts) > len(frame):
            raise InvariantError("record bytes larger than the frame")
        for part in body.get("topic_data") or []:
            for p in part.get("partition_data") or []:
                if p.get("records") is not None:
                    for batch in iter_batches(p["records"]):
                        if batch.size > len(p["records"]):
                            raise InvariantError("batch larger than its record set")
        # The volume PAUSE answer: every partition answered by the proxy.
        answer = messages.produce_error_response(body, 19, "paused", 1000)
        messages.encode_response(key, version, answer)
    elif key == ApiKey.SASL_HANDSHAKE:
        SaslTracker().on_handshake(str(body.get("mechanism", "")))
    elif key == ApiKey.SASL_AUTHENTICATE:
        tracker = SaslTracker()
        tracker.on_handshake(_MECHANISMS[selector % len(_MECHANISMS)])
        tracker.on_authenticate_request(bytes(body.get("auth_bytes") or b""))
        tracker.on_authenticate_response(0)
    elif key in mutations.MUTATION_APIS:
        _mutation(key, version, body, selector)
    elif key == ApiKey.FETCH:
        _fetch(frame, header.size, version, body, selector)
    _check_reencode(key, version, body, len(body_view), response=False)


def _mutation(key: int, version: int, body: dict[str, Any], selector: int) -> None:
    """Admission as the pipeline does it: some topics admitted, the rest answered by the proxy."""
    state = admission.parse(key, version, body, charge_validate_only=bool(selector & 1))
    if state is None:
        return
    state.costs = [max(0, r.partitions) for r in state.refs]
    state.accepted = tuple(bool((selector >> (i % 15)) & 1) for i in range(len(state.refs)))
    state.throttle_ms = selector
    rewritten = admission.upstream_request(state, body)
    if rewritten is not None:
        encoded = admission.encode_request(state, rewritten)
        messages.decode_request(key, version, encoded)
    local = admission.local_response(state)
    messages.decode_response(key, version, messages.encode_response(key, version, local))


def _fetch(frame: bytes | bytearray, offset: int, version: int, body: dict[str, Any], selector: int) -> None:
    info = fetch_request_info(version, body)
    before = _plain(body)
    cap = selector * 7
    original = bytes(frame)
    capped = cap_fetch_max_bytes(version, frame, offset, cap)
    if frame != original:
        raise InvariantError("capping fetch max_bytes changed the frame it was given")
    if capped is not None:
        after = messages.decode_request(ApiKey.FETCH, version, memoryview(capped)[offset:])
        if after.get("max_bytes") != max(cap, 1):
            raise InvariantError("fetch max_bytes not capped")
        after["max_bytes"] = before.get("max_bytes")
        if _plain(after) != before:
            raise InvariantError("capping fetch max_bytes changed another field")
    messages.decode_response(ApiKey.FETCH, version, throttled_fetch_response(version, selector, info))


# --- responses --------------------------------------------------------------------------------


def response_target(data: bytes) -> None:
    """api_key (int16), api_version (int16), then a response frame payload (correlation id on).

    The request side decides how the response is read; the pipeline decodes responses of the
    decoded APIs, and of any API whose response it must patch a throttle time into.
    """
    if len(data) < 4:
        return
    key, version = _KV.unpack_from(data, 0)
    if api_name(key) is None or version < 0:
        return  # the pipeline never forwards such a request, so never reads its response
    if key in DECODED_APIS:
        known = codec_versions(key)
        if known is None or not known[0] <= version <= known[1]:
            return  # refused on the request side
    try:
        _response(key, version, bytearray(data[4:]))
    except CLEAN_RESPONSE_ERRORS:
        return


def _response(key: int, version: int, frame: bytearray) -> None:
    if len(frame) < 4:
        return  # "a response nobody asked for": closed before any decoding
    selector = int.from_bytes(frame[:2], "big")
    if key == ApiKey.SASL_AUTHENTICATE:
        hsize = response_header_size(key, version, frame)
        body = messages.decode_response(key, version, memoryview(frame)[hsize:])
        tracker = SaslTracker()
        tracker.on_handshake(_MECHANISMS[selector % len(_MECHANISMS)])
        tracker.on_authenticate_request(b"\x00user\x00secret")
        tracker.on_authenticate_response(int(body.get("error_code", -1)))
    addresses = key in (
        ApiKey.API_VERSIONS,
        ApiKey.METADATA,
        ApiKey.FIND_COORDINATOR,
        ApiKey.DESCRIBE_CLUSTER,
    )
    addresses = addresses or (key in NODE_ENDPOINTS_FROM and version >= NODE_ENDPOINTS_FROM[key])
    if key not in DECODED_APIS and not messages.can_read_response(key, version):
        return  # the throttle-only path passes these through unread (see Pipeline._rewrite)
    hsize = response_header_size(key, version, frame)
    body_view = memoryview(frame)[hsize:]
    body = messages.decode_response(key, version, body_view)
    if key == ApiKey.FETCH:
        messages.fetch_response_partitions(body)
        info = FetchRequestInfo(selector, selector & 3)
        throttled_fetch_response(version, max(int(body.get("throttle_time_ms", 0)), 5), info)
    if key in mutations.MUTATION_APIS:
        refs = [mutations.TopicRef(f"t{i}", None, 1) for i in range(selector % 4)]
        accepted = [bool((selector >> i) & 1) for i in range(len(refs))]
        state = admission.MutationState(key, version, refs, [1] * len(refs), tuple(accepted))
        admission.broker_refusals(state, body)
        merged = admission.merged(state, body)
        messages.decode_response(key, version, messages.encode_response(key, version, merged))
    if addresses:
        if key == ApiKey.API_VERSIONS:
            messages.intersect_api_versions(body)
        messages.rewrite_addresses(key, version, body, _address_map)
        for host, port in messages.response_addresses(key, version, body):
            if host != "proxy.example" or not 9092 <= port < 10092:
                raise InvariantError(f"address {host}:{port} left in a rewritten response")
        body["throttle_time_ms"] = max(int(body.get("throttle_time_ms", 0)), selector)
        out = messages.encode_response(key, version, body)
        messages.decode_response(key, version, out)
        return
    del body
    patched = bytearray(frame)
    sent = messages.patch_throttle_time(key, version, memoryview(patched)[hsize:], selector)
    again = messages.decode_response(key, version, memoryview(patched)[hsize:])
    if sent is not None and again.get("throttle_time_ms") != sent:
        raise InvariantError("throttle time not patched where it sits")
