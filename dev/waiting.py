"""Bounded waits for the condition a test or benchmark needs, in place of a bare sleep.

A wait polls the condition itself (a partition's leader, a metric reaching a value, a log line),
so it ends as soon as the condition holds on a fast machine and still holds on a loaded one; the
timeout is a bound on a broken run, never the expected duration. On timeout the failure says
what was awaited and, where the caller gives one, what was last seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class WaitTimeout(AssertionError):
    """The awaited condition did not hold before the bound (an AssertionError, so pytest shows it
    as a failed expectation with its message)."""


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str | Callable[[], str],
    every: float = 0.2,
) -> None:
    """Poll ``condition`` every ``every`` seconds until it holds; raise ``WaitTimeout`` with
    ``what`` (a message, or a function giving one from the latest state) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise WaitTimeout(what() if callable(what) else what)
        time.sleep(every)
