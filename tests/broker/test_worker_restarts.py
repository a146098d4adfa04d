"""How the supervisor restarts a dead worker, and whether the other workers wait for the
replacement (the starting mark in its region, workers.balance): a replaced worker is waited for,
a crash loop is not and is restarted only every RESTART_BACKOFF. The worker processes are fakes
and time is trio's autojump clock, so the test does not depend on how fast workers start."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from broker.runtime.supervisor import ServeConfig, Supervisor
from broker.runtime.worker_lifecycle import RESTART_BACKOFF
from broker.runtime.worker_lifecycle import WorkerSlot as _WorkerSlot
from ipc.region import NOT_ACCEPTING, starting_deadline


@dataclass
class Life:
    """One incarnation of the fake worker: how long it lives, and whether it starts (says hello
    and accepts) before it dies."""

    seconds: float
    starts: bool = True


@dataclass
class Spawn:
    at: float  # trio time of the spawn
    region: str  # what the region said when it was spawned: "starting", "not accepting", a count


class FakeProcess:
    def __init__(self, sup: Supervisor, w: _WorkerSlot, life: Life, pid: int) -> None:
        self._sup, self._w, self._life = sup, w, life
        self.pid = pid
        self.returncode: int | None = None

    async def wait(self) -> int:
        if self._life.starts:
            await trio.sleep(self._life.seconds / 2)
            self._w.ready = True  # its hello
            self._w.region.connections = 0  # it accepts
            await trio.sleep(self._life.seconds / 2)
        else:
            await trio.sleep(self._life.seconds)
        self.returncode = -9
        return self.returncode


def _state(count: int) -> str:
    if starting_deadline(count) is not None:
        return "starting"
    return "not accepting" if count == NOT_ACCEPTING else str(count)


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    sup = Supervisor(ServeConfig(port=0, workers=2, arena_mb=4, ring_kb=64, start_grace=2.0))
    sup.setup()
    yield sup
    sup.cleanup()


async def _run(sup: Supervisor, lives: list[Life]) -> list[Spawn]:
    """Supervise worker 0 through `lives`; the broker stops when the last one has been spawned."""
    w = sup.workers[0]
    spawns: list[Spawn] = []

    async def spawn(slot: _WorkerSlot) -> FakeProcess:
        spawns.append(Spawn(trio.current_time(), _state(slot.region.connections)))
        if len(spawns) == len(lives):
            sup.stopping = True  # the last incarnation dies with the broker
        return FakeProcess(sup, slot, lives[len(spawns) - 1], 1000 + len(spawns))

    sup._spawn = spawn  # type: ignore[method-assign]
    await sup._supervise(w)
    assert w.region.connections == NOT_ACCEPTING, "a stopped broker's worker is not waited for"
    return spawns


async def test_a_worker_that_had_started_is_replaced_at_once_and_waited_for(
    supervisor: Supervisor, autojump_clock: trio.testing.MockClock
) -> None:
    spawns = await _run(supervisor, [Life(30.0), Life(30.0), Life(0.2), Life(30.0)])
    assert [s.region for s in spawns] == ["starting"] * 4
    # died at 30, 60; the third lived 0.2 s: the first quick death of a worker that had started
    assert [s.at - spawns[0].at for s in spawns] == pytest.approx([0.0, 30.0, 60.0, 60.2])


async def test_a_worker_that_never_starts_is_not_waited_for_and_backs_off(
    supervisor: Supervisor, autojump_clock: trio.testing.MockClock
) -> None:
    """A crash loop: only the first start is waited for (its mark has a deadline); every later
    start leaves the region NOT_ACCEPTING, and starts come RESTART_BACKOFF apart."""
    spawns = await _run(supervisor, [Life(0.1, starts=False)] * 5)
    assert [s.region for s in spawns] == ["starting"] + ["not accepting"] * 4
    gaps = [b.at - a.at for a, b in itertools.pairwise(spawns)]
    assert gaps == pytest.approx([0.1 + RESTART_BACKOFF] * 4)


async def test_a_worker_that_dies_soon_after_starting_twice_running_is_a_crash_loop(
    supervisor: Supervisor, autojump_clock: trio.testing.MockClock
) -> None:
    """The first quick death of a started worker is replaced at once and waited for; a second
    in a row backs off and is not; a worker that then lives long is waited for again."""
    lives = [Life(0.5), Life(0.5), Life(0.5), Life(30.0), Life(30.0)]
    spawns = await _run(supervisor, lives)
    assert [s.region for s in spawns] == [
        "starting", "starting", "not accepting", "not accepting", "starting"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(spawns)]
    assert gaps == pytest.approx([0.5, 0.5 + RESTART_BACKOFF, 0.5 + RESTART_BACKOFF, 30.0])


async def test_a_worker_that_hangs_while_starting_and_dies_is_not_waited_for_again(
    supervisor: Supervisor, autojump_clock: trio.testing.MockClock
) -> None:
    """It lived long (no back-off: it did not spin) but never said hello."""
    spawns = await _run(supervisor, [Life(10.0, starts=False), Life(30.0)])
    assert [s.region for s in spawns] == ["starting", "not accepting"]
    assert spawns[1].at - spawns[0].at == pytest.approx(10.0)
