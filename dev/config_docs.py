"""Writes docs/config.md, the config reference, from the pydantic models that validate the config.

Every key's path, type, bounds, default and description come from the models themselves
(``proxy/config.py``, ``quota/config.py``, ``quota/volume_config.py``; descriptions are the fields'
docstrings), so the page cannot drift from what the proxy accepts: ``tests/unit/test_config_docs.py``
fails when the page is stale, when a key has no description, or when an example below no longer
loads.

Usage: python dev/config_docs.py            # write docs/config.md
       python dev/config_docs.py --check    # exit 1 if docs/config.md is not what this writes
"""

from __future__ import annotations

import argparse
import difflib
import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import annotated_types
import yaml
from pydantic import AliasChoices, BaseModel
from pydantic.fields import FieldInfo

from proxy.config import ProxyConfig, _QuotasFile
from proxy.reload import _RESTART_ONLY

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "config.md"

# Gateway mode needs its upstream brokers: the examples below are fragments of a config file, and
# each is checked as a whole file with this added (unless it gives mode, gateway or sidecar).
EXAMPLE_BASE = "gateway: {upstream_bootstrap: [broker-1:9092]}\n"

# One example per section, each checked by the real loader (tests/unit/test_config_docs.py).
EXAMPLES: dict[str, str] = {
    "": """\
mode: gateway                 # or sidecar
bind_host: 0.0.0.0
advertised_host: kafka-proxy.example.com   # what clients are told to connect to
gateway:
  bootstrap_port: 9092
  broker_port_base: 9100      # broker node N is reachable at port 9100 + N ...
  broker_ports: {}            # ... unless given here explicitly, e.g. {1: 19001}
  upstream_bootstrap: ["broker-1:9092", "broker-2:9092"]
max_frame_bytes: 104857600    # like the broker's socket.request.max.bytes
connect_timeout_seconds: 10
client_frame_timeout_seconds: 60   # a request still incomplete this long closes it (slowloris); null: off
drain_seconds: 10             # on SIGTERM: stop accepting, let in-flight requests finish
metadata_refresh_seconds: 30
admin: {host: 127.0.0.1, port: 9644}
log_level: INFO
""",
    "gateway": """\
gateway:
  bootstrap_port: 9093
  upstream_bootstrap: ["broker-1:9092", "broker-2:9092"]
  sni:
    enabled: true
    bootstrap_host: kafka.example.com            # clients bootstrap with kafka.example.com:9093
    broker_host_template: "b{node_id}.kafka.example.com"
    advertised_port: 443                         # optional: the port clients are told (a load balancer's)
tls:                                             # SNI needs TLS on the listeners
  enabled: true
  certfile: /etc/kthrottle/tls/server/tls.crt
  keyfile: /etc/kthrottle/tls/server/tls.key
""",
    "sidecar": """\
mode: sidecar
sidecar: {listen_port: 9092, upstream: "127.0.0.1:9093", advertised_host: null}
""",
    "admin": """\
admin:
  host: 127.0.0.1            # default: loopback only
  port: 9644
  token_file: /etc/kthrottle/admin-token   # read at start and again whenever it changes
  allow_unauthenticated_changes: false
""",
    "tls": """\
tls:                          # the client-facing listeners
  enabled: true
  certfile: /etc/kthrottle/tls/server/tls.crt   # PEM: the proxy's certificate (chain) ...
  keyfile: /etc/kthrottle/tls/server/tls.key    # ... and its key (key_password_file: if encrypted)
  cafile: /etc/kthrottle/tls/server/ca.crt      # CA of client certificates
  client_auth: required       # none | requested | required (Kafka's ssl.client.auth)
  principal_mapping_rules:    # Kafka's ssl.principal.mapping.rules, one rule per item
    - "RULE:^CN=([^,]+),OU=clients,.*$/$1/L"
    - DEFAULT
  min_version: TLSv1.2
  reload_check_seconds: 5     # certificate files are re-read when they change on disk
""",
    "upstream_tls": """\
upstream_tls:                 # the proxy's connections to the brokers
  enabled: true
  cafile: /etc/kthrottle/tls/upstream/ca.crt
  certfile: /etc/kthrottle/tls/upstream/tls.crt # for brokers with ssl.client.auth=required
  keyfile: /etc/kthrottle/tls/upstream/tls.key
  check_hostname: true
""",
    "client_sasl": """\
client_sasl:                  # how OAUTHBEARER and GSSAPI logins are named
  oauthbearer_sub_claim: sub
  principal_mapping_rules: ["RULE:([^\\\\/@]*)(\\\\/.*)?@EXAMPLE.COM/$1/L", DEFAULT]
""",
    "upstream_sasl": """\
upstream_sasl: {username: kthrottle, password_file: /etc/kthrottle/password, mechanism: SCRAM-SHA-512}
""",
    "proxy_protocol": """\
proxy_protocol:               # off unless listeners are named
  listeners: [bootstrap, brokers]   # bootstrap (with gateway.sni: the one TLS port), brokers
                                    # (every per-broker port), sidecar, or all
  trusted_sources: [10.0.0.0/16]    # the load balancers' addresses (CIDRs or single addresses)
""",
    "quotas": """\
quotas:
  window: {num: 11, size_seconds: 1}   # quota.window.num / quota.window.size.seconds
  produce_shaping: steady              # or kafka
  max_throttle_ms: 5000                # no byte-rate throttle longer; the rest stays owed
  exempt: {users: [replicator], client_ids: [ops-admin], source_cidrs: [10.20.0.0/16]}
  client_id_prefixes:                  # generated client ids sharing one bucket
    app-: {producer_byte_rate: 1048576}
  groups:
    etl: {users: [loader, backfill], consumer_byte_rate: 8388608}
  users:
    alice:
      producer_byte_rate: 1048576      # /config/users/alice
      clients:
        app-1: {consumer_byte_rate: 2097152}   # /config/users/alice/clients/app-1
    <default>: {producer_byte_rate: 4194304, producer_ids_rate: 10}
  clients:
    <default>: {controller_mutation_rate: 2, request_percentage: 50}
  topics:                              # KIP-1010: a rate per partition of the topic
    orders: {producer.byte.rate: 2097152, consumer.byte.rate: 4194304}
  ips:                                 # KIP-612 connection_creation_rate per client IP
    <default>: {connection_creation_rate: 20}
""",
    "capture": """\
capture:
  enabled: true
  sink: kafka                    # default: files
  instance: proxy-a              # also the message key: one proxy's records stay in order
  kafka:
    topic: __kthrottle_capture
    bootstrap_servers: [10.0.0.1:9092]   # default: the proxy's upstream brokers
    retention_ms: 604800000
""",
    "exchange": """\
exchange: {security_protocol: SSL, ssl_cafile: /etc/kthrottle/tls/upstream/ca.crt}
""",
    "volume": """\
volume:
  enabled: true
  soft_limit: {type: MinFreePercentage, value: 10}   # ConsumedSpace | MinFreeBytes | MinFreePercentage
  hard_limit: {type: MinFreePercentage, value: 5}
  volumes: {/var/lib/kafka/data-1: {hard_limit: {type: MinFreeBytes, value: 10737418240}}}
  source: {type: describe_log_dirs}    # gateway: asks every broker (DescribeLogDirs v4, KIP-827)
  # source: {type: statvfs, log_dirs: [/var/lib/kafka/data], broker_id: 1}   # sidecar
""",
    "cluster_quotas": """\
cluster_quotas:
  enabled: true                      # the chart sets it for more than one gateway replica
  replicas: 3                        # each holds quota / replicas until the exchange has told how many run
""",
    "quota_api": """\
quota_api:
  mode: proxy                 # proxy | forward (default) | both
  admins: ["User:admin"]      # may alter; "User:*" for everyone; default: nobody
""",
}

# The quotas file (``quotas_file``) and the main file that names it; checked with load_config.
QUOTAS_FILE_EXAMPLE = """\
# quotas.yaml
quotas:
  clients:
    reporting: {consumer_byte_rate: 1048576}
    <default>: {producer_byte_rate: 8388608}
"""
QUOTAS_FILE_MAIN = "quotas_file: quotas.yaml         # beside kthrottle.yaml\n"

# What a map's keys stand for, by the key of the map (default: <name>).
_PLACEHOLDERS = {
    "users": "<user>",
    "clients": "<client-id>",
    "topics": "<topic>",
    "ips": "<ip>",
    "volumes": "<volume>",
    "broker_ports": "<node-id>",
}

_NONE = type(None)


@dataclass(frozen=True)
class Row:
    """One key of the reference: where it is, what it takes, its default, what it does."""

    path: str
    type: str
    default: str
    description: str
    also: tuple[str, ...] = ()
    """Other spellings the loader accepts for this key."""
    older: bool = False
    """Whether those are older names (kept so old files still load) rather than equals."""


def _optional(annotation: Any) -> tuple[Any, bool]:
    """The annotation without None, and whether None was allowed."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        rest = [a for a in args if a is not _NONE]
        if len(rest) < len(args):
            inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
            return inner, True
    return annotation, False


def _model(annotation: Any) -> type[BaseModel] | None:
    return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None


def _type_name(annotation: Any) -> str:
    """A reader's name for a type: ``"steady" | "kafka"``, ``list[str]``, ``map str -> mapping``."""
    annotation, nullable = _optional(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:  # a checked key or value: its base type (the check is described)
        return _type_name(args[0] if not nullable else args[0] | None)
    if origin is typing.Literal:
        name = " | ".join(f'"{a}"' for a in args)
    elif inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        name = " | ".join(f'"{m.value}"' for m in annotation)
    elif origin in (typing.Union, types.UnionType):
        parts = {_type_name(a) for a in args}
        name = "number" if parts == {"int", "float"} else " | ".join(_type_name(a) for a in args)
    elif origin is list:
        name = f"list[{_type_name(args[0])}]"
    elif origin is dict:
        name = f"map {_type_name(args[0])} -> {_type_name(args[1])}"
    elif _model(annotation) is not None:
        name = "mapping"
    elif annotation is Path:
        name = "path"
    else:
        name = getattr(annotation, "__name__", str(annotation))
    return f"{name} or null" if nullable else name


def _bounds(field: FieldInfo, is_list: bool) -> list[str]:
    """The field's constraints, as a reader writes them: ``> 0``, ``<= 10``, ``at least 1 item``."""
    out = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Gt):
            out.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Ge):
            out.append(f">= {item.ge}")
        elif isinstance(item, annotated_types.Lt):
            out.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.Le):
            out.append(f"<= {item.le}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length == 1 and not is_list:
            out.append("not empty")
        elif isinstance(item, annotated_types.MinLen):
            out.append(
                f"at least {item.min_length} item{'s' * (item.min_length != 1)}"
                if is_list
                else f"at least {item.min_length} characters"
            )
        elif getattr(item, "pattern", None):
            out.append(f"matching {item.pattern}")
    return out


def field_type(field: FieldInfo) -> str:
    """The type and its bounds, e.g. ``float > 0, <= 10`` or ``int >= 1, or null``."""
    inner, nullable = _optional(field.annotation)
    bounds = _bounds(field, typing.get_origin(inner) is list)
    name = _type_name(inner)
    if bounds:
        sep = " " if bounds[0][0] in "<>" else ", "
        name = f"{name}{sep}{', '.join(bounds)}"
    return f"{name}, or null" if nullable and bounds else f"{name} or null" if nullable else name


def _flow(value: Any) -> str:
    """A value as YAML flow style, on one line."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def _plain(value: Any) -> Any:
    """A default as the YAML a user would write."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def _size(value: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f" ({value // size} {unit})"
    return ""


def field_default(name: str, field: FieldInfo) -> str:
    """The default as YAML, "required", or "the keys' defaults" for a section left as it is."""
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        try:
            fresh = type(value)()
        except Exception:  # a model with required keys: its default is spelled out
            fresh = None
        if fresh == value:
            return "each key's default"
    text = '`""`' if value == "" else f"`{_flow(_plain(value))}`"
    if isinstance(value, int) and not isinstance(value, bool) and "bytes" in name:
        text += _size(value)
    return text


def _key_and_also(name: str, field: FieldInfo, populate_by_name: bool) -> tuple[str, tuple[str, ...]]:
    """The key to write, and the other spellings the loader accepts (older names, Kafka's)."""
    if field.alias is not None and field.alias != name:
        return field.alias, (name,) if populate_by_name else ()
    if isinstance(field.validation_alias, AliasChoices):
        names = [c for c in field.validation_alias.choices if isinstance(c, str)]
        key = name if name in names else names[0]
        return key, tuple(n for n in names if n != key)
    return name, ()


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[Row]:
    """Every key of a model, depth first, with its full path (maps as <placeholder>)."""
    populate = bool(model.model_config.get("populate_by_name"))
    for name, field in model.model_fields.items():
        key, also = _key_and_also(name, field, populate)
        path = f"{prefix}{key}"
        older = isinstance(field.validation_alias, AliasChoices)
        yield Row(path, field_type(field), field_default(name, field), field.description or "", also, older)
        inner, _ = _optional(field.annotation)
        nested = _model(inner)
        if nested is not None:
            yield from rows(nested, f"{path}.")
        elif typing.get_origin(inner) is dict:
            value = _model(typing.get_args(inner)[1])
            if value is not None:
                yield from rows(value, f"{path}.{_PLACEHOLDERS.get(key, '<name>')}.")


def sections() -> list[tuple[str, str, type[BaseModel] | None]]:
    """The page's sections: the top-level keys, then each section of the file (key, title, model)."""
    out: list[tuple[str, str, type[BaseModel] | None]] = [("", "Top-level keys", None)]
    for name, field in ProxyConfig.model_fields.items():
        nested = _model(_optional(field.annotation)[0])
        if nested is not None:
            out.append((name, f"`{name}`", nested))
    return out


def missing_descriptions() -> list[str]:
    """Paths of keys without a description (the test refuses them)."""
    every = [*rows(ProxyConfig), *rows(_QuotasFile)]
    return sorted({r.path for r in every if not r.description.strip()})


def _markdown(text: str) -> str:
    """A docstring on one line for a table cell or a paragraph: ``code`` as `code`, pipes and
    angle brackets outside code escaped."""
    text = " ".join(inspect.cleandoc(text).split()).replace("``", "`")
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def _doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    if not doc:
        return ""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(doc))
    return "\n\n".join(_markdown(p) for p in paragraphs) + "\n\n"


def _table(items: list[Row]) -> str:
    lines = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for r in items:
        what = _markdown(r.description)
        if r.also:
            spelled = ", ".join(f"`{a}`" for a in r.also)
            what += (
                f" Deprecated name, still accepted: {spelled}." if r.older else f" Also accepted: {spelled}."
            )
        typ = r.type.replace("|", "\\|")
        lines.append(f"| `{r.path}` | `{typ}` | {r.default} | {what} |")
    return "\n".join(lines) + "\n\n"


def _example(text: str) -> str:
    return f"Example:\n\n```yaml\n{text}```\n\n"


def _reload(key: str) -> str:
    """Whether a reload applies the section (proxy/reload.py's list of restart-only settings)."""
    if key in _RESTART_ONLY:
        return "A change to this section needs a restart: a reload reports it and applies none of it.\n\n"
    return ""


def generate() -> str:
    """The whole page."""
    out = [
        "# Config reference\n\n",
        "<!-- Generated by dev/config_docs.py from the config models; do not edit by hand. -->\n\n",
        "Every key of `kthrottle.yaml`, generated by `python dev/config_docs.py` from the pydantic "
        "models that validate it (`proxy/config.py`, `quota/config.py`, `quota/volume_config.py`; "
        "each description is the field's docstring there). `tests/unit/test_config_docs.py` fails "
        "when this page differs from what the models say, and loads every example below with the "
        "proxy's own loader. `kthrottle check-config FILE` validates a file: errors name file:line "
        "and the key's path. Unknown keys are refused.\n\n",
        "Types: `mapping` is a section of its own (its keys follow); `map K -> V` is a mapping whose "
        "keys you choose (`<user>`, `<topic>`, ... in the paths; `<default>` is Kafka's default "
        "entity); `path` is a file name; bounds are the values accepted. Examples are fragments of "
        "the file: with `gateway.upstream_bootstrap`, which every gateway config needs, each is a "
        "whole config.\n\n",
        "Sections: "
        + ", ".join(f"[{title.strip('`')}](#{_slug(title)})" for _, title, _ in sections())
        + ", [the quotas file](#the-quotas-file).\n\n",
    ]
    for key, title, model in sections():
        out.append(f"## {title}\n\n")
        if model is None:
            out.append(_doc(ProxyConfig))
            top = [r for r in rows(ProxyConfig) if "." not in r.path]
            out.append(_table(top))
        else:
            out.append(_doc(model))
            out.append(_reload(key))
            out.append(
                _table([r for r in rows(ProxyConfig) if r.path == key or r.path.startswith(f"{key}.")])
            )
        out.append(_example(EXAMPLES[key]))
    out.append("## The quotas file\n\n")
    out.append(
        "`quotas_file` names a file of its own for the quotas (as `kthrottle tune` writes it), "
        "relative to the main config file's directory. It holds one key, `quotas`, with exactly the "
        "keys of the main file's [`quotas`](#quotas) section; the proxy watches both files and "
        "reloads either when it changes. A config gives its quotas inline or in `quotas_file`, not "
        "both: the loader (`proxy.config.load_config`) refuses a main file with both.\n\n"
    )
    out.append(_table([r for r in rows(_QuotasFile) if "." not in r.path]))
    out.append(f"Example, with `{QUOTAS_FILE_MAIN.split('#')[0].strip()}` in the main file:\n\n")
    out.append(f"```yaml\n{QUOTAS_FILE_EXAMPLE}```\n")
    return "".join(out)


def _slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = title.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def example_config(key: str) -> str:
    """An example as a whole config file, as the tests load it."""
    text = EXAMPLES[key]
    data = yaml.safe_load(text) or {}
    if {"mode", "gateway", "sidecar"} & set(data):
        return text
    return EXAMPLE_BASE + text


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is stale")
    args = parser.parse_args()
    page = generate()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            diff = difflib.unified_diff(
                current.splitlines(), page.splitlines(), "docs/config.md", "generated", lineterm="", n=1
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
            sys.exit("docs/config.md is stale (the config models changed): run python dev/config_docs.py")
        print("docs/config.md is up to date")
        return
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
