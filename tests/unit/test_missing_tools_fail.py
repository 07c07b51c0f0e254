"""A tool a test needs and cannot have skips for a developer running one test by hand, and fails
under the README's test command (dev/test.sh) and CI: a skipped proof must not pass for a kept one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools import unavailable

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_tool_skips_by_hand_and_fails_under_the_test_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("KTHROTTLE_REQUIRE_TOOLS", raising=False)
    with pytest.raises(pytest.skip.Exception):
        unavailable("no helm")
    monkeypatch.setenv("KTHROTTLE_REQUIRE_TOOLS", "1")
    with pytest.raises(pytest.fail.Exception, match="no helm"):
        unavailable("no helm")


def test_the_readme_test_command_requires_the_tools() -> None:
    assert "export KTHROTTLE_REQUIRE_TOOLS=1" in (ROOT / "dev" / "test.sh").read_text()


def test_no_test_skips_by_itself() -> None:
    """Every skip goes through tests.tools.unavailable, so none can pass silently under CI."""
    own = Path(__file__).resolve()
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.resolve() not in (own, ROOT / "tests" / "tools.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "pytest.skip(" in line or "mark.skipif" in line or "importorskip" in line
    ]
    assert not found, f"skips outside tests.tools.unavailable: {found}"
