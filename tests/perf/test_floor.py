"""perf.floor: both layouts carry every message through and end every process they start."""

from __future__ import annotations

import psutil
import pytest

from perf import floor


@pytest.mark.parametrize("processes", [1, 3])
def test_every_message_arrives_and_the_relays_are_gone(processes: int) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # a session's brokers
    res = floor.run_layout(processes, rate=2000.0, seconds=0.25)
    assert res["sent"] == 500
    assert res["received"] == 500
    assert 0 < res["p50_us"] <= res["p99_us"]
    assert res["us_per_msg"] >= 0
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
