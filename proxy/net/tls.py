"""TLS for both sides of the proxy: contexts built from PEM files and rebuilt when they change.

Client side: one listening context per server whose ``sni_callback`` runs in every handshake. It
swaps in the newest context built from the files (so a rotated certificate serves new
connections at once, without a restart and without touching open ones) and remembers the server
name the client asked for (SNI routing in gateway mode). After the handshake, the client's
certificate subject, mapped by Kafka's rules, is the connection's principal.

Upstream side: the context the proxy connects to brokers with, rebuilt the same way.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
import weakref
from collections.abc import Callable
from typing import Any

from proxy.config import ListenerTls, TlsFiles, UpstreamTls
from quota.keys import ANONYMOUS
from quota.principal_mapping import PrincipalMapper, distinguished_name, subject_of_certificate

log = logging.getLogger(__name__)

_SERVER_NAME = "_kthrottle_server_name"  # set on the SSLObject by the handshake callback
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class TlsConfigError(ValueError):
    """Certificate files that do not load: refused at start, with the file and the reason."""


def _password(files: TlsFiles) -> str | None:
    if files.key_password_file is None:
        return None
    from proxy.secrets import register  # the key password never reaches the log either

    return register(files.key_password_file.read_text(encoding="utf-8").strip())


def _load(context: ssl.SSLContext, files: TlsFiles) -> ssl.SSLContext:
    context.minimum_version = _VERSIONS[files.min_version]
    try:
        if files.certfile is not None and files.keyfile is not None:
            context.load_cert_chain(str(files.certfile), str(files.keyfile), _password(files))
        if files.cafile is not None:
            context.load_verify_locations(cafile=str(files.cafile))
    except (OSError, ssl.SSLError) as exc:
        paths = ", ".join(str(p) for p in (files.certfile, files.keyfile, files.cafile) if p is not None)
        raise TlsConfigError(f"TLS files {paths} do not load: {exc}") from exc
    return context


def server_context(cfg: ListenerTls) -> ssl.SSLContext:
    context = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cfg)
    context.verify_mode = _CLIENT_AUTH[cfg.client_auth]
    return context


def client_context(cfg: UpstreamTls) -> ssl.SSLContext:
    """Brokers are trusted by ``cafile`` alone when given (as Kafka's truststore: a public
    certificate for a broker's name is not enough), else by the system's CAs."""
    if cfg.cafile is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies chain and host name
    else:
        context = ssl.create_default_context()
    context.check_hostname = cfg.check_hostname
    return _load(context, cfg)


def _signature(files: TlsFiles) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for path in (files.certfile, files.keyfile, files.cafile, files.key_password_file):
        try:
            st = os.stat(path) if path is not None else None  # follows symlinks (Secret swaps)
        except OSError:
            st = None
        out.append((st.st_mtime_ns, st.st_size, st.st_ino) if st is not None else None)
    return tuple(out)


class ReloadingContext:
    """An SSLContext from files, rebuilt when one of them changes (looked at most every
    ``reload_check_seconds``, when a context is asked for). A change that does not load (a
    certificate written before its key, say) is logged and the last good context kept."""

    def __init__(
        self,
        files: TlsFiles,
        build: Callable[[Any], ssl.SSLContext],
        what: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files, self.build, self.what, self.clock = files, build, what, clock
        self.context = build(files)  # raises TlsConfigError: refused at start
        self._seen = _signature(files)
        self._failed: tuple[tuple[int, int, int] | None, ...] | None = None
        self._checked = clock()
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        now = self.clock()
        if now - self._checked >= self.files.reload_check_seconds:
            self._checked = now
            self.check()
        return self.context

    def check(self) -> bool:
        """Rebuild now if the files changed; True when a new context was loaded."""
        signature = _signature(self.files)
        if signature == self._seen or signature == self._failed:
            return False
        try:
            context = self.build(self.files)
        except (TlsConfigError, OSError) as exc:
            self._failed = signature
            log.error("%s: changed TLS files do not load, keeping the last good ones: %s", self.what, exc)
            return False
        self.context, self._seen, self._failed = context, signature, None
        self.reloads += 1
        log.info("%s: TLS certificate files changed on disk, reloaded for new connections", self.what)
        return True


class ListenerTlsContext:
    """What the client-facing listeners hand to ``create_server``, and what they read back.

    A handshake that fails (a certificate refused, a client that does not speak TLS) ends inside
    the event loop, which says nothing of it. So each handshake is registered when its
    ClientHello arrives and ticked off when the connection is made; one whose TLS object is
    dropped before that failed, and ``on_failure`` hears of it.
    """

    def __init__(
        self,
        cfg: ListenerTls,
        clock: Callable[[], float] = time.monotonic,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.on_failure = on_failure
        self._pending: dict[int, weakref.ref[Any]] = {}
        self.mapper = PrincipalMapper(cfg.principal_mapping_rules)
        self.files = ReloadingContext(cfg, server_context, "client listener", clock)
        # The listening context itself: verify mode and first certificates; every handshake then
        # switches to the newest context from the files.
        self.listening = server_context(cfg)
        self.listening.sni_callback = self._hello

    def _hello(self, ssl_object: Any, server_name: str | None, _context: ssl.SSLContext) -> None:
        ssl_object.context = self.files.current()
        setattr(ssl_object, _SERVER_NAME, server_name)
        key = id(ssl_object)
        self._pending[key] = weakref.ref(ssl_object, lambda _ref: self._dropped(key))

    def _dropped(self, key: int) -> None:
        if self._pending.pop(key, None) is not None and self.on_failure is not None:
            self.on_failure()

    def completed(self, ssl_object: Any) -> None:
        """The handshake of this connection succeeded."""
        self._pending.pop(id(ssl_object), None)

    @property
    def handshakes_under_way(self) -> int:
        return len(self._pending)

    def principal(self, ssl_object: Any) -> str:
        """The principal of a connection's client certificate (ANONYMOUS without one); raises
        NoMatchingRule when no mapping rule applies (BadCertificate for an unreadable subject)."""
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            return ANONYMOUS
        return self.mapper.name(distinguished_name(subject_of_certificate(der)))


def server_name(ssl_object: Any) -> str | None:
    """The name the client asked for in its TLS handshake (SNI), if any."""
    return getattr(ssl_object, _SERVER_NAME, None) if ssl_object is not None else None


def upstream_context(
    cfg: UpstreamTls, clock: Callable[[], float] = time.monotonic
) -> ReloadingContext | None:
    return ReloadingContext(cfg, client_context, "upstream", clock) if cfg.enabled else None
