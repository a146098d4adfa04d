"""The report as a person sees it: report.html opened in a real headless browser (Debian's
Chromium), at a laptop-ish width. Its screenshot is kept next to the report (report.png) for a
look; the test asserts what a reader needs: the page renders, is not blank, and nothing in it is
wider than the window (wide tables scroll inside their own box)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

WIDTH = 900
BROWSER_TIMEOUT = 120


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("the report's browser test needs Chromium (Debian: apt-get install chromium)")


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-dev-shm-usage", *args],
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT, check=False)


def test_the_report_renders_readably_in_chromium(report: dict) -> None:
    out: Path = report["out"]
    page = out / "report.html"
    shot = out / "report.png"
    done = _browser(f"--window-size={WIDTH},3000", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), done.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[1] == WIDTH
    ink = (pixels[..., :3] < 0.9).any(axis=-1).mean()  # share of pixels that are not near-white
    assert 0.02 < ink < 0.6, f"{ink:.1%} of the page is ink: blank, or a solid block"

    # How wide the page lays out at this window width: its scrollWidth, written into the title
    # by a copy of the page with one line of script, read back from the DOM Chromium dumps.
    probe = out / "probe.html"
    probe.write_text(page.read_text().replace(
        "</body>", "<script>document.title = 'W=' + document.documentElement.scrollWidth "
                   "+ ' V=' + window.innerWidth;</script></body>"))
    dom = _browser(f"--window-size={WIDTH},800", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r"<title>W=(\d+) V=(\d+)</title>", dom)
    assert found, dom[:500]
    layout, viewport = int(found.group(1)), int(found.group(2))
    assert layout <= viewport, f"the page is {layout} px wide in a {viewport} px window"
    assert dom.count("<img") == 6
