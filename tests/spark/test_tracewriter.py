"""The trace writers and readers (pyarrow only, no Spark)."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pytest

from perf.spark.job import _fairness, jain
from perf.trace_writers import ClientTraceWriter, ProcSampleWriter
from tracing import schema as ts
from tracing.reader import conform, read_stream_file, read_table
from tracing.writer import ArrowTraceWriter


def _publish(w: ArrowTraceWriter, n: int, t0: int = 0) -> None:
    for i in range(n):
        w.published(t0 + i, 1, 1, "ex", "rk", 10)


def test_truncated_stream_yields_exactly_its_complete_batches(tmp_path):
    """Cut anywhere, a stream file reads as the batches that end before the cut, no error."""
    w = ArrowTraceWriter(tmp_path, "worker0", worker=0)
    ends = []
    for b in range(3):
        _publish(w, 5, t0=100 * b)
        w.flush()
        ends.append(os.path.getsize(w.paths[0]))
    w.close()
    data = w.paths[0].read_bytes()
    for cut in range(len(data) + 1):
        batches, _ = read_stream_file(pa.BufferReader(data[:cut]))
        assert len(batches) == sum(1 for end in ends if end <= cut), cut
    batches, whole = read_stream_file(pa.BufferReader(data[: ends[1] + 7]))
    assert not whole
    assert [b.num_rows for b in batches] == [5, 5]
    assert read_stream_file(str(w.paths[0]))[1] is True


def test_truncated_file_on_disk_reads_up_to_last_complete_batch(tmp_path):
    """A file cut mid-batch (simulated crash) gives every row of the batches written before."""
    w = ArrowTraceWriter(tmp_path, "worker1", worker=1)
    _publish(w, 7)
    w.flush()
    whole = os.path.getsize(w.paths[0])
    _publish(w, 3, t0=1000)
    w.flush()
    os.truncate(w.paths[0], os.path.getsize(w.paths[0]) - 5)  # the writer never closed: a crash
    table = read_table(tmp_path, ts.MESSAGES)
    assert table.num_rows == 7
    assert table.column("published_ns").to_pylist() == list(range(7))
    assert os.path.getsize(w.paths[0]) > whole


def test_rows_carry_the_writer_identity_and_only_their_columns(tmp_path):
    """Publish rows get pub_worker/pub_pid, deliver/ack rows consumer_worker; other cells are null."""
    w = ArrowTraceWriter(tmp_path, "worker3", worker=3, pid=4242)
    assert w.published(1, 9, 2, "ex", "rk", 64) == 1
    assert w.published(2, 9, 2, "ex", "rk", 64) == 2
    w.delivered(3, 77, "q", 5, "tag", True)
    w.acked_many(4, [77, 78], ts.REJECTED)
    w.close()
    rows = sorted(read_table(tmp_path, ts.MESSAGES).to_pylist(), key=lambda r: (
        r["published_ns"] or r["delivered_ns"] or r["acked_ns"], r["entry_id"] or 0))
    pub, dlv = rows[0], rows[2]
    assert [r["stage"] for r in rows] == ["publish", "publish", "deliver", "ack", "ack"]
    assert (pub["pub_worker"], pub["pub_pid"], pub["pub_seq"], rows[1]["pub_seq"]) == (3, 4242, 1, 2)
    assert (pub["process"], pub["pid"], pub["entry_id"], pub["consumer_worker"]) == ("worker3", 4242, None, None)
    assert (dlv["consumer_worker"], dlv["entry_id"], dlv["redelivered"], dlv["pub_worker"]) == (3, 77, 1, None)
    assert [(r["entry_id"], r["outcome"], r["acked_ns"]) for r in rows[3:]] == [
        (77, "rejected", 4), (78, "rejected", 4)]


def test_maybe_flush_waits_for_rows_or_time(tmp_path):
    """maybe_flush writes nothing below flush_rows and before flush_ms, then writes everything."""
    w = ArrowTraceWriter(tmp_path, "supervisor", flush_rows=10, flush_ms=50)
    base = w._last_flush_ns
    _publish(w, 9)
    assert w.maybe_flush(base + 1_000) is False and w.pending == 9 and w.paths == []
    _publish(w, 1)
    assert w.maybe_flush(base + 2_000) is True and w.pending == 0
    w.notify_event(5, "q", 0, 1)
    assert w.maybe_flush(base + 2_000 + 49_000_000) is False
    assert w.maybe_flush(base + 2_000 + 50_000_000) is True
    assert (w.rows_written, w.batches_written) == (11, 2)
    w.close()
    assert read_table(tmp_path, ts.EVENTS).column("kind").to_pylist() == ["notify"]


def test_rotation_by_size_and_by_batch_count(tmp_path):
    """Past rotate_bytes (or rotate_batches) a new file starts; all rows read back in order."""
    w = ArrowTraceWriter(tmp_path / "a", "worker0", worker=0, rotate_bytes=1)
    w2 = ArrowTraceWriter(tmp_path / "b", "worker0", worker=0, rotate_batches=2)
    for b in range(4):
        _publish(w, 3, t0=10 * b)
        _publish(w2, 3, t0=10 * b)
        w.flush()
        w2.flush()
    w.close()
    w2.close()
    assert len(w.paths) == 4 and len(w2.paths) == 2
    expected = [10 * b + i for b in range(4) for i in range(3)]
    for d in ("a", "b"):
        assert read_table(tmp_path / d, ts.MESSAGES).column("published_ns").to_pylist() == expected


def test_bad_row_is_dropped_and_logged_not_raised(tmp_path, caplog):
    """A row of the wrong type loses its batch (logged, counted); other row kinds are written."""
    w = ArrowTraceWriter(tmp_path, "supervisor")
    w.notify_event("not a number", "q", 0, 1)  # type: ignore[arg-type]
    w.pull_event(1, "q", 0, 1, 0, False)
    with caplog.at_level(logging.ERROR, logger="shoal.trace"):
        w.close()
    assert w.rows_dropped == 1 and w.rows_written == 1
    assert "1 rows dropped" in caplog.text
    assert read_table(tmp_path, ts.EVENTS).column("kind").to_pylist() == ["pull"]


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


def test_conform_fills_missing_columns_and_casts(tmp_path):
    """A batch from an older writer (a column missing, another narrower) conforms to the schema."""
    old = pa.RecordBatch.from_pydict({"kind": ["notify"], "ts_ns": pa.array([5], pa.int32())})
    batch = conform(old, ts.EVENT_SCHEMA)
    assert batch.schema.names == ts.EVENT_SCHEMA.names
    assert batch.column("ts_ns").type == pa.int64() and batch.column("queue").null_count == 1


def test_process_name_must_be_file_safe(tmp_path):
    """Process names end up in file names: separators and dashes are refused."""
    with pytest.raises(ValueError):
        ArrowTraceWriter(tmp_path, "worker-0")
    with pytest.raises(ValueError):
        ArrowTraceWriter(tmp_path, "../x")


def test_jain_index():
    """Jain's index: 1 for equal shares, 1/n when one consumer gets all, None for nothing."""
    assert jain([3, 3, 3]) == pytest.approx(1.0)
    assert jain([6, 0, 0]) == pytest.approx(1 / 3)
    assert jain([6, 3, 3, 0]) == pytest.approx(144 / 216)
    assert jain([]) is None and jain([0, 0]) is None


def test_browsers_do_not_count_in_fairness():
    """A browsing consumer sees every message: it is left out of shares and Jain's index."""
    def row(cid, delivered, browser):
        return {"queue": "q", "consumer_worker": 0, "consumer_id": cid, "delivered": delivered,
                "tag": f"t{cid}", "ctag": None, "priority": 0, "browser": browser}

    out = _fairness([row(1, 2, False), row(2, 2, False), row(3, 4, True)])
    assert out["share"] == {"q": {"w0.c1": 0.5, "w0.c2": 0.5}}
    assert out["jain"]["q"] == pytest.approx(1.0)


def test_parquet_tables_read_like_stream_files(tmp_path):
    """A perf script may write its samples as Parquet (<table>-…parquet): they read and conform."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ts_ns": [1, 2], "pid": pa.array([7, 7], pa.int32()),
                             "name": ["supervisor", "supervisor"], "cpu_percent": [5.0, 7.0]}),
                   tmp_path / "proc-sample-perf-1-0000.parquet")
    (tmp_path / "notes.txt").write_text("not a trace file")
    rows = read_table(tmp_path, ts.PROCS).to_pylist()
    assert [(r["ts_ns"], r["cpu_percent"], r["rss_bytes"]) for r in rows] == [(1, 5.0, None), (2, 7.0, None)]


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
