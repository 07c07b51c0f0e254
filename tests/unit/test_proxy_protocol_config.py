"""The ``proxy_protocol`` config section: off by default, opt-in per listener, trusted_sources
required and checked, listeners that the mode does not have refused with the file's line."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, parse_config

GATEWAY = "mode: gateway\ngateway:\n  upstream_bootstrap: [127.0.0.1:9092]\n"
SIDECAR = "mode: sidecar\nsidecar: {listen_port: 9092, upstream: '127.0.0.1:9093'}\n"


def test_off_by_default() -> None:
    cfg = parse_config(GATEWAY)
    assert cfg.proxy_protocol.listeners == []
    assert not any(cfg.proxy_protocol.applies_to(name) for name in ("bootstrap", "broker-1", "sidecar"))


def test_listeners_by_kind() -> None:
    pp = parse_config(
        GATEWAY
        + "proxy_protocol:\n  listeners: [brokers]\n  trusted_sources: [10.0.0.0/8, '2001:db8::/32']\n",
        "k.yaml",
    ).proxy_protocol
    assert pp.applies_to("broker-1") and pp.applies_to("broker-1001") and not pp.applies_to("bootstrap")
    every = parse_config(GATEWAY + "proxy_protocol: {listeners: [all], trusted_sources: [10.1.2.3]}\n")
    assert every.proxy_protocol.applies_to("bootstrap") and every.proxy_protocol.applies_to("broker-2")
    assert [str(n) for n in every.proxy_protocol.networks()] == ["10.1.2.3/32"]
    sidecar = parse_config(SIDECAR + "proxy_protocol: {listeners: [sidecar], trusted_sources: ['::/0']}\n")
    assert sidecar.proxy_protocol.applies_to("sidecar")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            GATEWAY + "proxy_protocol:\n  listeners: [bootstrap]\n",
            r"k\.yaml:4: proxy_protocol: .*need trusted_sources",
        ),
        (
            GATEWAY + "proxy_protocol:\n  listeners: [bootstrap]\n  trusted_sources: [10.0.0.5/8]\n",
            r"k\.yaml:6: proxy_protocol\.trusted_sources: .*'10\.0\.0\.5/8' is not an address or CIDR "
            r"network; the network is 10\.0\.0\.0/8",
        ),
        (
            GATEWAY + "proxy_protocol:\n  listeners: [bootstrap]\n  trusted_sources: [lb.example.com]\n",
            r"k\.yaml:6: proxy_protocol\.trusted_sources: .*'lb\.example\.com' is not an address",
        ),
        (
            GATEWAY + "proxy_protocol:\n  listeners: [bootstap]\n  trusted_sources: [10.0.0.0/8]\n",
            r"k\.yaml:5: proxy_protocol\.listeners\.0: "
            r"Input should be 'bootstrap', 'brokers', 'sidecar' or 'all'",
        ),
        (
            GATEWAY
            + "proxy_protocol:\n  listeners: [bootstrap, bootstrap]\n  trusted_sources: [10.0.0.0/8]\n",
            r"k\.yaml:5: proxy_protocol\.listeners: .*names a listener twice",
        ),
        (
            GATEWAY + "proxy_protocol:\n  listeners: [sidecar]\n  trusted_sources: [10.0.0.0/8]\n",
            r"k\.yaml:4: proxy_protocol: .*sidecar is the sidecar mode's listener",
        ),
        (
            SIDECAR + "proxy_protocol:\n  listeners: [brokers]\n  trusted_sources: [10.0.0.0/8]\n",
            r"k\.yaml:3: proxy_protocol: .*brokers is a gateway listener",
        ),
        (
            GATEWAY.replace(
                "  upstream_bootstrap",
                "  sni: {enabled: true, bootstrap_host: kafka.test,"
                " broker_host_template: 'b{node_id}.kafka.test'}\n"
                "  upstream_bootstrap",
            )
            + "tls: {enabled: true, certfile: a, keyfile: b}\n"
            + "proxy_protocol:\n  listeners: [brokers]\n  trusted_sources: [10.0.0.0/8]\n",
            r"k\.yaml:6: proxy_protocol: .*with gateway\.sni every broker is reached through the bootstrap",
        ),
    ],
)
def test_refused_with_the_line_and_the_reason(text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        parse_config(text, "k.yaml")


def test_a_reload_reports_it_as_needing_a_restart() -> None:
    """Listeners take or skip the header from their start (a broker's listener that opens later
    too): a changed section is reported, not applied."""
    from proxy.reload import apply
    from proxy.server import ProxyServer

    start = parse_config(
        GATEWAY + "proxy_protocol: {listeners: [bootstrap], trusted_sources: [10.0.0.0/8]}\n"
    )
    server = ProxyServer(start)
    changed = parse_config(GATEWAY + "proxy_protocol: {listeners: [all], trusted_sources: ['0.0.0.0/0']}\n")
    assert "proxy_protocol" in apply(server, changed)
    assert server.cfg.proxy_protocol == start.proxy_protocol
    assert server.proxy_protocol is not None
    assert server.proxy_protocol.applies_to("bootstrap") and not server.proxy_protocol.applies_to("broker-1")
    assert not server.proxy_protocol.trusts("192.0.2.1")
