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

    def log(self, level: int, kind: str, msg: str, *args: object) -> bool:
        """Log ``msg`` unless ``kind`` used up its lines for this interval; True if logged."""
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
        self.logger.log(level, msg, *args)
        self._windows[kind] = (start, logged + 1, 0)
        return True
