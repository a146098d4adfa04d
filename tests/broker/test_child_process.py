"""The supervisor's helper processes (the management process, the links process) share one
restart loop and one stdin writer (broker.runtime.child_process): a child that dies is started
again, after RESTART_BACKOFF when it died within it; one that cannot start is tried again every
RESTART_BACKOFF; the loop ends when the broker stops; a change is one JSON line on its stdin,
and nothing when no process runs. The processes are fakes and time is trio's autojump clock."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import trio
import trio.testing

from broker.runtime.child_process import SupervisedChild
from broker.runtime.worker_lifecycle import RESTART_BACKOFF


class FakeStdin:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_all(self, data: bytes) -> None:
        self.sent.append(data)


class FakeProcess:
    def __init__(self, pid: int, lives: float) -> None:
        self.pid = pid
        self.lives = lives
        self.returncode: int | None = None
        self.stdin = FakeStdin()

    async def wait(self) -> int:
        await trio.sleep(self.lives)
        self.returncode = 1
        return 1


class Child(SupervisedChild):
    what = "test process"

    def __init__(self, lives: list[float | None], stop_after: int) -> None:
        super().__init__()
        self.lives = lives  # per start: how long it lives; None: it cannot be started
        self.starts: list[float] = []
        self.restarting = 0
        self.stop_after = stop_after

    async def _spawn(self, settings: dict[str, Any]) -> trio.Process:
        self.starts.append(trio.current_time())
        life = self.lives.pop(0)
        if life is None:
            raise OSError("no such file")
        return FakeProcess(len(self.starts), life)  # type: ignore[return-value]

    def _restarting(self) -> None:
        self.restarting += 1

    def stopping(self) -> bool:
        return len(self.starts) >= self.stop_after and not self.lives


async def test_a_child_that_dies_is_started_again_not_faster_than_the_backoff(
        autojump_clock: trio.testing.MockClock) -> None:
    """A child that lived longer than RESTART_BACKOFF starts again at once; one that died
    within it starts again RESTART_BACKOFF later; the loop ends once the broker stops."""
    child = Child([5.0, 0.1, 5.0], stop_after=3)
    await child._supervise(dict, child.stopping)
    gaps = [b - a for a, b in zip(child.starts, child.starts[1:], strict=False)]
    assert gaps == pytest.approx([5.0, 0.1 + RESTART_BACKOFF])
    assert child.restarting == 2


async def test_a_child_that_cannot_start_is_tried_again_every_backoff(
        autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture) -> None:
    """A start that fails (OSError) is logged and tried again RESTART_BACKOFF later."""
    child = Child([None, None, 5.0], stop_after=3)
    with caplog.at_level(logging.ERROR, "shoal.supervisor"):
        await child._supervise(dict, child.stopping)
    gaps = [b - a for a, b in zip(child.starts, child.starts[1:], strict=False)]
    assert gaps == pytest.approx([RESTART_BACKOFF, RESTART_BACKOFF])
    assert "cannot start the test process: no such file" in caplog.text


async def test_tell_writes_one_json_line_to_the_running_child() -> None:
    """A change is one JSON line on the running process's stdin; with none running (or one
    that exited) nothing is written."""
    child = Child([], stop_after=0)
    await child.tell({"users": {}})  # nothing running: dropped
    process = FakeProcess(1, 0.0)
    child.process = process  # type: ignore[assignment]
    await child.tell({"set": {"name": "s"}})
    process.returncode = 0
    await child.tell({"clear": {}})
    assert [json.loads(line) for line in process.stdin.sent] == [{"set": {"name": "s"}}]
