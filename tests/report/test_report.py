"""`shoal report` on a hand-made trace: every figure checked against the answer worked out by hand."""

from __future__ import annotations

import base64
import math
import re

import pytest
from click.testing import CliRunner

from cli.report import report as report_command
from report.job import ACCURACY, QUANTILE_KEYS, QUANTILES
from tests.report import handmade


def _allowed(values: list[float], p: float) -> set[float]:
    """Values percentile_approx may return for quantile p: ranks within 1/ACCURACY of p·n."""
    n = len(values)
    eps = 1.0 / ACCURACY
    lo = max(1, math.ceil((p - eps) * n))
    hi = min(n, max(math.ceil(p * n), math.floor((p + eps) * n)))
    return {values[r - 1] for r in range(lo, hi + 1)}


def test_report_writes_html_with_embedded_plots_and_summary(report):
    """report.html embeds six decodable PNG plots; summary.json and the echoed paths exist."""
    page = (report["out"] / "report.html").read_text()
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == 6
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert str(report["out"] / "report.html") in report["output"]
    assert str(report["out"] / "summary.json") in report["output"]


def test_counts_match_the_hand_computed_ones(report):
    """published, delivered, acked, rejected, requeued, redelivered, expired, … are exact."""
    s = report["summary"]
    keys = ("published", "delivered", "acked", "rejected", "requeued", "redelivered", "expired",
            "dead_lettered", "dropped", "unsettled", "unrouted", "entries", "join_mismatches")
    assert {k: s[k] for k in keys} == {k: handmade.EXPECTED[k] for k in keys}
    assert s["client"] == {"sent": 17, "received": 3, "redelivered": 0}


def test_cut_file_is_read_up_to_its_last_complete_batch(report):
    """The crashed worker's file is reported as cut, and its complete batch is still counted."""
    s = report["summary"]
    assert s["truncated_files"] == [report["cut_file"]]
    # worker1's complete batch holds 4 of the 17 publishes and c1/c2/c6's deliveries
    assert s["published"] == 17
    assert s["share"]["q2"]["w1.c6"] == pytest.approx(0.25)


def test_latency_percentiles_within_the_approximation_error(report):
    """p50/p90/p99/p99.9 of each stage are what the hand-made times give, to 1/ACCURACY in rank."""
    lat = report["summary"]["latency_us"]
    for stage, values in handmade.expected_latencies().items():
        assert lat[stage]["count"] == len(values), stage
        for key, p in zip(QUANTILE_KEYS, QUANTILES, strict=True):
            allowed = _allowed(values, p)
            assert any(lat[stage][key] == pytest.approx(v) for v in allowed), (stage, key, lat[stage][key], allowed)
    assert lat["end_to_end"]["p50"] == pytest.approx(240.0)  # 7th of 13, worked out by hand
    assert lat["publish_to_enqueue"]["p90"] == pytest.approx(150.0)  # 15th of 16


def test_per_consumer_share_and_jain_index(report):
    """Shares per consumer, Jain's index per queue and per priority level match the hand values."""
    s = report["summary"]
    for key in ("share", "jain_by_priority"):
        assert s[key].keys() == handmade.EXPECTED[key].keys(), key
        for queue, expected in handmade.EXPECTED[key].items():
            assert s[key][queue] == pytest.approx(expected), (key, queue)
    assert s["jain"] == pytest.approx(handmade.EXPECTED["jain"])


def test_wakeups_and_spurious_share(report):
    """Notifies, notified pulls, spurious pulls and their ratios match the hand values."""
    s = report["summary"]
    w = s["wakeups"]
    assert (w["notifies"], w["notified_pulls"], w["spurious_pulls"], w["pulls"]) == (8, 8, 2, 11)
    assert s["spurious_wakeup_share"] == pytest.approx(handmade.EXPECTED["spurious_wakeup_share"])
    assert s["wakeups_per_delivered"] == pytest.approx(handmade.EXPECTED["wakeups_per_delivered"])
    assert w["by_queue"]["q1"]["spurious_share"] == pytest.approx(2 / 6)
    assert w["by_queue"]["q2"]["spurious_share"] == pytest.approx(0.0)


def test_throughput_and_process_series(report):
    """Per-second published/delivered/acked, and CPU/RSS per process over time, match the trace."""
    s = report["summary"]
    tp = s["throughput"]
    assert tp["t"] == [0, 1]
    for key, values in handmade.EXPECTED["throughput"].items():
        assert tp[key] == values, key
    sup = s["processes"]["supervisor"]
    assert sup["t"] == [0, 1]
    assert sup["cpu_percent"] == pytest.approx([15.0, 35.0])
    assert sup["rss_bytes"] == [2 << 20, 4 << 20]
    assert sup["cpu_seconds"] == pytest.approx(0.6)
    assert (sup["ctx_voluntary"], sup["ctx_involuntary"]) == (30, 3)
    # worker0: 0.25 CPU-s per 0.5 s = 50 %, then 50 % and 100 % -> per second [50, 75]
    assert s["processes"]["worker0"]["cpu_percent"] == pytest.approx([50.0, 75.0])
    assert s["processes"]["worker0"]["cpu_seconds"] == pytest.approx(1.0)


def test_cli_passes_out_and_master_to_the_job(tmp_path, monkeypatch):
    """--out and --master reach the job; without them the job gets DIR/report's default and local[*]."""
    from report import job

    calls = []

    def fake(trace_dir, out_dir, master, shuffle_partitions):
        calls.append((trace_dir, out_dir, master))
        return {"report": tmp_path / "r.html", "summary": tmp_path / "s.json"}

    monkeypatch.setattr(job, "run_report", fake)
    runner = CliRunner()
    assert runner.invoke(report_command, [str(tmp_path), "--out", str(tmp_path / "o"),
                                          "--master", "spark://h:7077"]).exit_code == 0
    assert runner.invoke(report_command, [str(tmp_path)]).exit_code == 0
    assert calls == [(str(tmp_path), str(tmp_path / "o"), "spark://h:7077"), (str(tmp_path), None, "local[*]")]
    assert runner.invoke(report_command, [str(tmp_path / "missing")]).exit_code != 0


def test_mean_rate_is_over_the_time_the_events_took_not_whole_seconds():
    """A 0.65 s run of 5,000 publishes inside one clock second is 7,692 msg/s, not 5,000."""
    from report.summary_sections import throughput as _throughput

    t0 = 100
    start = t0 * 1_000_000_000 + 100_000_000
    rows = [{"s": t0, "k": "published", "count": 5000, "lo": start, "hi": start + 650_000_000},
            {"s": t0, "k": "delivered", "count": 1, "lo": start, "hi": start}]
    tp = _throughput(rows, t0)
    assert tp["published"] == [5000]
    assert tp["mean"]["published"] == pytest.approx(5000 / 0.65)
    assert tp["mean"]["delivered"] == 1.0  # one event: no span to divide by
    assert tp["mean"]["acked"] == 0.0


def test_a_short_runs_process_samples_are_plotted_in_sub_second_buckets(report):
    """A run of a second and a half gets each psutil sample as its own point (the plot's
    sub-second buckets), not two per-second averages; a process's first sample has no CPU %."""
    procs = report["summary"]["processes"]
    assert report["summary"]["throughput"]["fine"]["interval_s"] < 1
    sup, w0 = procs["supervisor"]["fine"], procs["worker0"]["fine"]
    assert sup["t"] == [0.0, 0.5, 1.0, 1.5]
    assert sup["cpu_percent"] == pytest.approx([10.0, 20.0, 30.0, 40.0])
    assert sup["rss_bytes"] == [1 << 20, 2 << 20, 3 << 20, 4 << 20]
    assert w0["cpu_percent"][0] is None
    assert w0["cpu_percent"][1:] == pytest.approx([50.0, 50.0, 100.0])
