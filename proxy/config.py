"""The proxy's YAML config: one file, validated at load, errors that name the line and the field."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from protocol.frames import DEFAULT_MAX_FRAME_BYTES
from quota.config import QuotaConfig


class ConfigError(ValueError):
    """A config the proxy refuses; the message names the file, line and field."""


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port")
    return host.strip("[]"), int(port)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdminConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(9644, ge=0, le=65535)
    enabled: bool = True


class GatewayConfig(Strict):
    """A bootstrap port plus one port per broker node (a fixed map, else base_port + node_id)."""

    bootstrap_port: int = Field(9092, ge=0, le=65535)
    broker_port_base: int | None = Field(9100, ge=0, le=65535)
    broker_ports: dict[int, int] = Field(default_factory=dict)
    upstream_bootstrap: list[str] = Field(min_length=1)

    @field_validator("upstream_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: list[str]) -> list[str]:
        for item in value:
            _host_port(item)
        return value

    @model_validator(mode="after")
    def _ports_known(self) -> GatewayConfig:
        if self.broker_port_base is None and not self.broker_ports:
            raise ValueError("set broker_port_base or broker_ports so every broker node gets a proxy port")
        for node, port in self.broker_ports.items():
            if not 0 < port < 65536 or node < 0:
                raise ValueError(f"broker_ports entry {node}: {port} is not a node id and a port")
        return self

    def port_for(self, node_id: int) -> int | None:
        if node_id in self.broker_ports:
            return self.broker_ports[node_id]
        if self.broker_port_base is None:
            return None
        port = self.broker_port_base + node_id
        return port if port < 65536 else None


class SidecarConfig(Strict):
    """One listener in front of the broker in the same pod."""

    listen_port: int = Field(9092, ge=0, le=65535)
    upstream: str = "127.0.0.1:9093"
    # Host clients are told for this broker; None keeps the host the broker advertises.
    advertised_host: str | None = None

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        _host_port(value)
        return value


class UpstreamSasl(Strict):
    """The proxy's own login, for its broker discovery when the upstream listener needs SASL."""

    mechanism: Literal["PLAIN"] = "PLAIN"
    username: str = Field(min_length=1)
    password: str | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _one_password(self) -> UpstreamSasl:
        if (self.password is None) == (self.password_file is None):
            raise ValueError("give exactly one of password and password_file")
        return self

    def secret(self) -> str:
        if self.password is not None:
            return self.password
        assert self.password_file is not None
        return self.password_file.read_text(encoding="utf-8").strip()


class ProxyConfig(Strict):
    mode: Literal["gateway", "sidecar"] = "gateway"
    bind_host: str = "127.0.0.1"
    advertised_host: str = "127.0.0.1"
    gateway: GatewayConfig | None = None
    sidecar: SidecarConfig | None = None
    max_frame_bytes: int = Field(DEFAULT_MAX_FRAME_BYTES, ge=1024, le=2**31 - 1)
    connect_timeout_seconds: float = Field(10.0, gt=0, le=300)
    drain_seconds: float = Field(10.0, ge=0, le=600)
    metadata_refresh_seconds: float = Field(30.0, gt=0, le=3600)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    upstream_sasl: UpstreamSasl | None = None
    quotas: QuotaConfig = Field(default_factory=QuotaConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("bind_host")
    @classmethod
    def _check_bind(cls, value: str) -> str:
        if value not in ("localhost", "") and not value.replace(".", "").isalnum():
            try:
                ipaddress.ip_address(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not an address to bind") from exc
        return value

    @model_validator(mode="after")
    def _mode_section(self) -> ProxyConfig:
        if self.mode == "gateway" and self.gateway is None:
            raise ValueError("mode gateway needs a 'gateway' section with upstream_bootstrap")
        if self.mode == "sidecar" and self.sidecar is None:
            raise ValueError("mode sidecar needs a 'sidecar' section")
        return self


def upstream_addresses(cfg: ProxyConfig) -> list[tuple[str, int]]:
    if cfg.mode == "sidecar":
        assert cfg.sidecar is not None
        return [_host_port(cfg.sidecar.upstream)]
    assert cfg.gateway is not None
    return [_host_port(s) for s in cfg.gateway.upstream_bootstrap]


def _line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the YAML node at a pydantic error location, or of its nearest parent."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if str(k.value) == str(key):
                    nxt, line = v, k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def parse_config(text: str, source: str = "<config>") -> ProxyConfig:
    """Parse and validate; every problem is reported with file:line and the field's path."""
    try:
        root = yaml.compose(text)
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}:1: the config must be a mapping of settings")
    try:
        return ProxyConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            line = _line_of(root, loc)
            field = ".".join(str(p) for p in loc) or "(top level)"
            lines.append(f"{source}:{line if line is not None else '?'}: {field}: {err['msg']}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from exc


def load_config(path: str | Path) -> ProxyConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror}") from exc
    return parse_config(text, str(p))
