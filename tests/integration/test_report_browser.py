"""The tuning report in a real browser: headless Chromium (Debian's ``chromium``) loads it and
finds no broken image and no empty plot.

A copy of the report gets a small script that, once the page has loaded, looks at every plot as
the browser drew it: the image decoded (``naturalWidth`` > 0), it is laid out at a readable size,
its ``data-points`` (what analytics/report.py says it drew) is above zero, and its pixels hold
colour (matplotlib draws data in colour, axes and text in black and grey: a plot with axes only
has none). The script writes its findings into the DOM, which ``--dump-dom`` prints.

Chromium comes from ``dev/chromium.sh`` (installs it with apt-get when missing). When it cannot be
had the test fails in CI (CI set) and is skipped elsewhere, saying why.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from analytics.report import write_report
from tests.tools import unavailable
from tests.unit.test_report_plain import busy_tables

REPO = Path(__file__).resolve().parents[2]
MIN_COLOURED_PIXELS = 200  # a line or a few bars; an empty plot has none

CHECK = """<script>
window.addEventListener("load", () => {
  const figures = [...document.querySelectorAll("figure.plot")].map((fig) => {
    const img = fig.querySelector("img");
    let coloured = 0, error = "";
    try {  // a broken image cannot be drawn: it throws
      const canvas = document.createElement("canvas");
      canvas.width = img.naturalWidth;
      canvas.height = img.naturalHeight;
      const ctx = canvas.getContext("2d");
      ctx.drawImage(img, 0, 0);
      const px = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      for (let i = 0; i < px.length; i += 4) {
        if (Math.max(px[i], px[i + 1], px[i + 2]) - Math.min(px[i], px[i + 1], px[i + 2]) > 60) coloured++;
      }
    } catch (e) {
      error = String(e);
    }
    const box = img.getBoundingClientRect();
    return {alt: img.alt, points: Number(fig.dataset.points), complete: img.complete,
            naturalWidth: img.naturalWidth, width: box.width, height: box.height, coloured, error};
  });
  const stray = [...document.images].filter((img) => !img.closest("figure.plot")).map((img) => img.alt);
  const out = document.createElement("pre");
  out.id = "kthrottle-check";
  out.textContent = JSON.stringify({figures, stray});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser's path, installed by dev/chromium.sh if missing."""
    try:
        done = subprocess.run(
            ["bash", str(REPO / "dev" / "chromium.sh")], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.SubprocessError) as exc:
        done = None
        reason = f"dev/chromium.sh could not run: {exc}"
    if done is not None:
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            return lines[-1]
        reason = f"no chromium and dev/chromium.sh could not install it: {done.stderr.strip()[-300:]}"
    unavailable(reason)


def _browse(chromium: str, page: Path, profile: Path) -> dict[str, Any]:
    """Load ``page`` in headless Chromium and return what the check script found."""
    command = [
        chromium,
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        "--window-size=1200,900",
        "--virtual-time-budget=5000",
        "--dump-dom",
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="kthrottle-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the check did not run (exit {done.returncode}): {done.stderr[-1000:]}"
    return dict(json.loads(html.unescape(found.group(1))))


def test_every_plot_decodes_and_shows_data(chromium: str, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    write_report(report, busy_tables(), "quotas: {}\n", {"records": 60_000})
    text = report.read_text(encoding="utf-8")
    checked = tmp_path / "checked.html"
    checked.write_text(text.replace("</body>", CHECK + "</body>"), encoding="utf-8")

    found = _browse(chromium, checked, tmp_path / "profile")
    figures = found["figures"]
    assert len(figures) == text.count('<figure class="plot"') >= 12, [f["alt"] for f in figures]
    assert not found["stray"], f"images outside a plot figure: {found['stray']}"
    for fig in figures:
        assert fig["complete"] and fig["naturalWidth"] > 0 and not fig["error"], f"broken image: {fig}"
        assert fig["width"] > 300 and fig["height"] > 100, f"laid out too small: {fig}"
        assert fig["points"] > 0, f"a plot of nothing: {fig}"
        assert fig["coloured"] >= MIN_COLOURED_PIXELS, f"axes without data: {fig}"
