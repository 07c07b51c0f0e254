"""`helm test` for kthrottle: the proxy answers a Kafka ApiVersions request on its client port
with a broker's API list, and its admin /readyz answers 200.

Run by the chart's test Pod (templates/tests/test-proxy.yaml) as ``python -c`` in the kthrottle
image, which holds the project's ``protocol`` package; the test pod sets the environment:

KTHROTTLE_TEST_BOOTSTRAP   host:port of the proxy's client listener
KTHROTTLE_TEST_READYZ_URL  the admin /readyz URL
KTHROTTLE_TEST_TLS         "true": speak TLS to the client listener
KTHROTTLE_TEST_SERVER_NAME the TLS server name (SNI routing, host name check)
KTHROTTLE_TEST_CERT_DIR    a directory with tls.crt and tls.key (a client certificate) and/or
                           ca.crt (verify the proxy's certificate); without ca.crt, no check
KTHROTTLE_TEST_TIMEOUT     seconds to keep retrying both checks before failing
"""

from __future__ import annotations

import os
import socket
import ssl
import struct
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from protocol import frames, messages
from protocol.api_keys import ApiKey

VERSION = 3  # ApiVersions v3: what current clients send first (flexible, client software name)
CLIENT_ID = "kthrottle-helm-test"
# A broker lists these; an answer without them did not come from Kafka.
EXPECTED_APIS = {ApiKey.PRODUCE: "Produce", ApiKey.FETCH: "Fetch", ApiKey.METADATA: "Metadata"}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def _tls_context(cert_dir: Path | None) -> ssl.SSLContext:
    ca = cert_dir / "ca.crt" if cert_dir else None
    if ca is not None and ca.exists():
        context = ssl.create_default_context(cafile=str(ca))
    else:
        # No CA given: the check is that the proxy answers Kafka, not who signed its certificate.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_dir and (cert_dir / "tls.crt").exists():
        context.load_cert_chain(str(cert_dir / "tls.crt"), str(cert_dir / "tls.key"))
    return context


def api_versions(address: str, tls: bool, server_name: str, cert_dir: Path | None, timeout: float) -> str:
    """One ApiVersions round trip; returns a summary, raises on any failure."""
    host, _, port = address.rpartition(":")
    header = frames.RequestHeader(ApiKey.API_VERSIONS, VERSION, 1, CLIENT_ID, 0)
    body = messages.encode(
        ApiKey.API_VERSIONS,
        VERSION,
        {"client_software_name": CLIENT_ID, "client_software_version": "1.0"},
        response=False,
    )
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        sock = _tls_context(cert_dir).wrap_socket(raw, server_hostname=server_name or host) if tls else raw
        sock.sendall(frames.frame(frames.encode_request_header(header) + body))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        payload = _recv_exactly(sock, size)
    (correlation_id,) = struct.unpack_from(">i", payload, 0)
    if correlation_id != 1:
        raise ValueError(f"answer with correlation id {correlation_id}, not 1")
    start = frames.response_header_size(ApiKey.API_VERSIONS, VERSION, payload)
    answer = messages.decode_response(ApiKey.API_VERSIONS, VERSION, payload[start:])
    if answer["error_code"] != 0:
        raise ValueError(f"ApiVersions error_code {answer['error_code']}")
    keys = {entry["api_key"] for entry in answer["api_keys"]}
    missing = [name for key, name in EXPECTED_APIS.items() if key not in keys]
    if missing:
        raise ValueError(f"ApiVersions answer without {', '.join(missing)}: {sorted(keys)}")
    return f"ApiVersions from {address}: {len(keys)} APIs"


def readyz(url: str, timeout: float) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = response.status, response.read(2000)
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{url}: HTTP {exc.code} {exc.read(2000).decode(errors='replace')}") from exc
    if status != 200:
        raise ValueError(f"{url}: HTTP {status}")
    return f"{url}: 200 {body.decode(errors='replace')}"


def main() -> int:
    env = os.environ
    bootstrap = env["KTHROTTLE_TEST_BOOTSTRAP"]
    url = env["KTHROTTLE_TEST_READYZ_URL"]
    tls = env.get("KTHROTTLE_TEST_TLS", "false") == "true"
    server_name = env.get("KTHROTTLE_TEST_SERVER_NAME", "")
    cert_dir = Path(env["KTHROTTLE_TEST_CERT_DIR"]) if env.get("KTHROTTLE_TEST_CERT_DIR") else None
    deadline = time.monotonic() + float(env.get("KTHROTTLE_TEST_TIMEOUT", "60"))
    checks = {
        "kafka": lambda: api_versions(bootstrap, tls, server_name, cert_dir, 10),
        "readyz": lambda: readyz(url, 10),
    }
    passed: dict[str, str] = {}
    while True:
        errors = {}
        for name, check in checks.items():
            if name in passed:
                continue
            try:
                passed[name] = check()
            except Exception as exc:  # any failure: retried until the deadline
                errors[name] = f"{type(exc).__name__}: {exc}"
        if not errors:
            for line in passed.values():
                print("ok:", line)
            return 0
        if time.monotonic() >= deadline:
            for line in passed.values():
                print("ok:", line)
            for name, error in errors.items():
                print(f"FAILED {name}: {error}", file=sys.stderr)
            return 1
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
