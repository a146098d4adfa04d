"""report.html as a person sees it: a ten-minute run's report in headless Chromium (Debian's
`chromium`), on a laptop-sized window -- nothing wider than the window, every plot there and drawn.

One page, two Chromium runs (a screenshot, and the DOM with the laid-out widths); skips with the
reason when Chromium is not installed (`.ci/run` installs it)."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.report import report as report_command
from perf.trace_writers import ProcSampleWriter
from tests.report import browser
from tracing import schema as ts
from tracing.writer import ArrowTraceWriter

WINDOW = (960, 7000)  # a laptop's width; tall enough for the whole page in one screenshot
SECOND = 1_000_000_000
T = 50 * SECOND
RUN_S = 600
# what real runs name things: perf.quick's queue and pika's consumer tags are long
QUEUES = ("perf.quick.3239", "orders.eu-west-1.priority")
TAGS = ("ctag1.0c7092bd635d49cca9636015dc555be8", "ctag1.93a1d4c2b8e54f0f8e0c7d6b2a1f9e77",
        "ctag1.5f2b7c1e0a9d4e6b8c3f2a1d0e9b8c7a")
# after load, the page writes its laid-out widths into the DOM that --dump-dom prints
_MEASURE = ("<script>window.addEventListener('load', () => document.body.setAttribute('data-widths',"
            " JSON.stringify({scroll: document.documentElement.scrollWidth,"
            " client: document.documentElement.clientWidth,"
            " right: Math.max(...[...document.body.querySelectorAll('*')].map("
            "e => e.getBoundingClientRect().right)),"
            " images: [...document.images].map(i => [i.naturalWidth, i.width])})));</script>")


def write_ten_minute_trace(directory: Path) -> None:
    """600 s: 4 publishes a second over two queues and three consumers (one with priority), each
    delivered 2 ms and acked 5 ms later; every process sampled twice a second."""
    sup = ArrowTraceWriter(directory, "supervisor", pid=100)
    workers = [ArrowTraceWriter(directory, f"worker{i}", worker=i, pid=200 + i) for i in range(2)]
    consumers = [(0, 1, TAGS[0], QUEUES[0], 0), (1, 2, TAGS[1], QUEUES[0], 0),
                 (1, 3, TAGS[2], QUEUES[1], 5)]
    for wk, cid, tag, queue, prio in consumers:
        sup.consume_event(T - SECOND // 2, queue, wk, cid, tag, prio, False)
    entry = 0
    for s in range(RUN_S):
        rate = 4 if s % 120 < 90 else 2  # a dip every two minutes: the plot must show it
        for i in range(rate):
            entry += 1
            published = T + s * SECOND + i * SECOND // rate
            wk, cid, tag, queue, _ = consumers[entry % len(consumers)]
            seq = workers[0].published(published, 1, 1, "", queue, 128)
            workers[wk].delivered(published + 2_000_000, entry, queue, cid, tag, False)
            workers[wk].acked(published + 5_000_000, entry, ts.ACKED)
            sup.settled(published + 5_100_000, ts.ACKED, entry, entry, queue, 0, 200, seq, wk, cid, 0,
                        published + 400_000, published + 500_000, published + 1_000_000)
    for w in (sup, *workers):
        w.close()
    samples = ProcSampleWriter(directory, "sampler", pid=300)
    for k in range(RUN_S * 2 + 1):
        for n, (name, pid) in enumerate((("supervisor", 100), ("worker0", 200), ("worker1", 201),
                                         ("publisher", 400), ("consumer", 401))):
            cpu_s = k * 0.5 * (0.1 + 0.05 * n)
            samples.sample(T + k * SECOND // 2, pid, name, None, (60 + 10 * n + k % 7) << 20,
                           cpu_s, 0.0, k, 0)
    samples.close()


@pytest.fixture(scope="module")
def long_run_page(spark, tmp_path_factory) -> Path:
    trace = tmp_path_factory.mktemp("ten-minutes")
    write_ten_minute_trace(trace)
    result = CliRunner().invoke(report_command, [str(trace), "--master", "local[1]"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return trace / "report" / "report.html"


def _blank(image: Any) -> bool:
    """True when the image is (nearly) one colour: an unrendered page."""
    colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    return colours is not None and len(colours) < 8


def _coloured_pixels(image: Any) -> int:
    """Pixels of a saturated colour: the data drawn (axes, text and grid are grey or black)."""
    import numpy as np

    rgb = np.asarray(image.convert("RGB"), dtype=np.int16)
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 60).sum())


def test_report_page_fits_a_laptop_window_and_shows_every_plot(long_run_page, tmp_path):
    """In a 960-px Chromium window the ten-minute report is no wider than the window (wide
    tables scroll in their own box), keeps its right margin clear, and shows six plots with
    their data drawn, none scaled down to less than 90 % of its width."""
    from PIL import Image

    window = f"--window-size={WINDOW[0]},{WINDOW[1]}"
    page = long_run_page.read_text()

    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", _MEASURE + "</body>"))
    dom = browser.run([window, "--dump-dom", measured.as_uri()], tmp_path).stdout
    found = re.search(r'data-widths="([^"]+)"', dom)
    assert found, "the page did not load in Chromium"
    widths = json.loads(found.group(1).replace("&quot;", '"'))
    assert widths["client"] == WINDOW[0]
    assert widths["scroll"] <= widths["client"], widths  # no horizontal scrolling of the page
    assert widths["right"] <= widths["client"], widths
    assert len(widths["images"]) == 6
    for natural, shown in widths["images"]:
        assert shown >= 0.9 * natural, widths["images"]  # plots readable at their own size

    shot = tmp_path / "report.png"
    browser.run([window, f"--screenshot={shot}", long_run_page.as_uri()], tmp_path)
    image = Image.open(shot).convert("RGB")
    assert image.size == WINDOW
    assert not _blank(image.crop((0, 0, WINDOW[0], 400)))  # the title and the first tables
    right_margin = image.crop((WINDOW[0] - 8, 0, WINDOW[0], WINDOW[1]))
    assert right_margin.getextrema() == ((255, 255),) * 3, "something runs into the right edge"

    summary = json.loads((long_run_page.parent / "summary.json").read_text())
    fine = summary["throughput"]["fine"]
    assert fine["t"][0] >= 0 and fine["t"][-1] <= RUN_S, (fine["t"][0], fine["t"][-1])

    plots = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(plots) == 6
    for title, data in plots:
        plot = Image.open(io.BytesIO(base64.b64decode(data)))
        assert _coloured_pixels(plot) > 500, f"{title}: no data drawn"
