"""A real broker run with --trace, then `shoal report`: the counts are what the client did, and
the broker's own processes are in the CPU and memory charts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.report import report as report_command
from tests.integration.traced_run import MESSAGES, REJECTED, run_traced_broker

# Its subject is the report (a Spark job, the same in both passes): make test's pure-Python pass
# leaves it out; tests/integration/test_traced_broker.py runs the same traffic's trace hooks there.
pytestmark = pytest.mark.compiled_only


def test_report_counts_match_what_the_client_sent_and_received(spark, tmp_path):
    """published, delivered, acked and rejected in summary.json equal what a pika
    client published, received and settled through a traced two-worker broker."""
    trace = tmp_path / "trace"
    run_traced_broker(tmp_path / "broker", trace)

    result = CliRunner().invoke(report_command, [str(trace), "--master", "local[1]"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    summary = json.loads((trace / "report" / "summary.json").read_text())
    assert summary["published"] == MESSAGES
    assert summary["delivered"] == MESSAGES
    assert summary["acked"] == MESSAGES - REJECTED
    assert summary["rejected"] == REJECTED
    assert summary["join_mismatches"] == 0  # worker and supervisor rows of each message met
    assert summary["jain"]["traced"] == 1.0  # one consumer has all of its queue


    # the broker sampled its own processes: the report's CPU and memory charts have data
    processes = summary["processes"]
    assert {"supervisor", "worker0", "worker1"} <= set(processes), sorted(processes)
    for name in ("supervisor", "worker0", "worker1"):
        p = processes[name]
        assert p["rss_max_bytes"] > 0 and any(p["rss_bytes"]), (name, p)
        assert any(c is not None for c in p["cpu_percent"]), (name, p)
        assert p["cpu_seconds"] >= 0, (name, p)
    # the client's one connection lands on one worker: the other may have been idle throughout
    assert processes["supervisor"]["cpu_seconds"] > 0, processes["supervisor"]
    assert processes["worker0"]["cpu_seconds"] + processes["worker1"]["cpu_seconds"] > 0
