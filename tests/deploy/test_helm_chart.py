"""The Helm chart (helm/kthrottle), rendered with helm for its example values (helm/kthrottle/ci):
helm lint, every manifest valid for Kubernetes 1.29+ in strict mode (kubernetes-validate), what a
user relies on (a Service port per broker, the native sidecar, probes, security context, hot
reloaded quotas), and the rendered proxy config accepted by `kthrottle check-config`.

No cluster is needed. The ServiceMonitor (a Prometheus Operator CRD, which kubernetes-validate has
no schema for) is checked here against the fields the operator needs and the Service it selects.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, REPO

CI = CHART / "ci"
GATEWAY = CI / "gateway-values.yaml"
SNI_TLS = CI / "gateway-sni-tls-values.yaml"
SIDECAR = CI / "sidecar-values.yaml"
# The chart's defaults plus only what has no sane default (the upstream bootstrap).
REQUIRED = CI / "required-values.yaml"
VALUES = {"default": REQUIRED, "gateway": GATEWAY, "gateway-sni-tls": SNI_TLS, "sidecar": SIDECAR}
K8S_VERSIONS = ("1.29.0", "1.35.0")  # the chart's kubeVersion floor, and a current release
CRD_GROUPS = ("monitoring.coreos.com/",)  # no schema in kubernetes-validate: checked below instead


class _UniqueKeyLoader(yaml.SafeLoader):
    """Refuses duplicate mapping keys, as kubectl's strict decoding does."""


def _no_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    duplicates = {k for k in keys if keys.count(k) > 1}
    if duplicates:
        raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {duplicates}", node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def helm_template(helm: str, values: Path | None, *sets: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` as a user runs it: with ``values`` (none: the chart's defaults alone)."""
    cmd = [helm, "template", "rel", str(CHART), "--namespace", "kafka"]
    if values is not None:
        cmd += ["-f", str(values)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def render(helm: str, values: Path | None, *sets: str) -> str:
    """The rendered manifests; ``values`` None: the defaults plus the required values."""
    result = helm_template(helm, REQUIRED if values is None else values, *sets)
    assert result.returncode == 0, result.stderr
    return result.stdout


def docs_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"{len(matches)} {kind} {name or ''} in {[d['kind'] for d in docs]}"
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def proxy_config(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The rendered kthrottle.yaml and quotas.yaml (parsed), and the ConfigMap's raw data."""
    data = find(docs, "ConfigMap", "rel-kthrottle-config")["data"]
    return yaml.safe_load(data["kthrottle.yaml"]), yaml.safe_load(data["quotas.yaml"]), data


def check_config(data: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`kthrottle check-config` on the ConfigMap's files, written side by side as they are mounted."""
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "check-config", str(tmp_path / "kthrottle.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def proxy_container(spec: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == "kthrottle"
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {name: docs_of(render(helm, values)) for name, values in VALUES.items()}


# ---- lint and schema ---------------------------------------------------------------------------


@pytest.mark.parametrize("values", list(VALUES), ids=list(VALUES))
def test_helm_lint_strict(helm: str, values: str) -> None:
    cmd = [helm, "lint", "--strict", str(CHART)]
    if VALUES[values] is not None:
        cmd += ["-f", str(VALUES[values])]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def assert_valid(kubernetes_validate: str, docs: list[dict[str, Any]], tmp_path: Path) -> None:
    """kubernetes-validate --strict on every manifest but the CRDs' (checked by their own tests)."""
    core = [d for d in docs if not d["apiVersion"].startswith(CRD_GROUPS)]
    crds = [d for d in docs if d["apiVersion"].startswith(CRD_GROUPS)]
    # ServiceMonitor here; PrometheusRule by promtool (test_prometheus_rules.py)
    assert {d["kind"] for d in crds} <= {"ServiceMonitor", "PrometheusRule"}, (
        "a CRD kind this test does not check"
    )
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    cmd = [kubernetes_validate, "--strict"]
    for version in K8S_VERSIONS:
        cmd += ["-k", version]
    result = subprocess.run([*cmd, str(manifest)], capture_output=True, text=True, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    # A kind without a schema is only a warning to kubernetes-validate: here it is a failure.
    assert "WARN" not in out and "ERROR" not in out, out
    assert out.count("passed") == len(core) * len(K8S_VERSIONS), out


@pytest.mark.parametrize("values", list(VALUES), ids=list(VALUES))
def test_every_manifest_is_valid_kubernetes_in_strict_mode(
    helm: str, kubernetes_validate: str, values: str, tmp_path: Path
) -> None:
    assert_valid(kubernetes_validate, docs_of(render(helm, VALUES[values])), tmp_path)


@pytest.mark.parametrize(
    "sets",
    [
        ("mode=sidecar",),  # the ConfigMap and metrics Service for one's own StatefulSet
        (
            "metrics.podAnnotations=false",
            "rollOnConfigChange=false",
            "podDisruptionBudget.enabled=false",
            "serviceAccount.create=false",
            "metrics.service.enabled=false",
        ),
    ],
    ids=["sidecar-snippet-only", "everything-optional-off"],
)
def test_other_value_combinations_are_valid_kubernetes(
    helm: str, kubernetes_validate: str, sets: tuple[str, ...], tmp_path: Path
) -> None:
    docs = docs_of(render(helm, None, *sets))
    assert_valid(kubernetes_validate, docs, tmp_path)
    if sets == ("mode=sidecar",):
        assert kinds(docs) == ["ConfigMap", "Service", "ServiceAccount"]


def test_strict_validation_rejects_an_unknown_field(
    helm: str, kubernetes_validate: str, tmp_path: Path
) -> None:
    """The control for the test above: strict mode does catch a misspelt field."""
    docs = docs_of(render(helm, GATEWAY))
    deployment = find(docs, "Deployment")
    proxy_container(pod_spec(deployment))["readOnlyRootFileSystem"] = True  # the real field: ...Filesystem
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(deployment))
    result = subprocess.run(
        [kubernetes_validate, "--strict", "-k", K8S_VERSIONS[0], str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "readOnlyRootFileSystem" in result.stdout


def test_no_duplicate_keys_and_unique_names(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for docs in rendered.values():  # docs_of already refused duplicate keys
        names = [(d["kind"], d["metadata"]["name"]) for d in docs]
        assert len(names) == len(set(names)), names


# ---- gateway -----------------------------------------------------------------------------------


def test_gateway_service_has_a_port_per_broker(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["gateway"]
    service = find(docs, "Service", "rel-kthrottle")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    # nodeIds [1, 2, 3, 4], portBase 9100, node 4 given its own port 19004.
    assert ports == {"kafka": 9092, "broker-1": 9101, "broker-2": 9102, "broker-3": 9103, "broker-4": 19004}
    assert service["spec"]["type"] == "LoadBalancer"
    assert "admin" not in ports  # the admin port stays off the client-facing Service
    deployment = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    container = proxy_container(pod_spec(deployment))
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for port in service["spec"]["ports"]:
        assert container_ports[port["targetPort"]] == port["port"]
    # The proxy opens the same ports: base + node id, and the explicit one.
    config, _, _ = proxy_config(docs)
    gateway = config["gateway"]
    for node in (1, 2, 3, 4):
        expected = ports[f"broker-{node}"]
        assert gateway["broker_ports"].get(str(node), gateway["broker_port_base"] + node) == expected
    assert config["advertised_host"] == "kafka-proxy.example.com"
    assert config["bind_host"] == "0.0.0.0"


def test_gateway_config_is_accepted_by_kthrottle(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    config, quotas, data = proxy_config(rendered["gateway"])
    assert config["quotas_file"] == "quotas.yaml" and "quotas" not in config
    assert quotas["quotas"]["users"]["alice"]["clients"]["app-1"] == {"consumer_byte_rate": 2097152}
    assert config["upstream_sasl"] == {
        "username": "kthrottle",
        "password_file": "/etc/kthrottle/sasl/password",
    }
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok (gateway mode" in result.stdout


def test_default_values_render_a_config_todays_proxy_accepts(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    config, quotas, data = proxy_config(rendered["default"])
    assert not {"tls", "upstream_tls", "quota_api", "upstream_sasl"} & set(config)
    assert "sni" not in config["gateway"] and "token_file" not in config["admin"]
    assert quotas["quotas"] == {}
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_config_files_carry_the_format_this_release_reads(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    """The chart writes config_version, so a later release reads its files by their version."""
    from quota.config import CONFIG_VERSION

    for name, docs in rendered.items():
        config, quotas, _ = proxy_config(docs)
        assert config["config_version"] == quotas["config_version"] == CONFIG_VERSION, name


def test_admin_listens_on_all_addresses_for_probes_and_scrapes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    for name, docs in rendered.items():
        config, _, _ = proxy_config(docs)
        assert config["admin"]["host"] == "0.0.0.0", name
        assert config["admin"]["port"] == 9644


def test_probes_security_context_and_resources(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in rendered.items():
        workload = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
        assert len(workload) == 1, name
        spec = pod_spec(workload[0])
        container = proxy_container(spec)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["admin"] == 9644
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        assert sc["runAsUser"] == 10001  # the image's user
        assert container["resources"]["requests"] and container["resources"]["limits"]
        assert spec["automountServiceAccountToken"] is False
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/etc/kthrottle"]["readOnly"] is True
        assert "/tmp" in mounts  # writable scratch with a read-only root
        assert not any("subPath" in m for m in container["volumeMounts"]), "subPath mounts never update"
        annotations = workload[0]["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9644"


def test_quota_changes_do_not_restart_pods_but_main_config_changes_roll_the_gateway(helm: str) -> None:
    base = docs_of(render(helm, GATEWAY))
    new_quotas = docs_of(render(helm, GATEWAY, "quotas.users.bob.producer_byte_rate=1024"))
    new_config = docs_of(render(helm, GATEWAY, "config.drain_seconds=45"))
    # Quotas: the ConfigMap changes (the proxy reloads quotas.yaml), the pod template does not.
    assert proxy_config(base)[1] != proxy_config(new_quotas)[1]
    assert proxy_config(new_quotas)[1]["quotas"]["users"]["bob"] == {"producer_byte_rate": 1024}
    assert find(base, "Deployment") == find(new_quotas, "Deployment")
    # The main config (listeners, admin, capture need a restart): the checksum rolls the pods.
    before = find(base, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = find(new_config, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert before != after
    # The 5 s preStop pause, drain_seconds, and 10 s to exit.
    assert pod_spec(find(new_config, "Deployment"))["terminationGracePeriodSeconds"] == 5 + 45 + 10


def test_pod_disruption_budget_selects_the_gateway_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["gateway"]
    pdb = find(docs, "PodDisruptionBudget")
    labels = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_service_monitor_scrapes_the_metrics_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name in ("gateway", "sidecar"):
        docs = rendered[name]
        monitor = find(docs, "ServiceMonitor")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        metrics = find(docs, "Service", "rel-kthrottle-metrics")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kafka"]}
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {p["name"] for p in metrics["spec"]["ports"]}
        assert metrics["spec"]["ports"][0]["targetPort"] == 9644
        # The metrics Service selects the pods running the proxy.
        workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert metrics["spec"]["selector"].items() <= pod_labels.items()
    assert "ServiceMonitor" not in kinds(rendered["default"])
    assert (
        find(rendered["gateway"], "ServiceMonitor")["metadata"]["labels"]["release"]
        == "kube-prometheus-stack"
    )


def test_dashboard_config_map_carries_the_dashboard(rendered: dict[str, list[dict[str, Any]]]) -> None:
    cm = find(rendered["gateway"], "ConfigMap", "rel-kthrottle-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "kthrottle.json").read_text())
    assert json.loads(cm["data"]["kthrottle.json"]) == shipped
    assert not [d for d in rendered["default"] if d["metadata"]["name"].endswith("-dashboard")]


# ---- gateway with SNI and TLS ------------------------------------------------------------------


def _projected_paths(spec: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Files of the projected config volume: path under /etc/kthrottle -> (source name, key)."""
    (volume,) = [v for v in spec["volumes"] if v["name"] == "kthrottle-config"]
    files = {}
    for source in volume["projected"]["sources"]:
        kind = "configMap" if "configMap" in source else "secret"
        for item in source[kind]["items"]:
            files[item["path"]] = (source[kind]["name"], item["key"])
    return files


def _config_paths(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [p for v in value.values() for p in _config_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _config_paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/etc/kthrottle/") else []


def test_sni_tls_gateway_exposes_one_port_and_mounts_every_file_the_config_names(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["gateway-sni-tls"]
    service = find(docs, "Service", "rel-kthrottle")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("kafka", 9093)]
    config, _, _ = proxy_config(docs)
    assert config["gateway"]["sni"] == {
        "enabled": True,
        "bootstrap_host": "kafka.example.com",
        "broker_host_template": "b{node_id}.kafka.example.com",
    }
    assert config["tls"] == {
        "enabled": True,
        "certfile": "/etc/kthrottle/tls/server/tls.crt",
        "keyfile": "/etc/kthrottle/tls/server/tls.key",
        "cafile": "/etc/kthrottle/tls/server/ca.crt",
        "client_auth": "required",
        "principal_mapping_rules": ["RULE:^CN=([^,]+).*$/$1/", "DEFAULT"],
    }
    assert config["upstream_tls"] == {
        "enabled": True,
        "cafile": "/etc/kthrottle/tls/upstream/ca.crt",
        "certfile": "/etc/kthrottle/tls/upstream/tls.crt",
        "keyfile": "/etc/kthrottle/tls/upstream/tls.key",
        "check_hostname": True,
    }
    assert config["admin"]["token_file"] == "/etc/kthrottle/admin/token"
    assert config["quota_api"] == {"mode": "proxy", "admins": ["User:admin"]}
    files = _projected_paths(pod_spec(find(docs, "Deployment")))
    for path in _config_paths(config):
        assert path.removeprefix("/etc/kthrottle/") in files, f"{path} is named in the config but not mounted"
    assert files["tls/server/tls.key"] == ("kthrottle-server-tls", "tls.key")
    assert files["tls/upstream/ca.crt"] == ("kthrottle-upstream-tls", "ca.crt")
    assert files["admin/token"] == ("kthrottle-admin-token", "token")
    container = proxy_container(pod_spec(find(docs, "Deployment")))
    assert not [p for p in container["ports"] if p["name"].startswith("broker-")]


def test_every_file_the_config_names_is_mounted(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in rendered.items():
        config, _, _ = proxy_config(docs)
        workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
        files = _projected_paths(pod_spec(workload))
        assert {"kthrottle.yaml", "quotas.yaml"} <= set(files), name
        for path in _config_paths(config):
            assert path.removeprefix("/etc/kthrottle/") in files, f"{name}: {path} not mounted"


def test_sni_tls_config_is_accepted_by_kthrottle(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, _, data = proxy_config(rendered["gateway-sni-tls"])
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr


def test_sni_without_tls_is_refused(helm: str) -> None:
    result = subprocess.run(
        [helm, "template", "rel", str(CHART), "-f", str(REQUIRED), "--set", "gateway.sni.enabled=true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "needs tls.enabled" in result.stderr


# ---- sidecar -----------------------------------------------------------------------------------


def test_sidecar_is_a_native_sidecar_in_the_kafka_statefulset(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    docs = rendered["sidecar"]
    assert "Deployment" not in kinds(docs)
    sts = find(docs, "StatefulSet")
    spec = pod_spec(sts)
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "kthrottle" and sidecar["restartPolicy"] == "Always"
    assert {p["name"]: p["containerPort"] for p in sidecar["ports"]} == {"kafka": 9092, "admin": 9644}
    (kafka,) = spec["containers"]
    assert kafka["image"] == "apache/kafka:4.1.1"
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["podManagementPolicy"] == "Parallel"
    config, _, _ = proxy_config(docs)
    assert config["mode"] == "sidecar"
    assert config["sidecar"] == {"listen_port": 9092, "upstream": "127.0.0.1:9093", "advertised_host": None}
    # The broker: KRaft combined mode, its client listener on localhost:9093 only (for the sidecar),
    # advertised with the pod's DNS name, which the sidecar keeps (port 9093 -> 9092).
    scripts = find(docs, "ConfigMap", "rel-kthrottle-kafka-scripts")["data"]["start.sh"]
    assert "process.roles=broker,controller" in scripts
    assert "listeners=CLIENT://127.0.0.1:9093,REPLICATION://0.0.0.0:9094,CONTROLLER://0.0.0.0:9095" in scripts
    headless = find(docs, "Service", "rel-kthrottle-kafka-headless")
    domain = "rel-kthrottle-kafka-headless.kafka.svc.cluster.local"
    assert f'host="${{HOSTNAME}}.{domain}"' in scripts
    assert "advertised.listeners=CLIENT://${host}:9093,REPLICATION://${host}:9094" in scripts
    voters = ",".join(f"{i}@rel-kthrottle-kafka-{i}.{domain}:9095" for i in range(3))
    assert f"controller.quorum.voters={voters}" in scripts
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    # Services reach the sidecar by port number (an init container's named ports are not looked up).
    for service in (headless, find(docs, "Service", "rel-kthrottle-kafka")):
        kafka_port = next(p for p in service["spec"]["ports"] if p["name"] == "kafka")
        assert kafka_port["port"] == 9092 and kafka_port["targetPort"] == 9092
        assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_sidecar_config_is_accepted_by_kthrottle(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, quotas, data = proxy_config(rendered["sidecar"])
    assert quotas["quotas"]["clients"]["<default>"]["producer_byte_rate"] == 10485760
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ok (sidecar mode" in result.stdout


def test_named_ports_resolve_in_regular_containers(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in rendered.items():
        for service in (d for d in docs if d["kind"] == "Service"):
            selector = service["spec"]["selector"]
            pods = [
                d
                for d in docs
                if d["kind"] in ("Deployment", "StatefulSet")
                and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert pods, f"{name}: Service {service['metadata']['name']} selects no pods"
            named = {p["name"] for c in pod_spec(pods[0])["containers"] for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                target = port["targetPort"]
                assert isinstance(target, int) or target in named, f"{name}: {target} is not a container port"


def test_sidecar_template_from_a_parent_chart(helm: str, tmp_path: Path) -> None:
    """The documented use in one's own broker StatefulSet: include the named templates through
    .Subcharts from a parent chart that depends on this one."""
    parent = tmp_path / "brokers"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "kthrottle")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: brokers\nversion: 0.1.0\n"
        "dependencies:\n  - {name: kthrottle, version: 0.1.0}\n"
    )
    (parent / "values.yaml").write_text(
        "kthrottle:\n  mode: sidecar\n  metrics: {service: {enabled: false}}\n"
        "  quotas: {clients: {<default>: {producer_byte_rate: 1048576}}}\n"
    )
    (parent / "templates" / "sts.yaml").write_text(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: my-kafka}\n"
        "spec:\n  serviceName: my-kafka\n  selector: {matchLabels: {app: my-kafka}}\n"
        "  template:\n    metadata: {labels: {app: my-kafka}}\n    spec:\n"
        "      initContainers:\n"
        '        {{- include "kthrottle.sidecarContainer" .Subcharts.kthrottle | nindent 8 }}\n'
        "      containers:\n        - {name: kafka, image: apache/kafka:4.1.1}\n"
        "      volumes:\n"
        '        {{- include "kthrottle.sidecarVolumes" .Subcharts.kthrottle | nindent 8 }}\n'
    )
    result = subprocess.run(
        [helm, "template", "rel", str(parent), "--namespace", "kafka"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    docs = docs_of(result.stdout)
    sts = find(docs, "StatefulSet", "my-kafka")
    (sidecar,) = pod_spec(sts)["initContainers"]
    assert sidecar["restartPolicy"] == "Always" and sidecar["args"][-1] == "/etc/kthrottle/kthrottle.yaml"
    files = _projected_paths(pod_spec(sts))
    config_map = find(docs, "ConfigMap", "rel-kthrottle-config")
    assert files["kthrottle.yaml"] == (config_map["metadata"]["name"], "kthrottle.yaml")
    assert yaml.safe_load(config_map["data"]["kthrottle.yaml"])["mode"] == "sidecar"


@pytest.mark.parametrize("values", list(VALUES), ids=list(VALUES))
def test_install_dry_run_prints_the_notes(helm: str, values: str) -> None:
    cmd = [helm, "install", "rel", str(CHART), "--namespace", "kafka", "--dry-run=client"]
    if VALUES[values] is not None:
        cmd += ["-f", str(VALUES[values])]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kthrottle_config_reloads_total" in notes
    assert "What to check after the install" in notes and '"upstream_reachable": true' in notes
    if values != "sidecar":
        assert "rollout status deployment/rel-kthrottle" in notes
    if values == "gateway":
        assert "Clients bootstrap from kafka-proxy.example.com:9092" in notes
        assert "node 4 -> port 19004" in notes
    if values == "sidecar":
        assert "bootstrap rel-kthrottle-kafka.kafka.svc:9092" in notes


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("gateway.replica=3", "additional properties 'replica' not allowed"),  # a typo
        ("tls.clientAuth=yes", "value must be one of"),
        ("mode=proxy", "value must be one of"),
        ("gateway.brokers.ports.x=1", "additional properties 'x' not allowed"),
        ("config.quotas.users.a.producer_byte_rate=1", "/config"),  # quotas belong in .quotas
    ],
)
def test_values_schema_refuses_mistakes(helm: str, setting: str, complaint: str) -> None:
    result = subprocess.run(
        [helm, "template", "rel", str(CHART), "-f", str(REQUIRED), "--set", setting],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and complaint in result.stderr, result.stderr
