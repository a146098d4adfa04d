"""perf.at_rest: it measures a real Shoal at rest, per process, and ends what it started."""

from __future__ import annotations

import psutil
import pytest

from perf import at_rest


def test_it_reads_every_process_of_a_broker_at_rest_and_stops_it(capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # a session's brokers
    at_rest.main(["--seconds", "1", "--settle", "0.5", "--no-rabbitmq", "--workers", "2"])
    out = capsys.readouterr().out
    shoal = next(line for line in out.splitlines() if line.startswith("shoal"))
    assert "cores at rest" in shoal
    for process in ("supervisor", "worker0", "worker1"):  # each by its part (the management
        assert f" {process} " in shoal  # process may sleep through a 1 s window)
    # perf.brokers ended every process by PID and found none of its shared memory left
    # (it says so with a "!" line); other tests' brokers may run beside this one
    assert "!" not in out
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
