"""The supervisor's ring loop (broker.runtime.ring_loop): it sleeps in epoll until a watched
eventfd is written by a producer that saw its sleep flag, runs its step then, and hosts trio:
the main task's value is the loop's, its exception the loop's, and a trio event set by a step
reaches the trio task waiting on it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import trio

from broker.runtime.ring_loop import RingLoop
from ipc.wakeup import EventFd, SleepFlag, wake_if_sleeping

IDLE = 30.0  # the loop's sleep when nothing else wakes it: far longer than the test


@pytest.fixture
def loop() -> Iterator[RingLoop]:
    ring_loop = RingLoop()
    yield ring_loop
    ring_loop.close()


def test_a_producer_that_sees_the_flag_wakes_the_sleeping_loop(loop: RingLoop) -> None:
    """The loop announces sleep on the flag before it sleeps; a producer that then finds the
    flag set writes the eventfd, and the loop wakes and runs its step with the work."""
    efd, flag = EventFd(), SleepFlag(bytearray(64), 0)
    loop.watch(efd.fileno(), flag)
    work: list[int] = []
    seen: list[int] = []
    woke: list[bool] = []
    done: list[trio.Event] = []
    producers: list[threading.Thread] = []

    def produce() -> None:
        while not flag.is_sleeping():  # bounded by the loop: it sleeps once main waits
            threading.Event().wait(0.001)
        # The loop looks for work once more after it set the flag (and then does not sleep):
        # work published within that instant is the other case (test_wakeup.py), not this one.
        threading.Event().wait(0.05)
        work.append(1)
        woke.append(wake_if_sleeping(flag, efd))

    def step() -> bool:
        if work:
            seen.append(work.pop())
            done[0].set()  # from the loop's step, not from a trio task
        return False

    async def main() -> str:
        done.append(trio.Event())
        producers.append(threading.Thread(target=produce, daemon=True))
        producers[0].start()
        await done[0].wait()
        return "finished"

    try:
        assert loop.run(main, step, lambda: bool(work), lambda: IDLE) == "finished"
        producers[0].join(10)  # it notes what wake_if_sleeping answered after the loop woke
    finally:
        efd.close()
    assert seen == [1]
    assert woke == [True], "the producer saw the loop asleep and wrote the eventfd"
    assert not flag.is_sleeping(), "the loop clears its flag once awake"


def test_the_main_tasks_exception_is_raised_by_the_loop(loop: RingLoop) -> None:
    """trio runs as the loop's guest: a timer of its own ends the main task, whose exception
    comes out of run()."""

    async def main() -> None:
        await trio.sleep(0.01)
        raise ValueError("from trio")

    with pytest.raises(ValueError, match="from trio"):
        loop.run(main, lambda: False, lambda: False, lambda: IDLE)
