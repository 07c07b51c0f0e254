"""The chart's shared quotas across gateway replicas: more than one replica (or the autoscaler)
renders `cluster_quotas: {enabled: true, replicas: N}` into kthrottle.yaml, the user's own
`config.cluster_quotas` keys winning; the optional HorizontalPodAutoscaler, with the Deployment
then leaving `replicas` to it; every proxy pod told its own IP (KTHROTTLE_POD_IP) for the other
replicas to reach its admin port; the schema and template refusing malformed autoscaling values;
and the install NOTES saying whether quotas are shared. Rendered with helm, no cluster.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import CHART
from tests.deploy.test_helm_chart import (
    GATEWAY,
    REQUIRED,
    SIDECAR,
    SNI_TLS,
    assert_valid,
    check_config,
    docs_of,
    find,
    kinds,
    pod_spec,
    proxy_config,
    proxy_container,
    render,
)

AUTOSCALING = (
    "gateway.autoscaling.enabled=true",
    "gateway.autoscaling.minReplicas=2",
    "gateway.autoscaling.maxReplicas=8",
)


def cluster_quotas(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    config, _, _ = proxy_config(docs)
    section: dict[str, Any] | None = config.get("cluster_quotas")
    return section


def helm_fails(helm: str, *sets: str) -> str:
    """helm template with these settings must fail; returns what it said."""
    cmd = [helm, "template", "rel", str(CHART), "-f", str(REQUIRED)]
    for s in sets:
        cmd += ["--set", s]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0, result.stdout
    return result.stderr


def notes(helm: str, *sets: str) -> str:
    cmd = [
        helm,
        "install",
        "rel",
        str(CHART),
        "--namespace",
        "kafka",
        "--dry-run=client",
        "-f",
        str(REQUIRED),
    ]
    for s in sets:
        cmd += ["--set", s]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split("NOTES:", 1)[1].split())  # one line: wrapping aside


# ---- cluster_quotas in the rendered config -----------------------------------------------------


def test_one_replica_renders_no_cluster_quotas(helm: str) -> None:
    docs = docs_of(render(helm, None, "gateway.replicas=1"))
    assert find(docs, "Deployment")["spec"]["replicas"] == 1
    assert cluster_quotas(docs) is None
    assert "HorizontalPodAutoscaler" not in kinds(docs)
    # Sidecar mode renders none either, whatever the example StatefulSet's size.
    assert cluster_quotas(docs_of(render(helm, SIDECAR))) is None
    assert cluster_quotas(docs_of(render(helm, None, "mode=sidecar"))) is None


def test_sidecar_keeps_the_users_cluster_quotas_as_given(helm: str) -> None:
    docs = docs_of(
        render(helm, SIDECAR, "config.cluster_quotas.enabled=true", "config.cluster_quotas.replicas=3")
    )
    assert cluster_quotas(docs) == {"enabled": True, "replicas": 3}


def test_three_replicas_share_their_quotas(helm: str, tmp_path: Path) -> None:
    docs = docs_of(render(helm, None, "gateway.replicas=3"))
    assert find(docs, "Deployment")["spec"]["replicas"] == 3
    assert cluster_quotas(docs) == {"enabled": True, "replicas": 3}
    # The default values (2 replicas) and the example gateway values (3) share theirs too.
    assert cluster_quotas(docs_of(render(helm, None))) == {"enabled": True, "replicas": 2}
    assert cluster_quotas(docs_of(render(helm, GATEWAY))) == {"enabled": True, "replicas": 3}
    assert cluster_quotas(docs_of(render(helm, SNI_TLS))) == {"enabled": True, "replicas": 2}
    # The proxy's own loader accepts what the chart rendered.
    _, _, data = proxy_config(docs)
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_users_cluster_quotas_keys_win(helm: str, tmp_path: Path) -> None:
    off = docs_of(render(helm, None, "gateway.replicas=3", "config.cluster_quotas.enabled=false"))
    assert cluster_quotas(off) == {"enabled": False, "replicas": 3}
    # Other settings are kept beside the chart's, and an explicit replicas replaces the chart's.
    own = docs_of(
        render(
            helm,
            None,
            "gateway.replicas=3",
            "config.cluster_quotas.topic=__shared_usage",
            "config.cluster_quotas.replicas=5",
        )
    )
    assert cluster_quotas(own) == {"enabled": True, "replicas": 5, "topic": "__shared_usage"}
    _, _, data = proxy_config(off)
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_non_mapping_cluster_quotas_is_refused(helm: str) -> None:
    assert "config.cluster_quotas must be a mapping" in helm_fails(helm, "config.cluster_quotas=on")


# ---- the autoscaler ----------------------------------------------------------------------------


def test_autoscaler_owns_the_replica_count_and_quotas_divide_by_max_replicas(
    helm: str, kubernetes_validate: str, tmp_path: Path
) -> None:
    docs = docs_of(render(helm, None, *AUTOSCALING, "gateway.replicas=3"))
    hpa = find(docs, "HorizontalPodAutoscaler")
    deployment = find(docs, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
        }
    ]
    assert "behavior" not in hpa["spec"]
    # The HPA sets the count: a `replicas` in the Deployment would reset it at every upgrade.
    assert "replicas" not in deployment["spec"]
    assert cluster_quotas(docs) == {"enabled": True, "replicas": 8}
    # Utilization is a share of the container's requests, which are set.
    assert proxy_container(pod_spec(deployment))["resources"]["requests"]["cpu"]
    # The disruption budget counts against the current scale and selects the scaled pods.
    pdb = find(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": pdb["spec"]["selector"]["matchLabels"]},
    }
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert_valid(kubernetes_validate, docs, tmp_path)
    _, _, data = proxy_config(docs)
    result = check_config(data, tmp_path)
    assert result.returncode == 0, result.stderr


def test_autoscaler_memory_target_and_behavior(helm: str, kubernetes_validate: str, tmp_path: Path) -> None:
    docs = docs_of(
        render(
            helm,
            None,
            *AUTOSCALING,
            "gateway.autoscaling.targetMemoryUtilizationPercentage=80",
            "gateway.autoscaling.behavior.scaleDown.stabilizationWindowSeconds=600",
            "gateway.autoscaling.behavior.scaleDown.policies[0].type=Pods",
            "gateway.autoscaling.behavior.scaleDown.policies[0].value=1",
            "gateway.autoscaling.behavior.scaleDown.policies[0].periodSeconds=120",
        )
    )
    spec = find(docs, "HorizontalPodAutoscaler")["spec"]
    assert [
        (m["resource"]["name"], m["resource"]["target"]["averageUtilization"]) for m in spec["metrics"]
    ] == [
        ("cpu", 70),
        ("memory", 80),
    ]
    assert spec["behavior"] == {
        "scaleDown": {
            "stabilizationWindowSeconds": 600,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
        }
    }
    assert_valid(kubernetes_validate, docs, tmp_path)
    # Neither target: no metrics, which Kubernetes takes as 80% CPU.
    bare = docs_of(
        render(helm, None, *AUTOSCALING, "gateway.autoscaling.targetCPUUtilizationPercentage=null")
    )
    assert "metrics" not in find(bare, "HorizontalPodAutoscaler")["spec"]


def test_no_autoscaler_unless_enabled_nor_in_sidecar_mode(helm: str) -> None:
    assert "HorizontalPodAutoscaler" not in kinds(docs_of(render(helm, None)))
    sidecar = docs_of(render(helm, SIDECAR, "gateway.autoscaling.enabled=true"))
    assert "HorizontalPodAutoscaler" not in kinds(sidecar)
    assert cluster_quotas(sidecar) is None


@pytest.mark.parametrize(
    ("sets", "complaint"),
    [
        (
            ("gateway.autoscaling.minReplicas=5", "gateway.autoscaling.maxReplicas=3"),
            "minReplicas (5) must not be more than maxReplicas (3)",
        ),
        (("gateway.autoscaling.minReplicas=0",), "/gateway/autoscaling/minReplicas"),
        (("gateway.autoscaling.maxReplicas=0",), "/gateway/autoscaling/maxReplicas"),
        (("gateway.autoscaling.maxReplicas=20000",), "/gateway/autoscaling/maxReplicas"),
        (("gateway.autoscaling.targetCPU=50",), "additional properties 'targetCPU' not allowed"),
        (("gateway.autoscaling.targetCPUUtilizationPercentage=0",), "targetCPUUtilizationPercentage"),
        (("gateway.autoscaling.behavior.scaleup.selectPolicy=Max",), "'scaleup' not allowed"),
        (("gateway.autoscaling.enabled=yes",), "/gateway/autoscaling/enabled"),
        (("resources.requests=null",), "needs resources.requests.cpu"),
        (
            ("gateway.autoscaling.targetMemoryUtilizationPercentage=80", "resources.requests.memory=null"),
            "needs resources.requests.memory",
        ),
        (("extraEnv[0].name=KTHROTTLE_POD_IP", "extraEnv[0].value=10.0.0.1"), "/extraEnv/0/name"),
    ],
    ids=[
        "min-above-max",
        "min-zero",
        "max-zero",
        "max-too-large",
        "misspelt-key",
        "zero-percent",
        "misspelt-behavior",
        "enabled-not-boolean",
        "no-cpu-request",
        "no-memory-request",
        "pod-ip-taken",
    ],
)
def test_malformed_autoscaling_values_are_refused(helm: str, sets: tuple[str, ...], complaint: str) -> None:
    enable = () if any(s.startswith("extraEnv") for s in sets) else ("gateway.autoscaling.enabled=true",)
    assert complaint in helm_fails(helm, *enable, *sets)


def test_min_equal_to_max_is_a_fixed_size_autoscaler(helm: str) -> None:
    docs = docs_of(
        render(
            helm,
            None,
            "gateway.autoscaling.enabled=true",
            "gateway.autoscaling.minReplicas=4",
            "gateway.autoscaling.maxReplicas=4",
        )
    )
    spec = find(docs, "HorizontalPodAutoscaler")["spec"]
    assert spec["minReplicas"] == spec["maxReplicas"] == 4
    assert cluster_quotas(docs) == {"enabled": True, "replicas": 4}


# ---- reaching the other replicas ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "kind"),
    [(None, "Deployment"), (GATEWAY, "Deployment"), (SNI_TLS, "Deployment"), (SIDECAR, "StatefulSet")],
    ids=["default", "gateway", "gateway-sni-tls", "sidecar"],
)
def test_every_proxy_pod_knows_its_ip_and_serves_admin_on_it(
    helm: str, values: Path | None, kind: str
) -> None:
    docs = docs_of(render(helm, values, "config.admin.host=127.0.0.1"))
    container = proxy_container(pod_spec(find(docs, kind)))
    env = {e["name"]: e for e in container["env"]}
    assert env["KTHROTTLE_POD_IP"] == {
        "name": "KTHROTTLE_POD_IP",
        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    # The other replicas reach the admin port on that IP: the chart binds it to every address,
    # even over a config.admin.host of the user's, and the container declares the port.
    config, _, _ = proxy_config(docs)
    assert config["admin"]["host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["admin"] == config["admin"]["port"]


# ---- what the install says ---------------------------------------------------------------------


def test_notes_say_whether_quotas_are_shared(helm: str) -> None:
    shared = notes(helm, "gateway.replicas=3")
    assert "Quotas are shared across the 3 replicas (cluster_quotas)" in shared
    assert "each one enforces quota / 3" in shared
    scaled = notes(helm, *AUTOSCALING)
    assert "shared across the 2 to 8 replicas (HorizontalPodAutoscaler rel-kthrottle" in scaled
    assert "each one enforces quota / 8" in scaled
    single = notes(helm, "gateway.replicas=1")
    assert "One replica: it enforces every quota by itself, nothing to share." in single
    assert "shared across" not in single
    off = notes(helm, "gateway.replicas=3", "config.cluster_quotas.enabled=false")
    assert "Quotas are NOT shared across the replicas (config.cluster_quotas.enabled is false)" in off
    sidecar = notes(helm, "mode=sidecar")
    assert "shared across" not in sidecar and "One replica" not in sidecar
