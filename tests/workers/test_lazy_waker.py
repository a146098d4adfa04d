"""Server._lazy_waker: acks flushed without waking a sleeping supervisor reach it within
LAZY_SETTLE_DELAY, the timer armed by the ack's send (a task step), not by the flush."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
import trio.testing

from ipc import records as r
from tests.workers.helpers import worker_region
from workers import server
from workers.worker import LAZY_SETTLE_DELAY


@pytest.fixture
def srv() -> Iterator[server.Server]:
    with worker_region() as (config, _):
        yield server.Server(config)


def _ack(srv: server.Server, entry: int) -> None:
    srv.worker.send(r.Settle(1, 1, [entry], r.ACK))


@pytest.mark.parametrize("autojump", [False, True], ids=["real clock", "mock clock"])
def test_unannounced_acks_wake_the_supervisor_after_the_delay(srv: server.Server,
                                                              autojump: bool) -> None:
    worker = srv.worker
    sleeping = worker.region.supervisor_sleeping
    woken: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(srv._lazy_waker)
            await trio.testing.wait_all_tasks_blocked()  # the waker has installed its timer
            sleeping.set_sleeping()
            started = trio.current_time()  # before the arm: the wake comes a delay after it
            _ack(srv, 1)  # a task step: the timer is armed here
            assert worker.flush_requests()
            assert worker.lazy_pending
            assert worker.request_efd.drain() == 0
            with trio.fail_after(1):
                while not worker.request_efd.drain():
                    await trio.sleep(LAZY_SETTLE_DELAY / 10)
            woken.append(trio.current_time() - started)
            assert not worker.lazy_pending
            # Announced by a record that woke the supervisor meanwhile: the timer stays quiet.
            sleeping.set_sleeping()
            _ack(srv, 2)
            worker.send(r.Pull(5, 1))  # urgent: wakes it at once
            assert worker.flush_requests()
            assert worker.request_efd.drain() == 1
            sleeping.set_sleeping()
            await trio.sleep(LAZY_SETTLE_DELAY * 3)
            assert worker.request_efd.drain() == 0, "a wake-up nobody needed"
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock(autojump_threshold=0) if autojump else None
    trio.run(main, clock=clock)
    assert LAZY_SETTLE_DELAY <= woken[0]
    if autojump:  # virtual time: the wake came when the timer said, not at some later event
        assert woken[0] < LAZY_SETTLE_DELAY * 2


def test_acks_waiting_in_a_full_ring_keep_the_timer_armed(srv: server.Server,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring had no room: the acks are still in the outbox when the timer fires; it looks
    again until they are written and announced."""
    worker = srv.worker
    real_ring = worker.region.request_ring
    full = [True]

    class FullRing:
        """The request ring, with no room while ``full``."""

        def put_many_nowait(self, records: list[bytes]) -> int:
            return 0 if full[0] else real_ring.put_many_nowait(records)

        def is_empty(self) -> bool:
            return real_ring.is_empty()

    monkeypatch.setattr(worker.region, "request_ring", FullRing())

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(srv._lazy_waker)
            await trio.testing.wait_all_tasks_blocked()
            worker.region.supervisor_sleeping.set_sleeping()
            _ack(srv, 1)
            assert not worker.flush_requests()  # no room: nothing written
            worker.request_efd.drain()  # a full ring wakes the supervisor to drain it
            await trio.sleep(LAZY_SETTLE_DELAY * 3)
            assert worker.has_requests
            full[0] = False
            worker.region.supervisor_sleeping.set_sleeping()
            assert worker.flush_requests()  # written, unannounced
            with trio.fail_after(1):
                while not worker.request_efd.drain():
                    await trio.sleep(LAZY_SETTLE_DELAY / 10)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_steady_acks_the_supervisor_reads_leave_the_timer_quiet(srv: server.Server) -> None:
    """A consumer acking every LAZY_SETTLE_DELAY / 5 while something else wakes the supervisor
    (it reads the ring after each ack): the timer never runs the waker; once the supervisor
    stops reading, the last acks still wake it within the delay and a half."""
    worker = srv.worker
    sleeping = worker.region.supervisor_sleeping
    steps: list[str] = []

    class Steps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith("_lazy_waker"):
                steps.append(task.name)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(srv._lazy_waker)
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(Steps())
            for entry in range(50):
                sleeping.set_sleeping()
                _ack(srv, entry)
                assert worker.flush_requests()
                assert worker.request_efd.drain() == 0
                worker.region.request_ring.get_all_nowait()  # the supervisor, woken by another
                await trio.sleep(LAZY_SETTLE_DELAY / 5)
            assert steps == []
            sleeping.set_sleeping()
            _ack(srv, 50)
            assert worker.flush_requests()
            started = trio.current_time()
            with trio.fail_after(1):
                while not worker.request_efd.drain():
                    await trio.sleep(LAZY_SETTLE_DELAY / 10)
            assert trio.current_time() - started < LAZY_SETTLE_DELAY * 1.5
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
