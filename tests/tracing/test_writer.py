"""The broker's trace writer and the trace readers (pyarrow only, no Spark)."""

from __future__ import annotations

import logging
import os

import pyarrow as pa
import pytest

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


def test_parquet_tables_read_like_stream_files(tmp_path):
    """A perf script may write its samples as Parquet (<table>-…parquet): they read and conform."""
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ts_ns": [1, 2], "pid": pa.array([7, 7], pa.int32()),
                             "name": ["supervisor", "supervisor"], "cpu_percent": [5.0, 7.0]}),
                   tmp_path / "proc-sample-perf-1-0000.parquet")
    (tmp_path / "notes.txt").write_text("not a trace file")
    rows = read_table(tmp_path, ts.PROCS).to_pylist()
    assert [(r["ts_ns"], r["cpu_percent"], r["rss_bytes"]) for r in rows] == [(1, 5.0, None), (2, 7.0, None)]
