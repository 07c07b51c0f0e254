"""Chart values that fail early or work (issue 30): what has no sane default is required, config
sections a user sets are merged with the chart's (not dropped), a LoadBalancer without the name
outside clients use is refused, and capture to files fits the volume it gets, on an image that can
write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.test_helm_chart import (
    GATEWAY,
    REQUIRED,
    check_config,
    docs_of,
    helm_template,
    proxy_config,
    render,
)


def test_the_defaults_alone_are_refused_naming_the_one_required_value(helm: str) -> None:
    result = helm_template(helm, None)
    assert result.returncode != 0
    assert "gateway.upstreamBootstrap is required" in result.stderr
    assert helm_template(helm, None, "mode=sidecar").returncode == 0  # a sidecar needs no bootstrap


def test_a_load_balancer_without_the_name_outside_clients_use_is_refused(helm: str) -> None:
    result = helm_template(helm, REQUIRED, "gateway.service.type=LoadBalancer")
    assert result.returncode != 0 and "needs gateway.advertisedHost" in result.stderr
    ok = render(
        helm, REQUIRED, "gateway.service.type=LoadBalancer", "gateway.advertisedHost=kafka.example.com"
    )
    config, _, _ = proxy_config(docs_of(ok))
    assert config["advertised_host"] == "kafka.example.com"


def test_config_sections_the_user_sets_are_merged_not_dropped(helm: str, tmp_path: Path) -> None:
    sets = (
        "tls.enabled=true",
        "tls.secretName=proxy-tls",
        "config.tls.min_version=TLSv1.3",
        "upstreamTls.enabled=true",
        "upstreamTls.secretName=upstream-tls",
        "config.upstream_tls.min_version=TLSv1.3",
        "gateway.sni.enabled=true",
        "config.gateway.sni.advertised_port=443",  # behind a load balancer listening on 443
    )
    config, _, data = proxy_config(docs_of(render(helm, REQUIRED, *sets)))
    assert config["tls"]["min_version"] == "TLSv1.3" and config["tls"]["certfile"].endswith("tls.crt")
    assert config["upstream_tls"]["min_version"] == "TLSv1.3"
    assert config["upstream_tls"]["cafile"].endswith("ca.crt")
    assert config["gateway"]["sni"]["advertised_port"] == 443 and config["gateway"]["sni"]["enabled"] is True
    assert config["gateway"]["bootstrap_port"] == 9092  # the chart's own keys still win
    assert "advertised_port" in data["kthrottle.yaml"]


def test_capture_to_files_needs_an_image_that_can_write_them(helm: str) -> None:
    result = helm_template(helm, REQUIRED, "config.capture.enabled=true")
    assert result.returncode != 0 and "KTHROTTLE_EXTRAS=capture" in result.stderr
    kafka_sink = render(helm, REQUIRED, "config.capture.enabled=true", "config.capture.sink=kafka")
    assert proxy_config(docs_of(kafka_sink))[0]["capture"]["sink"] == "kafka"


@pytest.mark.parametrize(("size_limit", "files"), [("1Gi", 12), ("10Gi", 128), ("512Mi", 6)])
def test_capture_files_kept_fit_the_data_volume(helm: str, size_limit: str, files: int) -> None:
    sets = ("image.captureExtra=true", "config.capture.enabled=true", f"dataVolume.sizeLimit={size_limit}")
    capture = proxy_config(docs_of(render(helm, REQUIRED, *sets)))[0]["capture"]
    assert (capture["max_file_bytes"], capture["retention_files"]) == (64 * 1024 * 1024, files)
    too_many = helm_template(helm, REQUIRED, *sets, "config.capture.retention_files=1000")
    assert too_many.returncode != 0 and "more than 80% of dataVolume.sizeLimit" in too_many.stderr


def test_the_ci_gateway_values_still_render_a_config_the_proxy_accepts(helm: str, tmp_path: Path) -> None:
    _config, _quotas, data = proxy_config(docs_of(render(helm, GATEWAY)))
    result = check_config(data, tmp_path)
    # Capture to files needs pyarrow here as in the image: the test venv has it.
    assert result.returncode == 0, result.stderr
