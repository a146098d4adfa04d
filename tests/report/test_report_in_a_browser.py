"""The report as a person sees it: report.html opened in a real headless browser (Debian's
Chromium), at a laptop-ish width. Its screenshot is kept next to the report (report.png) for a
look; the test asserts what a reader needs: the page renders, is not blank, and nothing in it is
wider than the window (wide tables scroll inside their own box)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib.image

from tests.report import browser

WIDTH = 900


def test_the_report_renders_readably_in_chromium(report: dict) -> None:
    out: Path = report["out"]
    page = out / "report.html"
    shot = out / "report.png"
    done = browser.run([f"--window-size={WIDTH},3000", f"--screenshot={shot}", page.as_uri()], out)
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
    dom = browser.run([f"--window-size={WIDTH},800", "--dump-dom", probe.as_uri()], out).stdout
    found = re.search(r"<title>W=(\d+) V=(\d+)</title>", dom)
    assert found, dom[:500]
    layout, viewport = int(found.group(1)), int(found.group(2))
    assert layout <= viewport, f"the page is {layout} px wide in a {viewport} px window"
    assert dom.count("<img") == 6
