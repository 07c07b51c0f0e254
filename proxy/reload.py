"""Hot reload of the config file: quota changes apply without dropping a connection; a bad file
is refused with its line and reason, and the last good config stays in force."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from proxy.config import ConfigError, ProxyConfig, load_config, quotas_path
from proxy.net.brokers import backoff_bounds
from proxy.server import ProxyServer, cluster_wanted

log = logging.getLogger(__name__)

# Settings that need a restart: a change to them is reported, not applied.
_RESTART_ONLY = (
    "mode",
    "bind_host",
    "advertised_host",
    "gateway",
    "sidecar",
    "admin",
    "max_frame_bytes",
    "capture",
    "tls",  # the certificate files themselves reload when they change on disk
    "upstream_tls",
    "proxy_protocol",  # which listeners take the header, and from whom: fixed when they open
)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def apply(server: ProxyServer, new: ProxyConfig) -> list[str]:
    """Apply what can change live; returns the restart-only settings that differ."""
    old = server.cfg
    pending = [name for name in _RESTART_ONLY if getattr(old, name) != getattr(new, name)]
    # The quota API's overlay (alterations through Kafka's Admin API) stays on top of the file.
    quotas = server.quota_api.reload(new.quotas) if server.quota_api is not None else new.quotas
    server.enforcer.reconfigure(quotas)
    server.brokers.backoff.reconfigure(*backoff_bounds(new))
    if (old.quota_api.mode, old.quota_api.topic) != (new.quota_api.mode, new.quota_api.topic):
        pending.append("quota_api.mode/topic (takes effect at restart)")
    kept = new.quota_api.model_copy(update={"mode": old.quota_api.mode, "topic": old.quota_api.topic})
    new = new.model_copy(update={"quota_api": kept})
    if server.quota_api is not None:  # admins and describers apply at once
        server.quota_api.cfg = server.quota_api.cfg.model_copy(update={"quota_api": kept})
    if server.volume is not None:
        pending += server.volume.reconfigure(new)
    if server.cluster_quotas is not None:
        pending += server.cluster_quotas.reconfigure(new)
    elif cluster_wanted(new):
        log.info("cluster quotas turned on by the reload: starting the exchange")
        server.start_cluster_quotas(new)
    live = {k: getattr(new, k) for k in ProxyConfig.model_fields if k not in _RESTART_ONLY}
    server.cfg = old.model_copy(update=live)
    logging.getLogger().setLevel(new.log_level)
    return pending


def _signatures(server: ProxyServer, path: Path) -> tuple[tuple[int, int, int] | None, ...] | None:
    """The config file's signature and its quotas file's (if it names one); None if unreadable."""
    main = _signature(path)
    qpath = quotas_path(server.cfg, path)
    quotas = _signature(qpath) if qpath is not None else None
    if main is None or (qpath is not None and quotas is None):
        return None
    return (main, quotas)


async def watch(server: ProxyServer, path: Path, interval: float = 1.0) -> None:
    """Poll the config file and its quotas file (works with ConfigMap symlink swaps too) and
    reload on change."""
    seen = _signatures(server, path)
    while True:
        await asyncio.sleep(interval)
        current = _signatures(server, path)
        if current == seen or current is None:
            continue
        seen = current
        try:
            new = load_config(path)
        except ConfigError as exc:
            server.metrics.config_reloads.labels("rejected").inc()
            server.metrics.config_last_reload_ok.set(0)
            log.error("config reload refused, keeping the last good config: %s", exc)
            continue
        pending = apply(server, new)
        server.metrics.config_reloads.labels("applied").inc()
        server.metrics.config_last_reload_ok.set(1)
        server.metrics.config_restart_pending.set(len(pending))
        log.info("config reloaded from %s", path)
        if pending:
            log.warning("these settings changed but need a restart to apply: %s", ", ".join(pending))
