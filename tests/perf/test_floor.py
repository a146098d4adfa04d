"""perf.floor: every layout carries every message through and ends every process it starts."""

from __future__ import annotations

import psutil
import pytest

from perf import floor


@pytest.mark.parametrize("layout", sorted(floor.LAYOUTS))
def test_every_message_arrives_and_the_relays_are_gone(layout: str) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # a session's brokers
    res = floor.run_layout(layout, rate=2000.0, seconds=0.25)
    assert len(res["per_process"]) == (1 if layout.startswith("1") else 3)
    assert res["sent"] == 500
    assert res["received"] == 500
    assert 0 < res["p50_us"] <= res["p99_us"]
    assert res["us_per_msg"] >= 0
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
