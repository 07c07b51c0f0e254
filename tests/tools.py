"""A tool or privilege a test needs and cannot have: a skip that says why for a developer running
one test by hand, a failure under CI or the README's test command (dev/test.sh sets
KTHROTTLE_REQUIRE_TOOLS), where a skipped proof would pass for a kept one."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required() -> bool:
    """Whether a missing tool fails the run (CI, or dev/test.sh)."""
    return bool(os.environ.get("CI") or os.environ.get("KTHROTTLE_REQUIRE_TOOLS"))


def unavailable(reason: str) -> NoReturn:
    if required():
        pytest.fail(f"{reason} (a missing tool fails the suite under dev/test.sh and CI)")
    pytest.skip(reason)
