"""perf.consumer_path runs the consumer's side of a real worker and leaves nothing behind."""

from __future__ import annotations

import os

import pytest

from perf import consumer_path

# It compares all of /dev/shm before and after: a broker another test starts meanwhile would
# show up as left behind.
pytestmark = pytest.mark.serial


def test_it_prints_each_step_and_removes_its_region(capsys: pytest.CaptureFixture[str]) -> None:
    before = set(os.listdir("/dev/shm"))
    consumer_path.main(["--rounds", "50", "--batch", "3", "--repeat", "1"])
    out = capsys.readouterr().out
    for step in (*consumer_path.STEPS, "all"):
        assert f"  {step} " in out
    assert set(os.listdir("/dev/shm")) <= before
