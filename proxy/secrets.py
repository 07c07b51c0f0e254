"""Secrets the proxy holds (its upstream SASL password, the admin token) never reach its logs.

Every secret read is registered here; a filter on the log handlers replaces each one, and the
spellings a client library's repr() of bytes or str gives it, with ``***``. Client libraries
log whole requests at DEBUG (aiokafka prints the SaslAuthenticate request of the proxy's own
login), so redacting at the handler is what holds whatever logs it.
"""

from __future__ import annotations

import logging
import threading

_lock = threading.Lock()
_secrets: set[str] = set()
MASK = "***"


def register(secret: str) -> str:
    """Remember ``secret`` (and its escaped spellings) for redaction; returns it unchanged."""
    if len(secret) >= 4:  # shorter strings would mask ordinary text, and are no secret anyway
        spellings = {secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]}
        with _lock:
            _secrets.update(spellings)
    return secret


def redact(text: str) -> str:
    with _lock:
        found = [s for s in _secrets if s in text]
    for secret in sorted(found, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


class RedactSecrets(logging.Filter):
    """A handler filter: the formatted message (and traceback text) with every secret masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets:
            return True
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install() -> None:
    """Put the filter on every handler of the root logger (records of all loggers pass there)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
