"""The tuning job stays readable a step at a time: short functions, and the report's templates
shipped with the package (an installed wheel and the image read them at run time)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANALYTICS = ROOT / "analytics"
MAX_LINES = 80


def test_no_function_in_analytics_is_over_80_lines() -> None:
    """A function longer than a screen is a step that wants a name of its own."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(ANALYTICS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long


def test_no_replay_step_hides_in_a_nested_function() -> None:
    """The replay's state travels in typed values between module-level functions, not closures."""
    nested = [
        f"{path.name}: {outer.name} defines {inner.name}"
        for path in sorted(ANALYTICS.glob("replay*.py"))
        for outer in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(outer, ast.FunctionDef)
        for inner in ast.walk(outer)
        if inner is not outer and isinstance(inner, ast.FunctionDef)
    ]
    assert not nested


def test_the_report_templates_are_package_data() -> None:
    """Every file under analytics/templates/ matches a package-data pattern of pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["analytics"]
    templates = sorted((ANALYTICS / "templates").iterdir())
    assert {p.name for p in templates} >= {"report.html", "report.css", "section.html", "figure.html"}
    for path in templates:
        assert any(path.relative_to(ANALYTICS).match(pattern) for pattern in patterns), path.name
