"""Requests of an API the proxy decodes, in a version its codec does not know, are refused here:
nothing later could read them. An unknown ApiVersions version is answered as Kafka does."""

from __future__ import annotations

from collections.abc import Collection

from protocol import messages
from protocol.api_keys import ApiKey, api_name
from protocol.versions import DECODED_APIS, codec_versions
from proxy.pipeline.stages.base import Connection, Request, Stage


class VersionGate(Stage):
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._known = {key: codec_versions(key) for key in DECODED_APIS}

    def request_keys(self) -> Collection[int]:
        return self._known.keys()

    def wants_version(self, api_key: int, api_version: int) -> bool:
        known = self._known[api_key]
        return known is None or not known[0] <= api_version <= known[1]

    def on_request(self, req: Request) -> bool:
        key, version = req.header.api_key, req.header.api_version
        if key == ApiKey.API_VERSIONS:
            conn = self.conn
            entry = conn.entry_for(req, counted=False)
            conn.in_flight.append(entry)
            conn.answer(entry, conn.encoded_answer(req.header, messages.unsupported_api_versions_response()))
            return True
        self.conn.reject(f"{api_name(key)} v{version} is not supported by the proxy", "unsupported-version")
        return True
