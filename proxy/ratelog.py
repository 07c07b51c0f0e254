"""Logging for events that can come thousands of times a second (throttles, rejections).

Each kind of event logs at most ``burst`` lines per ``interval`` seconds; the lines suppressed in
between are counted and reported with the next line that gets through, so the log says how much
happened without flooding the disk. The metrics count every event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        burst: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # kind -> (start, logged, suppressed)

    def log(self, level: int, kind: str, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log ``msg`` unless ``kind`` used up its lines for this interval; True if logged.
        ``exc_info``: with the traceback of the exception being handled, as ``logger.exception``."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self.clock()
        start, logged, suppressed = self._windows.get(kind, (now, 0, 0))
        if now - start >= self.interval:
            start, logged = now, 0
        if logged >= self.burst:
            self._windows[kind] = (start, logged, suppressed + 1)
            return False
        if suppressed:
            msg += " (%d similar lines suppressed)"
            args = (*args, suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        self._windows[kind] = (start, logged + 1, 0)
        return True


class RateLimitFilter(logging.Filter):
    """The same bound for a library's own log lines (attach to the handlers; a logger's filters
    do not see its children's records): a client that cannot reach a broker logs each retry,
    many a second. Each message template of the loggers under ``prefix`` logs ``burst`` lines per
    ``interval`` seconds, and the next line that gets through says how many were suppressed."""

    def __init__(
        self, prefix: str, interval: float = 30.0, burst: int = 2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.interval = interval
        self.burst = burst
        self.clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefix):
            return True
        kind = f"{record.name}:{record.msg}"
        now = self.clock()
        start, logged, suppressed = self._windows.get(kind, (now, 0, 0))
        if now - start >= self.interval:
            start, logged = now, 0
        if logged >= self.burst:
            self._windows[kind] = (start, logged, suppressed + 1)
            if len(self._windows) > 1000:  # templates are few; bound it anyway
                self._windows.clear()
            return False
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar lines suppressed)"
        self._windows[kind] = (start, logged + 1, 0)
        return True
