"""Eventfd wake-ups that are written only when the peer sleeps.

Theory of operation
-------------------
Each consumer of a ring has an eventfd and a *sleep flag* in shared memory.
A busy consumer never sleeps, so its producers never write its eventfd: a
busy pair makes no syscall per message. The order that keeps this free of
lost wake-ups is the classic Dekker handshake:

sleeper (the consumer)::

    flag.set_sleeping()        # store flag = 1, then a full fence
    if ring is not empty (or anything else it waits on is ready):
        flag.clear()           # work arrived meanwhile: do not sleep
    else:
        await efd.wait()       # sleep; drains the eventfd on wake-up
        flag.clear()

waker (the producer)::

    ring.put_many_nowait(records)   # publishes the ring head
    wake_if_sleeping(flag, efd)     # full fence, load flag; if set: clear, write efd

Either the sleeper's re-check sees the producer's records, or the producer's
load sees the flag -- never neither -- *provided* each side's store is
visible before its own following load. x86-64 (TSO) keeps stores in order and
loads in order but may let a load pass an earlier store (the store buffer),
which is exactly the reordering Dekker cannot tolerate; so both sides put a
full fence between the store and the load (:func:`full_fence`). The
producer's fence costs an uncontended lock round trip, no syscall.

The producer clears the flag when it wakes the sleeper, so a burst of
records from one producer writes the eventfd once. An eventfd written while
the consumer was in fact already awake costs one spurious, harmless wake-up.

This module does not import trio: :meth:`EventFd.wait` imports it lazily so
that ``ipc`` stays free of an event-loop dependency.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
from collections.abc import Callable

__all__ = [
    "EventFd",
    "SleepFlag",
    "SleepFlags",
    "full_fence",
    "wait_for_work",
    "wake_if_sleeping",
]

# Acquiring and releasing an uncontended threading.Lock runs glibc's
# sem_trywait/sem_post, each a LOCK-prefixed read-modify-write, which x86
# defines as a full memory barrier (no load may pass an earlier store). Python
# exposes no cheaper fence without ctypes; the lock itself guards nothing.
# The bound methods are called directly: half the cost of a ``with`` block.
_FENCE = threading.Lock()
_fence_acquire = _FENCE.acquire
_fence_release = _FENCE.release


def full_fence() -> None:
    """Order every earlier store of this CPU before every later load."""
    _fence_acquire()
    _fence_release()


class EventFd:
    """A non-blocking Linux eventfd used as a counter of wake-ups.

    ``EventFd()`` creates one (close-on-exec: hand it to a child with
    ``pass_fds``); ``EventFd(fd=n)`` takes ownership of an inherited one.
    """

    __slots__ = ("_fd",)

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:
            os.set_blocking(fd, False)
        self._fd = fd

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("eventfd is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def wake(self) -> None:
        """Add 1 to the counter, making the fd readable. A saturated counter
        (EAGAIN) is already readable, so that is ignored."""
        try:  # not contextlib.suppress: this runs once per wake-up
            os.eventfd_write(self.fileno(), 1)
        except BlockingIOError:
            pass

    def drain(self) -> int:
        """Reset the counter; return how many wakes it held (0 if none)."""
        try:
            return os.eventfd_read(self.fileno())
        except BlockingIOError:
            return 0

    async def wait(self) -> int:
        """Sleep until woken, then drain; returns the drained count.

        Cancellation-safe: if cancelled while waiting nothing is consumed.
        """
        import trio  # lazily: ipc must not depend on trio at import time

        await trio.lowlevel.wait_readable(self.fileno())
        return self.drain()

    def wait_blocking(self, timeout: float | None = None) -> int:
        """Blocking :meth:`wait` for code without an event loop; 0 on timeout."""
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        if not poller.poll(None if timeout is None else timeout * 1000):
            return 0
        return self.drain()

    def close(self) -> None:
        """Close the fd (idempotent), first telling trio if a task waits on it."""
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        trio = sys.modules.get("trio")
        if trio is not None:
            with contextlib.suppress(RuntimeError):  # outside trio.run nobody waits
                trio.lowlevel.notify_closing(fd)
        os.close(fd)

    def __enter__(self) -> EventFd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventFd(fd={self._fd})"


class SleepFlag:
    """One byte in shared memory meaning "my consumer is about to sleep"."""

    __slots__ = ("_buf", "_offset")

    def __init__(self, buf: memoryview | bytearray, offset: int) -> None:
        view = buf if isinstance(buf, memoryview) else memoryview(buf)
        if not 0 <= offset < len(view):
            raise ValueError(f"flag offset {offset} outside a {len(view)}-byte buffer")
        self._buf = view
        self._offset = offset

    def set_sleeping(self) -> None:
        """Sleeper, step 1: announce; then re-check for work before waiting."""
        self._buf[self._offset] = 1
        full_fence()

    def clear(self) -> None:
        self._buf[self._offset] = 0

    def is_sleeping(self) -> bool:
        return self._buf[self._offset] != 0


class SleepFlags:
    """One sleeper's flags in several producers' regions (the supervisor's, one per worker):
    sleep is announced on all of them with one fence."""

    __slots__ = ("_flags",)

    def __init__(self) -> None:
        self._flags: list[SleepFlag] = []

    def add(self, flag: SleepFlag) -> None:
        self._flags.append(flag)

    def set_sleeping(self) -> None:
        """Sleeper, step 1, for every producer at once; then re-check for work."""
        for flag in self._flags:
            flag._buf[flag._offset] = 1
        full_fence()

    def clear(self) -> None:
        for flag in self._flags:
            flag._buf[flag._offset] = 0


def wake_if_sleeping(flag: SleepFlag, efd: EventFd) -> bool:
    """Producer, after publishing its records: wake the consumer only if it
    announced sleep. Returns True if the eventfd was written (one syscall)."""
    full_fence()
    if not flag.is_sleeping():
        return False
    flag.clear()
    efd.wake()
    return True


async def wait_for_work(flag: SleepFlag, efd: EventFd, has_work: Callable[[], bool]) -> None:
    """Sleeper side of the handshake: if ``has_work()`` is true after announcing sleep,
    return after a checkpoint (the loop calling this yields to its peers either way),
    else wait for a wake-up. The flag is clear on return."""
    flag.set_sleeping()
    if has_work():
        flag.clear()  # before yielding: a producer meanwhile must not write the eventfd
        import trio  # lazily, as EventFd.wait

        await trio.lowlevel.checkpoint()
        return
    try:
        await efd.wait()
    finally:
        flag.clear()
