"""A broker run with --trace, read back with pyarrow alone: each message's publish, deliver and
ack rows are written by the workers and its settle row (when it was enqueued, pulled, settled)
by the supervisor, with the outcome the client chose. The same traffic as the report's end-to-end test
(tests/report/test_end_to_end.py), without Spark: this one runs in both passes of `make test`,
so the trace hooks of the compiled modules run as pure Python too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.integration.harness import finish, start_broker
from tracing import names
from tracing import schema as ts
from tracing.reader import read_table

MESSAGES = 300
REJECTED = 20


def test_a_traced_broker_writes_every_stage_of_every_message(tmp_path: Path) -> None:
    """Every one of a pika client's confirmed publishes has one publish, deliver and ack row and
    one settle row that says when it was enqueued and pulled, the ack and settle rows with the
    outcome the client chose (reject: rejected, ack: acked); the processes sampled themselves."""
    trace = tmp_path / "trace"
    broker = start_broker(tmp_path / "broker", extra_args=["--trace", str(trace)])
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare("traced")
        channel.confirm_delivery()
        for i in range(MESSAGES):
            channel.basic_publish("", "traced", str(i).encode())
        channel.basic_qos(prefetch_count=50)
        received = 0
        for method, _, _ in channel.consume("traced", inactivity_timeout=5):
            assert method is not None, f"only {received} of {MESSAGES} messages arrived"
            received += 1
            if received <= REJECTED:
                channel.basic_reject(method.delivery_tag, requeue=False)
            else:
                channel.basic_ack(method.delivery_tag)
            if received == MESSAGES:
                break
        channel.cancel()
        connection.close()
    finally:
        finish(broker)  # SIGTERM: every process flushes and closes its trace files

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
