"""The chart's pod options and packaging (issue 19): the startup probe, the gateway's default
topology spread, the extraEnv / extraVolumes / extraVolumeMounts / image.digest escape hatches in
both modes, the preStop pause and the grace period that covers it, the `helm test` Pod, and
Chart.yaml's metadata. Template renders, strict validation, and the `helm test` script itself
run against stand-ins for the proxy's client port and admin server (no cluster).
"""

from __future__ import annotations

import base64
import http.server
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from protocol import frames, messages
from protocol.api_keys import ApiKey
from tests.deploy.conftest import CHART, REPO
from tests.deploy.test_helm_chart import (
    GATEWAY,
    REQUIRED,
    SIDECAR,
    SNI_TLS,
    VALUES,
    assert_valid,
    docs_of,
    find,
    kinds,
    pod_spec,
    proxy_container,
    render,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def renders(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {name: docs_of(render(helm, values)) for name, values in VALUES.items()}


def workload(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    return found


def hook_pod(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `helm test` Pod, if rendered."""
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert len(pods) <= 1, pods
    return pods[0] if pods else None


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---- startup probe -----------------------------------------------------------------------------


def test_startup_probe_on_the_admin_port_in_both_modes(
    renders: dict[str, list[dict[str, Any]]], helm: str
) -> None:
    for name, docs in renders.items():
        container = proxy_container(pod_spec(workload(docs)))
        probe = container["startupProbe"]
        assert probe["httpGet"] == {"path": "/healthz", "port": "admin"}, name
        # A minute to open the admin port before the kubelet gives up (and restarts it).
        assert probe["periodSeconds"] * probe["failureThreshold"] == 60, name
    off = proxy_container(
        pod_spec(find(docs_of(render(helm, None, "probes.startup.enabled=false")), "Deployment"))
    )
    assert "startupProbe" not in off and off["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ready = proxy_container(
        pod_spec(find(docs_of(render(helm, SIDECAR, "probes.startup.path=/readyz")), "StatefulSet"))
    )
    assert ready["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}


# ---- topology spread ---------------------------------------------------------------------------


def test_gateway_replicas_spread_over_zones_and_nodes_by_default(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for name in ("default", "gateway", "gateway-sni-tls"):
        template = find(renders[name], "Deployment")["spec"]["template"]
        constraints = template["spec"]["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in constraints] == [
            "topology.kubernetes.io/zone",
            "kubernetes.io/hostname",
        ]
        for c in constraints:
            assert c["whenUnsatisfiable"] == "ScheduleAnyway" and c["maxSkew"] == 1, name
            assert c["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
            assert c["matchLabelKeys"] == ["pod-template-hash"]
    # The broker StatefulSet is the user's (or the example's) to place: the chart adds nothing.
    assert "topologySpreadConstraints" not in pod_spec(find(renders["sidecar"], "StatefulSet"))


def test_topology_spread_can_be_hardened_replaced_or_removed(
    helm: str, kubernetes_validate: str, tmp_path: Path
) -> None:
    def constraints(*sets: str) -> Any:
        return pod_spec(find(docs_of(render(helm, None, *sets)), "Deployment")).get(
            "topologySpreadConstraints"
        )

    assert constraints("gateway.topologySpread.enabled=false") is None
    hard = constraints(
        "gateway.topologySpread.whenUnsatisfiable=DoNotSchedule",
        "gateway.topologySpread.topologyKeys={kubernetes.io/hostname}",
    )
    assert [(c["topologyKey"], c["whenUnsatisfiable"]) for c in hard] == [
        ("kubernetes.io/hostname", "DoNotSchedule")
    ]
    own = [
        "gateway.topologySpreadConstraints[0].maxSkew=2",
        "gateway.topologySpreadConstraints[0].topologyKey=example.com/rack",
        "gateway.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "gateway.topologySpreadConstraints[0].labelSelector.matchLabels.app\\.kubernetes\\.io/component=gateway",
    ]
    assert constraints(*own) == [
        {
            "maxSkew": 2,
            "topologyKey": "example.com/rack",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "gateway"}},
        }
    ]
    for sets in (own, ["gateway.topologySpread.enabled=false"]):
        assert_valid(kubernetes_validate, docs_of(render(helm, None, *sets)), tmp_path)


# ---- escape hatches ----------------------------------------------------------------------------


def test_extra_env_volumes_and_mounts_in_both_modes(renders: dict[str, list[dict[str, Any]]]) -> None:
    # ci/gateway-values.yaml and ci/sidecar-values.yaml set them: the Deployment, and the native
    # sidecar with the broker pod's volumes (what kthrottle.sidecarContainer/-Volumes render).
    for name in ("gateway", "sidecar"):
        spec = pod_spec(workload(renders[name]))
        container = proxy_container(spec)
        env = env_of(container)
        assert container["env"][0]["name"] == "KTHROTTLE_ADMIN_PORT"  # the chart's own first
        assert env["PYTHONFAULTHANDLER"] == "1", name
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/ssl/corporate"] == {
            "name": "corporate-ca",
            "mountPath": "/etc/ssl/corporate",
            "readOnly": True,
        }
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["corporate-ca"] == {"name": "corporate-ca", "configMap": {"name": "corporate-ca"}}
        assert {"kthrottle-config", "kthrottle-tmp", "kthrottle-data"} <= set(volumes)
    gateway_env = env_of(proxy_container(pod_spec(workload(renders["gateway"]))))
    assert gateway_env["KAFKA_CLUSTER_NAME"] == {
        "configMapKeyRef": {"name": "kafka-cluster-info", "key": "name", "optional": True}
    }
    default = proxy_container(pod_spec(workload(renders["default"])))
    assert [e["name"] for e in default["env"]] == ["KTHROTTLE_ADMIN_PORT", "KTHROTTLE_POD_IP"]
    assert len(default["volumeMounts"]) == 3


def test_image_digest_pins_the_image_in_every_pod(helm: str) -> None:
    for values, kind in ((None, "Deployment"), (SIDECAR, "StatefulSet")):
        docs = docs_of(
            render(helm, values, f"image.digest={DIGEST}", "image.repository=registry.example.com/kthrottle")
        )
        image = proxy_container(pod_spec(find(docs, kind)))["image"]
        assert image == f"registry.example.com/kthrottle@{DIGEST}"  # the tag is not used
        pod = hook_pod(docs)
        assert pod is not None and pod["spec"]["containers"][0]["image"] == image
    # Without a digest: the tag, by default the chart's appVersion.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    default = docs_of(render(helm, None))
    assert (
        proxy_container(pod_spec(find(default, "Deployment")))["image"] == f"kthrottle:{chart['appVersion']}"
    )


# ---- preStop and the grace period --------------------------------------------------------------


def test_prestop_pause_then_drain_fit_in_the_grace_period(
    renders: dict[str, list[dict[str, Any]]], helm: str
) -> None:
    spec = pod_spec(find(renders["default"], "Deployment"))
    command = proxy_container(spec)["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["python", "-c", "import time; time.sleep(5)"]  # no shell in the image
    compile(command[2], "<preStop>", "exec")
    # The grace period counts from the preStop hook: the pause, drain_seconds (20), 10 s to exit.
    assert spec["terminationGracePeriodSeconds"] == 5 + 20 + 10
    assert pod_spec(find(renders["gateway"], "Deployment"))["terminationGracePeriodSeconds"] == 5 + 30 + 10

    def gateway(*sets: str) -> dict[str, Any]:
        return pod_spec(find(docs_of(render(helm, None, *sets)), "Deployment"))

    longer = gateway("gateway.preStopSleepSeconds=12")
    assert (
        proxy_container(longer)["lifecycle"]["preStop"]["exec"]["command"][2] == "import time; time.sleep(12)"
    )
    assert longer["terminationGracePeriodSeconds"] == 12 + 20 + 10
    off = gateway("gateway.preStopSleepSeconds=0")
    assert "lifecycle" not in proxy_container(off) and off["terminationGracePeriodSeconds"] == 30
    assert gateway("config.drain_seconds=2.5")["terminationGracePeriodSeconds"] == 5 + 3 + 10  # rounded up
    assert gateway("config.drain_seconds=0")["terminationGracePeriodSeconds"] == 5 + 0 + 10
    # drain_seconds left out of the config: the proxy's default, 10 s.
    assert gateway("config.drain_seconds=null")["terminationGracePeriodSeconds"] == 5 + 10 + 10
    # The native sidecar stops after the broker container: no pause there.
    assert "lifecycle" not in proxy_container(pod_spec(find(renders["sidecar"], "StatefulSet")))


# ---- helm test ---------------------------------------------------------------------------------


def test_helm_test_pod_is_a_locked_down_test_hook(renders: dict[str, list[dict[str, Any]]]) -> None:
    expected = {
        "default": ("rel-kthrottle.kafka.svc:9092", "false", ""),
        "gateway": ("rel-kthrottle.kafka.svc:9092", "false", ""),
        "gateway-sni-tls": ("rel-kthrottle.kafka.svc:9093", "true", "kafka.example.com"),
        "sidecar": ("rel-kthrottle-kafka.kafka.svc:9092", "false", ""),
    }
    for name, docs in renders.items():
        pod = hook_pod(docs)
        assert pod is not None, name
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        # Not deleted on success: `helm test --logs` reads its output afterwards.
        assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation"
        spec = pod["spec"]
        assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
        assert spec["activeDeadlineSeconds"] > 60
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = spec["containers"]
        assert container["image"] == proxy_container(pod_spec(workload(docs)))["image"]  # the kthrottle image
        assert container["command"][:2] == ["python", "-c"]
        assert container["command"][2] == (CHART / "files" / "helm_test.py").read_text()
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
        assert container["resources"]["limits"]["memory"]
        env = env_of(container)
        bootstrap, tls, server_name = expected[name]
        assert (env["KTHROTTLE_TEST_BOOTSTRAP"], env["KTHROTTLE_TEST_TLS"]) == (bootstrap, tls), name
        assert env["KTHROTTLE_TEST_SERVER_NAME"] == server_name
        assert env["KTHROTTLE_TEST_READYZ_URL"] == "http://rel-kthrottle-metrics.kafka.svc:9644/readyz"
        # The targets exist: the client Service's port, the metrics Service's admin port.
        host, port = bootstrap.split(":")
        service = find(docs, "Service", host.split(".")[0])
        assert int(port) in [p["port"] for p in service["spec"]["ports"]]
        metrics = find(docs, "Service", "rel-kthrottle-metrics")
        assert [p["port"] for p in metrics["spec"]["ports"]] == [9644]
    # clientAuth required: the test presents the client certificate of helmTest.tls.secretName.
    pod = hook_pod(renders["gateway-sni-tls"])
    assert pod is not None
    (container,) = pod["spec"]["containers"]
    assert env_of(container)["KTHROTTLE_TEST_CERT_DIR"] == "/etc/kthrottle-test/tls"
    assert container["volumeMounts"] == [
        {"name": "client-tls", "mountPath": "/etc/kthrottle-test/tls", "readOnly": True}
    ]
    (volume,) = pod["spec"]["volumes"]
    assert volume["secret"]["secretName"] == "kthrottle-test-client-tls"


@pytest.mark.parametrize(
    ("sets", "rendered"),
    [
        (("helmTest.enabled=false",), False),
        (("mode=sidecar",), False),  # the snippet only: no client Service to test
        (("mode=sidecar", "helmTest.bootstrapServer=my-kafka.kafka.svc:9092"), True),
        (("metrics.service.enabled=false",), False),
        (("metrics.service.enabled=false", "helmTest.readyzUrl=http://gw-admin.kafka.svc:9644/readyz"), True),
        (("tls.enabled=true", "tls.secretName=s", "tls.clientAuth=required"), False),
        (("tls.enabled=true", "tls.secretName=s", "tls.clientAuth=requested"), True),
    ],
    ids=[
        "disabled",
        "sidecar-snippet",
        "sidecar-snippet-bootstrap",
        "no-metrics",
        "no-metrics-url",
        "mtls",
        "tls",
    ],
)
def test_helm_test_pod_only_where_its_targets_are_known(
    helm: str, sets: tuple[str, ...], rendered: bool
) -> None:
    docs = docs_of(render(helm, None, *sets))
    pod = hook_pod(docs)
    assert (pod is not None) == rendered, kinds(docs)
    if pod is not None and "mode=sidecar" in sets:
        assert env_of(pod["spec"]["containers"][0])["KTHROTTLE_TEST_BOOTSTRAP"] == "my-kafka.kafka.svc:9092"
    result = subprocess.run(
        [
            helm,
            "install",
            "rel",
            str(CHART),
            "-n",
            "kafka",
            "--dry-run=client",
            "-f",
            str(REQUIRED),
            *[a for s in sets for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert ("helm test rel -n kafka" in notes) == rendered
    assert ("No `helm test` Pod" in notes) != rendered


def test_helm_test_variants_are_valid_kubernetes(helm: str, kubernetes_validate: str, tmp_path: Path) -> None:
    pods = []
    for i, sets in enumerate(
        [
            ("mode=sidecar", "helmTest.bootstrapServer=my-kafka:9092", "helmTest.tls.secretName=c"),
            ("imagePullSecrets[0].name=regcred", "nodeSelector.pool=kafka", "tolerations[0].operator=Exists"),
        ]
    ):
        pod = hook_pod(docs_of(render(helm, None, *sets)))
        assert pod is not None
        pod["metadata"]["name"] += f"-{i}"
        pods.append(pod)
    assert pods[1]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pods[1]["spec"]["nodeSelector"] == {"pool": "kafka"}
    assert_valid(kubernetes_validate, pods, tmp_path)


# The `helm test` script, run as the test Pod runs it, against stand-ins: a Kafka listener that
# answers ApiVersions (decoding the request with the project's codec) and an admin /readyz.

KAFKA_APIS = [ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.API_VERSIONS]


class KafkaStandIn:
    """Answers each ApiVersions request it gets with the given API list; records the requests."""

    def __init__(self, api_keys: Sequence[int], tls: ssl.SSLContext | None = None) -> None:
        self.api_keys = api_keys
        self.tls = tls
        self.requests: list[tuple[frames.RequestHeader, dict[str, Any]]] = []
        self.server_names: list[str | None] = []
        self.errors: list[BaseException] = []
        if tls is not None:
            tls.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with conn:
                    stream = self.tls.wrap_socket(conn, server_side=True) if self.tls else conn
                    (size,) = struct.unpack(">i", _read(stream, 4))
                    payload = _read(stream, size)
                    header = frames.parse_request_header(payload)
                    body = messages.decode_request(header.api_key, header.api_version, payload[header.size :])
                    self.requests.append((header, body))
                    answer = {
                        "error_code": 0,
                        "api_keys": [
                            {"api_key": k, "min_version": 0, "max_version": 3} for k in self.api_keys
                        ],
                        "throttle_time_ms": 0,
                    }
                    out = frames.encode_response_header(
                        header.api_key, header.api_version, header.correlation_id
                    )
                    out += messages.encode_response(header.api_key, header.api_version, answer)
                    stream.sendall(frames.frame(out))
            except (OSError, ValueError) as exc:
                self.errors.append(exc)

    def close(self) -> None:
        self.sock.close()


def _read(stream: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class AdminStandIn:
    def __init__(self, status: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"ready": true}' if status == 200 and self.path == "/readyz" else b'{"ready": false}'
                self.send_response(status if self.path == "/readyz" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/readyz"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_ins() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for s in made:
        s.close()


def run_helm_test(pod: dict[str, Any], **overrides: str) -> subprocess.CompletedProcess[str]:
    """The test Pod's command, with its environment (targets overridden), in this checkout."""
    (container,) = pod["spec"]["containers"]
    env = dict(
        os.environ, PYTHONPATH=str(REPO), **{k: v for k, v in env_of(container).items() if isinstance(v, str)}
    )
    env.update(overrides)
    assert container["command"][0] == "python"  # the image's; here this interpreter
    command = [sys.executable, *container["command"][1:]]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def test_helm_test_script_passes_against_kafka_and_a_ready_proxy(
    renders: dict[str, list[dict[str, Any]]], stand_ins: list[Any]
) -> None:
    kafka, admin = KafkaStandIn(KAFKA_APIS), AdminStandIn(200)
    stand_ins += [kafka, admin]
    pod = hook_pod(renders["gateway"])
    assert pod is not None
    result = run_helm_test(
        pod, KTHROTTLE_TEST_BOOTSTRAP=f"127.0.0.1:{kafka.port}", KTHROTTLE_TEST_READYZ_URL=admin.url
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok: ApiVersions from 127.0.0.1:{kafka.port}: 4 APIs" in result.stdout
    assert f"ok: {admin.url}: 200" in result.stdout
    ((header, body),) = kafka.requests
    assert (header.api_key, header.api_version, header.client_id) == (
        ApiKey.API_VERSIONS,
        3,
        "kthrottle-helm-test",
    )
    assert body["client_software_name"] == "kthrottle-helm-test"


@pytest.mark.parametrize(
    ("apis", "status", "failure"),
    [
        (
            KAFKA_APIS,
            503,
            'FAILED readyz: ValueError: http://127.0.0.1:PORT/readyz: HTTP 503 {"ready": false}',
        ),
        (
            [ApiKey.API_VERSIONS],
            200,
            "FAILED kafka: ValueError: ApiVersions answer without Produce, Fetch, Metadata",
        ),
        (None, 200, "FAILED kafka: ConnectionRefusedError"),
    ],
    ids=["not-ready", "not-kafka", "no-listener"],
)
def test_helm_test_script_fails_with_the_reason(
    renders: dict[str, list[dict[str, Any]]],
    stand_ins: list[Any],
    apis: list[int] | None,
    status: int,
    failure: str,
) -> None:
    admin = AdminStandIn(status)
    stand_ins.append(admin)
    if apis is None:
        with socket.create_server(("127.0.0.1", 0)) as unused:
            port = unused.getsockname()[1]
    else:
        kafka = KafkaStandIn(apis)
        stand_ins.append(kafka)
        port = kafka.port
    pod = hook_pod(renders["default"])
    assert pod is not None
    result = run_helm_test(
        pod,
        KTHROTTLE_TEST_BOOTSTRAP=f"127.0.0.1:{port}",
        KTHROTTLE_TEST_READYZ_URL=admin.url,
        KTHROTTLE_TEST_TIMEOUT="0",  # one attempt
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert failure.replace("PORT", str(admin.server.server_address[1])) in result.stderr


def test_helm_test_script_speaks_tls_with_sni_and_a_client_certificate(
    renders: dict[str, list[dict[str, Any]]], stand_ins: list[Any], tmp_path: Path
) -> None:
    from dev.certs import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.issue("server", "kafka.example.com", dns=("kafka.example.com",))
    client = ca.issue("client", "helm-test", server=False)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(server.cert, server.key)
    context.load_verify_locations(ca.cert_path)
    context.verify_mode = ssl.CERT_REQUIRED  # tls.clientAuth: required
    kafka, admin = KafkaStandIn(KAFKA_APIS, tls=context), AdminStandIn(200)
    stand_ins += [kafka, admin]
    # The Secret helmTest.tls.secretName, as mounted: tls.crt, tls.key, ca.crt.
    cert_dir = tmp_path / "client-tls"
    cert_dir.mkdir()
    (cert_dir / "tls.crt").write_bytes(client.cert.read_bytes())
    (cert_dir / "tls.key").write_bytes(client.key.read_bytes())
    (cert_dir / "ca.crt").write_bytes(ca.cert_path.read_bytes())
    pod = hook_pod(renders["gateway-sni-tls"])
    assert pod is not None
    result = run_helm_test(
        pod,
        KTHROTTLE_TEST_BOOTSTRAP=f"127.0.0.1:{kafka.port}",
        KTHROTTLE_TEST_READYZ_URL=admin.url,
        KTHROTTLE_TEST_CERT_DIR=str(cert_dir),
        KTHROTTLE_TEST_TIMEOUT="0",
    )
    assert result.returncode == 0, result.stdout + result.stderr + str(kafka.errors)
    assert kafka.server_names == ["kafka.example.com"]  # gateway.sni.bootstrapHost: SNI routes by it
    assert len(kafka.requests) == 1


# ---- Chart.yaml --------------------------------------------------------------------------------


def test_chart_metadata_home_sources_icon_maintainers() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for url in [chart["home"], *chart["sources"]]:
        parsed = urllib.parse.urlsplit(url)
        assert parsed.scheme == "https" and parsed.netloc, url
    assert chart["sources"]
    for maintainer in chart["maintainers"]:
        assert maintainer["name"] and "@" in maintainer["email"]
    icon = chart["icon"]
    prefix = "data:image/svg+xml;base64,"
    assert icon.startswith(prefix), icon[:40]
    svg = ET.fromstring(base64.b64decode(icon.removeprefix(prefix), validate=True))
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and svg.get("viewBox") == "0 0 64 64"


# ---- the schema --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("image.digest=latest", "/image/digest"),
        ("image.digest=sha256:abc", "/image/digest"),
        ("extraEnv[0].value=x", "missing property 'name'"),
        ("extraEnv[0].name=A,extraEnv[0].valueFrm.x=1", "additional properties 'valueFrm' not allowed"),
        ("extraVolumes[0].name=x", "/extraVolumes/0"),  # a name without a volume source
        ("extraVolumes[0].name=kthrottle-tmp,extraVolumes[0].emptyDir.medium=Memory", "/extraVolumes/0/name"),
        ("extraVolumeMounts[0].name=x", "missing property 'mountPath'"),
        ("extraVolumeMounts[0].name=x,extraVolumeMounts[0].mountPath=/tmp", "/extraVolumeMounts/0/mountPath"),
        ("gateway.topologySpread.whenUnsatisfiable=Never", "value must be one of"),
        ("gateway.topologySpread.keys={a}", "additional properties 'keys' not allowed"),
        ("gateway.topologySpreadConstraints[0].maxSkew=1", "missing propert"),
        ("gateway.preStopSleepSeconds=-1", "/gateway/preStopSleepSeconds"),
        ("probes.startup.path=/metrics", "value must be one of"),
        ("probes.startup.failureThreshold=0", "/probes/startup/failureThreshold"),
        ("helmTest.bootstrap=x:1", "additional properties 'bootstrap' not allowed"),
        ("helmTest.bootstrapServer=no-port", "/helmTest/bootstrapServer"),
    ],
)
def test_values_schema_refuses_mistakes_in_the_new_values(helm: str, setting: str, complaint: str) -> None:
    result = subprocess.run(
        [helm, "template", "rel", str(CHART), "-f", str(REQUIRED), "--set", setting],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


def test_values_schema_takes_the_documented_examples(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "image": {"digest": DIGEST},
                "extraEnv": [
                    {"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                ],
                "extraVolumes": [{"name": "ca", "configMap": {"name": "corporate-ca"}}],
                "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corporate", "readOnly": True}],
                "gateway": {"topologySpread": {"enabled": False}, "preStopSleepSeconds": 0},
                "probes": {"startup": {"enabled": False}},
                "helmTest": {"timeoutSeconds": 30, "tls": {"serverName": "kafka.example.com"}},
            }
        )
    )
    result = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "-f", str(values)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_values_exercise_the_new_values() -> None:
    """helm lint and kubernetes-validate (test_helm_chart.py) run on these files: they must set the
    escape hatches in both modes and the test's client certificate."""
    gateway, sidecar, sni = (yaml.safe_load(p.read_text()) for p in (GATEWAY, SIDECAR, SNI_TLS))
    for values in (gateway, sidecar):
        assert values["extraEnv"] and values["extraVolumes"] and values["extraVolumeMounts"]
    assert sni["helmTest"]["tls"]["secretName"]
