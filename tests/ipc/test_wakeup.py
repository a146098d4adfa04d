from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from ipc.ring import HEADER_BYTES, Ring
from ipc.wakeup import EventFd, SleepFlag, SleepFlags, wait_for_work, wake_if_sleeping


@pytest.fixture
def efd() -> Iterator[EventFd]:
    with EventFd() as fd:
        yield fd


def test_drain_returns_the_number_of_wakes_and_empties_the_counter(efd: EventFd) -> None:
    """drain() reads the counter (how many wake() calls) and resets it; empty reads 0."""
    assert efd.drain() == 0
    efd.wake()
    efd.wake()
    assert efd.drain() == 2
    assert efd.drain() == 0


def test_eventfd_is_nonblocking_and_close_on_exec(efd: EventFd) -> None:
    """A created eventfd never blocks the loop and is not leaked into exec'd children."""
    assert os.get_blocking(efd.fileno()) is False
    assert os.get_inheritable(efd.fileno()) is False


def test_wrapping_an_inherited_fd_makes_it_nonblocking() -> None:
    """EventFd(fd=n) adopts an inherited eventfd: same counter, forced non-blocking."""
    raw = os.eventfd(0)  # blocking, like a careless parent might pass
    with EventFd(fd=raw) as adopted, EventFd(fd=os.dup(raw)) as other:
        assert os.get_blocking(raw) is False
        adopted.wake()
        assert other.drain() == 1
        assert other.drain() == 0  # would block forever on a blocking fd


def test_close_is_idempotent_and_fileno_then_fails() -> None:
    """close() may be called twice; a closed EventFd refuses to be used."""
    fd = EventFd()
    fd.close()
    fd.close()
    assert fd.closed
    with pytest.raises(ValueError):
        fd.wake()


def test_sleep_flag_is_one_byte_at_its_offset() -> None:
    """set_sleeping/clear write exactly the flag's byte; is_sleeping reads it."""
    buf = bytearray(256)
    a, b = SleepFlag(buf, 64), SleepFlag(buf, 128)
    a.set_sleeping()
    assert [i for i, v in enumerate(buf) if v] == [64]
    assert a.is_sleeping() and not b.is_sleeping()
    a.clear()
    assert not any(buf)


def test_sleep_flags_announce_and_clear_sleep_in_every_region() -> None:
    """One sleeper's flags in several regions: set_sleeping sets each flag's byte, clear clears
    them, and nothing else is written."""
    regions = [bytearray(256), bytearray(256)]
    flags = SleepFlags()
    for buf in regions:
        flags.add(SleepFlag(buf, 64))
    flags.set_sleeping()
    assert all(SleepFlag(buf, 64).is_sleeping() for buf in regions)
    assert all([i for i, v in enumerate(buf) if v] == [64] for buf in regions)
    flags.clear()
    assert not any(any(buf) for buf in regions)


def test_no_wake_syscall_when_the_consumer_is_not_sleeping(efd: EventFd) -> None:
    """A producer facing an awake consumer never writes the eventfd."""
    flag = SleepFlag(bytearray(1), 0)
    assert [wake_if_sleeping(flag, efd) for _ in range(100)] == [False] * 100
    assert efd.drain() == 0


def test_a_burst_to_a_sleeping_consumer_wakes_it_exactly_once(efd: EventFd) -> None:
    """The first record of a burst wakes a sleeper and clears its flag; the rest
    of the burst makes no syscall."""
    flag = SleepFlag(bytearray(1), 0)
    flag.set_sleeping()
    assert [wake_if_sleeping(flag, efd) for _ in range(10)] == [True] + [False] * 9
    assert not flag.is_sleeping()
    assert efd.drain() == 1


def make_ring() -> Ring:
    return Ring(bytearray(HEADER_BYTES + 256), init=True)


async def test_sleeper_waiting_on_the_eventfd_is_woken(efd: EventFd) -> None:
    """A consumer asleep in EventFd.wait() wakes when the producer publishes and
    calls wake_if_sleeping, and then finds the record."""
    ring = make_ring()
    flag = SleepFlag(bytearray(1), 0)
    got: list[bytes] = []

    async def consumer() -> None:
        while not got:
            got.extend(ring.get_all_nowait())
            if not got:
                await wait_for_work(flag, efd, lambda: not ring.is_empty())

    with trio.fail_after(10):  # a hang guard, not a timing assertion
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            assert flag.is_sleeping()
            ring.put_nowait(b"wake up")
            assert wake_if_sleeping(flag, efd)
    assert got == [b"wake up"]
    assert not flag.is_sleeping()


async def test_work_arriving_before_the_flag_is_set_is_not_slept_on(efd: EventFd) -> None:
    """A record published after the consumer saw an empty ring but before it set its
    flag is not woken for; the re-check after setting the flag catches it."""
    ring = make_ring()
    flag = SleepFlag(bytearray(1), 0)
    assert ring.get_all_nowait() == []  # consumer: empty...
    ring.put_nowait(b"late")  # ...producer publishes...
    assert not wake_if_sleeping(flag, efd)  # ...and sees nobody asleep
    with trio.fail_after(10):  # would hang here without the re-check
        await wait_for_work(flag, efd, lambda: not ring.is_empty())
    assert not flag.is_sleeping()
    assert ring.get_all_nowait() == [b"late"]


async def test_work_found_at_the_recheck_still_lets_other_tasks_run(efd: EventFd) -> None:
    """A loop that always finds work must not starve its peers: wait_for_work yields (a
    checkpoint) before returning, with the flag already clear so nobody wakes it meanwhile."""
    flag = SleepFlag(bytearray(1), 0)
    ran: list[bool] = []
    flag_while_yielded: list[bool] = []

    async def peer() -> None:
        flag_while_yielded.append(flag.is_sleeping())
        ran.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer)
        for _ in range(3):  # the busy loop
            await wait_for_work(flag, efd, lambda: True)
            if ran:
                break
    assert ran, "the peer never ran while wait_for_work kept finding work"
    assert flag_while_yielded == [False]
    assert efd.drain() == 0


async def test_cancelled_wait_consumes_no_wake(efd: EventFd) -> None:
    """Cancelling EventFd.wait() leaves the counter alone, and clears the sleep flag."""
    flag = SleepFlag(bytearray(1), 0)
    with trio.move_on_after(0.01):
        await wait_for_work(flag, efd, lambda: False)
    assert not flag.is_sleeping()
    efd.wake()
    assert efd.drain() == 1


async def test_closing_the_eventfd_wakes_its_waiter_with_an_error() -> None:
    """close() while a task waits on the fd tells trio, so the waiter gets
    ClosedResourceError instead of sleeping on a dead descriptor."""
    efd = EventFd()
    errors: list[BaseException] = []

    async def waiter() -> None:
        try:
            await efd.wait()
        except trio.ClosedResourceError as exc:
            errors.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            efd.close()
    assert len(errors) == 1
