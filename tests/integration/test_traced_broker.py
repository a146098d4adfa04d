"""A broker run with --trace, read back with pyarrow alone: each message's publish, deliver and
ack rows are written by the workers and its settle row (when it was enqueued, pulled, settled)
by the supervisor, with the outcome the client chose. The same traffic as the report's end-to-end test
(tests/integration/traced_run.py), without Spark: this one runs in both passes of `make test`,
so the trace hooks of the compiled modules run as pure Python too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.integration.traced_run import MESSAGES, REJECTED, run_traced_broker
from tracing import names
from tracing import schema as ts
from tracing.reader import read_table


def test_a_traced_broker_writes_every_stage_of_every_message(tmp_path: Path) -> None:
    """Every one of a pika client's confirmed publishes has one publish, deliver and ack row and
    one settle row that says when it was enqueued and pulled, the ack and settle rows with the
    outcome the client chose (reject: rejected, ack: acked); the processes sampled themselves."""
    trace = tmp_path / "trace"
    run_traced_broker(tmp_path / "broker", trace)

    rows = read_table(trace, ts.MESSAGES).to_pylist()
    stages = Counter(row["stage"] for row in rows)
    assert stages == {stage: MESSAGES for stage in (ts.PUBLISH, ts.DELIVER, ts.ACK, ts.SETTLE)}
    settles = [row for row in rows if row["stage"] == ts.SETTLE]
    assert all(row["enqueued_ns"] and row["pulled_ns"] for row in settles), settles[:3]
    for stage in (ts.ACK, ts.SETTLE):
        outcomes = Counter(row["outcome"] for row in rows if row["stage"] == stage)
        assert outcomes == {names.ACKED: MESSAGES - REJECTED, names.REJECTED: REJECTED}, (stage, outcomes)
    writers = {row["process"] for row in rows}
    assert "supervisor" in writers and writers & {"worker0", "worker1"}, writers
    sampled = {row["name"] for row in read_table(trace, ts.PROCS).to_pylist()}
    assert {"supervisor", "worker0", "worker1"} <= sampled, sampled
