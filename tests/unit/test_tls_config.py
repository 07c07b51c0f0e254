"""TLS settings: validation at load, SNI names, and certificate files reloaded when they change."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest

from dev.certs import CertificateAuthority
from proxy.config import ConfigError, ListenerTls, SniConfig, parse_config
from proxy.net.tls import ListenerTlsContext, ReloadingContext, TlsConfigError, server_context

GATEWAY = "gateway: {upstream_bootstrap: ['127.0.0.1:9092']}\n"


def test_sni_names_map_to_nodes() -> None:
    sni = SniConfig(
        enabled=True, bootstrap_host="kafka.example.com", broker_host_template="b{node_id}.kafka.example.com"
    )
    assert sni.broker_host(7) == "b7.kafka.example.com"
    assert sni.broker_node("b7.kafka.example.com") == 7
    assert sni.broker_node("B12.Kafka.Example.com.") == 12
    assert sni.broker_node("bx.kafka.example.com") is None
    assert sni.broker_node("b.kafka.example.com") is None
    assert sni.broker_node("kafka.example.com") is None
    assert sni.broker_node("b7.kafka.example.org") is None


def test_sni_needs_tls_and_names() -> None:
    text = (
        "gateway: {upstream_bootstrap: ['127.0.0.1:9092'], sni: {enabled: true, bootstrap_host: k.example,"
        " broker_host_template: 'b{node_id}.k.example'}}\n"
    )
    with pytest.raises(ConfigError, match=r"gateway\.sni needs tls\.enabled"):
        parse_config(text)
    bad = "gateway: {upstream_bootstrap: ['127.0.0.1:9092'], sni: {enabled: true, bootstrap_host: k}}\n"
    with pytest.raises(
        ConfigError, match=r":1: gateway.sni: .*broker_host_template must contain \{node_id\}"
    ):
        parse_config(bad)


def test_listener_tls_validation_names_the_line() -> None:
    text = GATEWAY + "tls:\n  enabled: true\n  certfile: /x.crt\n  keyfile: /x.key\n  client_auth: required\n"
    with pytest.raises(ConfigError, match=r":2: tls: .*client_auth required needs cafile"):
        parse_config(text)
    with pytest.raises(ConfigError, match=r"tls\.enabled needs certfile"):
        parse_config(GATEWAY + "tls: {enabled: true}\n")
    with pytest.raises(ConfigError, match="invalid rule"):
        parse_config(
            GATEWAY + "tls: {enabled: true, certfile: a, keyfile: b, principal_mapping_rules: ['RULE:x']}\n"
        )
    with pytest.raises(ConfigError, match="certfile and keyfile together"):
        parse_config(GATEWAY + "upstream_tls: {enabled: true, certfile: a}\n")


def test_missing_files_refused_at_start_with_their_names(tmp_path: Path) -> None:
    cfg = ListenerTls(enabled=True, certfile=tmp_path / "none.crt", keyfile=tmp_path / "none.key")
    with pytest.raises(TlsConfigError, match=r"none\.crt"):
        ListenerTlsContext(cfg)


def test_changed_files_reload_and_bad_ones_keep_the_last_good(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    first = ca.issue("server", "proxy-1", dns=("localhost",))
    cfg = ListenerTls(enabled=True, certfile=first.cert, keyfile=first.key, reload_check_seconds=5)
    now = [0.0]
    reloading = ReloadingContext(cfg, server_context, "test", clock=lambda: now[0])
    original = reloading.current()

    ca.issue("server", "proxy-2", dns=("localhost",))  # rewrites both files
    assert reloading.current() is original  # not looked at again before reload_check_seconds
    now[0] = 5.0
    rotated = reloading.current()
    assert rotated is not original and reloading.reloads == 1

    first.key.write_text("not a key")  # a half-written rotation
    os.utime(first.key, ns=(1, 1))
    now[0] = 10.0
    assert reloading.current() is rotated
    now[0] = 20.0
    assert reloading.current() is rotated and reloading.reloads == 1  # logged once, not retried

    ca.issue("server", "proxy-3", dns=("localhost",))
    now[0] = 30.0
    assert reloading.current() is not rotated and reloading.reloads == 2


def test_proxy_own_clients_use_upstream_tls(tmp_path: Path) -> None:
    """The state exchange (aiokafka) and the capture sink (kafka-python) reach TLS brokers with
    the upstream TLS settings, with SASL on top when the proxy has a login."""
    from proxy.capture.kafka_sink import security
    from proxy.shared.exchange import ExchangeSettings

    ca = CertificateAuthority(tmp_path / "ca")
    own = ca.issue("proxy", "kthrottle-proxy")
    text = GATEWAY + (
        f"upstream_tls: {{enabled: true, cafile: {ca.cert_path}, certfile: {own.cert}, keyfile: {own.key}}}\n"
    )
    cfg = parse_config(text)
    exchange = ExchangeSettings.of(cfg)
    assert exchange.client_kwargs["security_protocol"] == "SSL"
    assert isinstance(exchange.client_kwargs["ssl_context"], ssl.SSLContext)
    assert security(cfg)["security_protocol"] == "SSL" and "ssl_context" in security(cfg)
    with_login = parse_config(text + "upstream_sasl: {username: kthrottle, password: pw}\n")
    assert ExchangeSettings.of(with_login).client_kwargs["security_protocol"] == "SASL_SSL"
    assert security(with_login)["security_protocol"] == "SASL_SSL"
    assert security(parse_config(GATEWAY)) == {"security_protocol": "PLAINTEXT"}


def test_upstream_trusts_the_ca_file_alone(tmp_path: Path) -> None:
    """As Kafka's truststore: with a cafile, the system's CAs are not trusted besides it."""
    from proxy.config import UpstreamTls
    from proxy.net.tls import client_context

    ca = CertificateAuthority(tmp_path / "ca")
    only = client_context(UpstreamTls(enabled=True, cafile=ca.cert_path))
    assert [c["subject"] for c in only.get_ca_certs()] == [((("commonName", "kthrottle test CA"),),)]
    assert only.verify_mode == ssl.CERT_REQUIRED and only.check_hostname
    system = client_context(UpstreamTls(enabled=True))
    assert system.verify_mode == ssl.CERT_REQUIRED
