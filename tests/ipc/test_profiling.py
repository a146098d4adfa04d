"""The developer's trio counters (``SHOAL_TRIO_STATS``): steps per task and the loop's sleeps."""

from __future__ import annotations

import json

import trio

from ipc.profiling import STATS_ENV, trio_instruments


def test_no_instruments_unless_asked(monkeypatch):
    monkeypatch.delenv(STATS_ENV, raising=False)
    assert trio_instruments("worker0") == []


def test_counts_each_tasks_steps_and_the_loops_sleeps(monkeypatch, tmp_path):
    monkeypatch.setenv(STATS_ENV, str(tmp_path))

    async def sleeper() -> None:
        for _ in range(3):
            await trio.sleep(0.001)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sleeper, name="sleeper")

    trio.run(main, instruments=trio_instruments("worker0"))
    (written,) = tmp_path.glob("worker0-*.json")
    stats = json.loads(written.read_text())
    steps, spent = stats["steps"]["sleeper"]
    assert steps == 4  # the first step, then one after each of three sleeps
    assert spent >= 0
    assert stats["waits"] >= 3  # the loop slept while the task did
    assert stats["cpu"] > 0
