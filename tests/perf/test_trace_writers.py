"""The perf scripts' own trace writers (psutil samples, load-generator rows) and what tracing
costs (pyarrow only, no Spark)."""

from __future__ import annotations

import os

import pytest

from perf.trace_writers import ClientTraceWriter, ProcSampleWriter
from tracing import schema as ts
from tracing.reader import read_table


def test_proc_and_client_writers_round_trip(tmp_path):
    """psutil samples and load-generator rows read back with their schemas' columns."""
    import psutil

    p = ProcSampleWriter(tmp_path)
    assert p.sample_processes({"me": psutil.Process()}, ts_ns=123) == 1
    p.close()
    c = ClientTraceWriter(tmp_path, "consumer0")
    c.sent(1, 0, 0, 50, "q")
    c.received(9, 0, 3, 1, "q", True)
    c.close()
    proc = read_table(tmp_path, ts.PROCS).to_pylist()
    assert len(proc) == 1 and proc[0]["pid"] == os.getpid() and proc[0]["name"] == "me"
    assert proc[0]["ts_ns"] == 123 and proc[0]["rss_bytes"] > 0
    client = sorted(read_table(tmp_path, ts.CLIENT).to_pylist(), key=lambda r: r["ts_ns"])
    assert [(r["kind"], r["n"], r["seq"], r["sent_ns"], r["redelivered"], r["client"]) for r in client] == [
        ("send", 50, 0, None, None, "consumer0"), ("recv", 1, 3, 1, True, "consumer0")]


class _FakeProcess:
    """Just what ProcSampleWriter.sample_processes reads; no cpu_percent, so it cannot be used."""

    def __init__(self, pid: int) -> None:
        self.pid, self.cpu_s = pid, 0.0

    def oneshot(self):
        import contextlib

        return contextlib.nullcontext()

    def cpu_times(self):
        from types import SimpleNamespace

        return SimpleNamespace(user=self.cpu_s * 0.75, system=self.cpu_s * 0.25)

    def num_ctx_switches(self):
        from types import SimpleNamespace

        return SimpleNamespace(voluntary=1, involuntary=0)

    def memory_info(self):
        from types import SimpleNamespace

        return SimpleNamespace(rss=1 << 20)


def test_sampled_cpu_percent_comes_from_cpu_time_over_wall_time(tmp_path):
    """CPU % of a sample is the CPU seconds used since the previous sample over the wall time
    between them (None for the first): not psutil's cpu_percent, whose per-object state another
    caller sampling the same Process objects would reset."""
    proc = _FakeProcess(42)
    writer = ProcSampleWriter(tmp_path, "sampler")
    for ts_ns, cpu_s in ((0, 1.0), (500_000_000, 1.25), (1_500_000_000, 2.75), (1_600_000_000, 2.75)):
        proc.cpu_s = cpu_s
        assert writer.sample_processes({"worker0": proc}, ts_ns=ts_ns) == 1
    writer.close()
    rows = read_table(tmp_path, ts.PROCS).to_pylist()
    assert [r["cpu_percent"] for r in rows] == [None, pytest.approx(50.0), pytest.approx(150.0), 0.0]


def test_a_message_takes_about_300_bytes_of_trace():
    """One message's rows (publish, deliver, ack, settle) with a real run's names take about the
    300 bytes the README states (measured 280-320 in perf runs)."""
    from perf.trace_cost import bench

    assert 250 <= bench(rows=20_000)["bytes_per_message"] <= 350
