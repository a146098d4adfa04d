"""Server._heartbeats: the tick comes twice a second while a connection has a 1 s heartbeat
(due every half second, as RabbitMQ sends one after heartbeat/2 of silence) and once a second
otherwise, every connection looked at once a second either way. Virtual time (trio's
MockClock), so the ticks' times are the loop's own, not the host's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from tests.workers.helpers import worker_region
from workers import server


@pytest.fixture
def srv() -> Iterator[server.Server]:
    with worker_region() as (config, _):
        yield server.Server(config)


class FakeHandler:
    """What the tick uses of a connection: its heartbeat, whether it is closed, the tick."""

    def __init__(self, heartbeat: int) -> None:
        self.proto = SimpleNamespace(heartbeat=heartbeat, closed=False)
        self.closed_ticks = 0
        self.ticks: list[float] = []

    def heartbeat_tick(self, now: float) -> bool:
        self.ticks.append(now)
        return True

    def wake_writer(self) -> None:
        pass


class FakeArena:
    """Counts the tick's arena upkeep: one trim a tick, and the blocks it may look at."""

    def __init__(self) -> None:
        self.trims: list[tuple[float, int]] = []

    def trim(self, release: object, steps: int) -> int:
        self.trims.append((trio.current_time(), steps))
        return 0


@pytest.fixture
def arena(srv: server.Server) -> FakeArena:
    fake = FakeArena()
    srv.worker.region.arena = fake  # type: ignore[assignment]
    return fake


def _run(srv: server.Server, handlers: dict[int, FakeHandler], seconds: float,
         then: tuple[float, Callable[[], object]] | None = None) -> float:
    """Run the tick for ``seconds`` of virtual time (with ``then``, its call that many seconds
    in, and ``seconds`` more after it); the time it started at."""
    srv.worker.handlers = handlers  # type: ignore[assignment]
    started: list[float] = []

    async def main() -> None:
        started.append(trio.current_time())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(srv._heartbeats)
            if then is not None:
                await trio.sleep(then[0])
                then[1]()
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return started[0]


def test_without_a_one_second_heartbeat_the_tick_comes_once_a_second(
        srv: server.Server, arena: FakeArena) -> None:
    idle = FakeHandler(heartbeat=60)
    start = _run(srv, {1: idle}, 5.2)
    assert [round(t - start, 3) for t in idle.ticks] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # five wake-ups, each trimming a second's worth of blocks
    assert [(round(t - start, 3), n) for t, n in arena.trims] == [
        (float(i), 2 * server.ARENA_TRIM_STEPS) for i in range(1, 6)]


def test_a_worker_without_connections_ticks_once_a_second(srv: server.Server, arena: FakeArena) -> None:
    start = _run(srv, {}, 3.2)
    assert [round(t - start, 3) for t, _ in arena.trims] == [1.0, 2.0, 3.0]


def test_a_one_second_heartbeat_brings_the_half_second_tick_and_others_stay_at_a_second(
        srv: server.Server, arena: FakeArena) -> None:
    fast, slow = FakeHandler(heartbeat=1), FakeHandler(heartbeat=60)
    start = _run(srv, {1: fast, 2: slow}, 5.2)
    # the first tick (a second after the start) finds the 1 s heartbeat; from then on the
    # tick comes every half second for it, every second for the other
    assert [round(t - start, 3) for t in fast.ticks] == [1.0 + i / 2 for i in range(9)]
    assert [round(t - start, 3) for t in slow.ticks] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [n for _, n in arena.trims] == [2 * server.ARENA_TRIM_STEPS] + [server.ARENA_TRIM_STEPS] * 8


def test_the_half_second_tick_ends_with_the_last_one_second_heartbeat(
        srv: server.Server, arena: FakeArena) -> None:
    fast, slow = FakeHandler(heartbeat=1), FakeHandler(heartbeat=60)

    def close_fast() -> None:
        fast.proto.closed = True  # closed: no heartbeat owed to it any more

    start = _run(srv, {1: fast, 2: slow}, 4.0, then=(3.2, close_fast))
    ticks = [round(t - start, 3) for t, _ in arena.trims]
    # half seconds while it was open (the 3.5 tick finds it closed), then whole ones
    assert ticks == [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.5, 5.5, 6.5]
