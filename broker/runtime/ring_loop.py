"""The supervisor's own loop: a blocking ``epoll`` over the workers' request eventfds, with trio
run as its guest for the control plane.

Theory of operation
-------------------
The supervisor's hot path is: a worker writes records to its request ring and, if the
supervisor said it was going to sleep, writes its eventfd; the supervisor applies every ring
and flushes once. Under trio each such wake-up went through trio's scheduler (an ``epoll_wait``,
an ``epoll_ctl`` to re-arm the one-shot registration, an ``eventfd`` read and a task switch per
ring); measured with ``python -m perf.floor`` the middle process of three spends three to
five times as much CPU per message under trio as in a plain ``epoll`` loop (docs/performance.md).

So the supervisor's main thread runs this loop instead. Each turn:

1. runs the callbacks trio asked for (its *guest ticks*: the control socket, the worker and
   child processes, signals, the data directory's sync, the periodic jobs);
2. calls ``step()``: one bounded pass over every ring, one flush, the timer when due; True
   while work is left, and the loop turns again at once (the next turn's guest tick gives the
   control plane its turn between two steps, as trio's scheduler gave its other tasks);
3. otherwise announces sleep to every worker (ipc.wakeup's sleep flags, one fence) and asks
   ``has_work()`` again: work that arrived meanwhile is taken at once; else
4. sleeps in ``epoll_wait`` on the workers' eventfds and its own wake-up eventfd for at most
   ``timeout()`` seconds (the timer's next deadline), and clears the flags.

The eventfds are registered edge-triggered and never read: each write of an eventfd puts it
on the epoll's ready list once, and ``epoll_wait`` takes it off, so a wake-up costs the one
``epoll_wait``. (An eventfd's counter only grows, by one a wake-up; it cannot reach 2**64 - 1.)

trio runs as a guest (``trio.lowlevel.start_guest_run``): its tasks' steps run here, in this
thread, between the ring steps, so they see and change the dispatcher exactly as the ring
steps do; only its wait for I/O and timers runs in a thread of its own, which hands the next
tick back through ``run_sync_soon_threadsafe`` (a deque and a write of the wake-up eventfd).
A trio event set by a ring step (a control request answered, the sync bell) reaches that
thread through trio's own wake-up socket.
"""

from __future__ import annotations

import select
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from outcome import Outcome

from ipc.wakeup import EventFd, SleepFlag, SleepFlags

_EDGE = select.EPOLLIN | select.EPOLLET


class RingLoop:
    """An epoll loop that sleeps on eventfds and hosts trio: see the module docstring."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake = EventFd()  # trio's I/O thread hands its ticks back through this
        self._epoll.register(self._wake.fileno(), _EDGE)
        self._soon: deque[Callable[[], object]] = deque()
        self._outcome: Outcome[Any] | None = None
        self._flags = SleepFlags()

    def watch(self, fd: int, flag: SleepFlag) -> None:
        """Wake the loop when ``fd`` (an eventfd) is written; its writer writes it only while
        ``flag`` says the loop sleeps (ipc.wakeup)."""
        self._epoll.register(fd, _EDGE)
        self._flags.add(flag)

    def close(self) -> None:
        self._epoll.close()
        self._wake.close()

    def _soon_threadsafe(self, fn: Callable[[], object]) -> None:
        self._soon.append(fn)  # deque.append is atomic; the write wakes an epoll_wait
        self._wake.wake()

    def _done(self, outcome: Outcome[Any]) -> None:
        self._outcome = outcome

    def run(self, main: Callable[[], Awaitable[object]], step: Callable[[], bool],
            has_work: Callable[[], bool], timeout: Callable[[], float],
            instruments: Sequence[trio.abc.Instrument] = ()) -> object:
        """Run ``main`` under trio as this loop's guest and the ring steps beside it until
        ``main`` returns (its value) or raises (raised here)."""
        soon = self._soon
        trio.lowlevel.start_guest_run(
            main, run_sync_soon_threadsafe=self._soon_threadsafe,
            run_sync_soon_not_threadsafe=soon.append, done_callback=self._done,
            instruments=instruments,
        )
        poll, flags = self._epoll.poll, self._flags
        # _ended, not `self._outcome is None`: the callbacks set it, and a narrowed read would
        # be checked as None where compiled
        while not self._ended():
            for _ in range(len(soon)):  # what was asked before this turn; more waits a turn
                soon.popleft()()
            if step() or soon or self._ended():
                continue
            flags.set_sleeping()
            if not (has_work() or soon):
                poll(timeout())
            flags.clear()
        result = self._outcome
        assert result is not None
        return result.unwrap()

    def _ended(self) -> bool:
        return self._outcome is not None
