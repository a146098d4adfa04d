"""Least-connections accept (workers.balance): who stands back, and for how long, without
processes. Time is a fake clock advanced by the fake sleep, so nothing here depends on how
fast the machine is."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
import trio

from ipc.region import (
    NOT_ACCEPTING,
    Region,
    new_instance_id,
    region_name,
    starting_deadline,
)
from workers.balance import (
    ACCEPT_GRACE,
    MAX_START_WAIT,
    AcceptBalance,
    StandBack,
    stand_back,
)

NS = 1_000_000_000
NOW = 1000 * NS


def starting(seconds_left: float) -> int:
    """A starting mark whose deadline is `seconds_left` after NOW (negative: already passed)."""
    return -(NOW + int(seconds_left * NS))


def test_a_worker_with_more_connections_than_a_live_peer_stands_back() -> None:
    assert stand_back(3, [3, 2], 0, NOW) is StandBack.LIVE_PEER
    assert stand_back(1, [5, 1, 0], 1, NOW) is StandBack.LIVE_PEER


def test_a_worker_at_the_least_count_accepts() -> None:
    assert stand_back(2, [2, 2], 0, NOW) is StandBack.NO
    assert stand_back(0, [4, 0, 7], 1, NOW) is StandBack.NO
    assert stand_back(1, [1, 3], 0, NOW) is StandBack.NO


def test_peers_not_accepting_are_ignored() -> None:
    """A stopping peer, or a dead one the supervisor does not wait for, holds nothing back."""
    assert stand_back(9, [9, NOT_ACCEPTING], 0, NOW) is StandBack.NO
    assert stand_back(5, [NOT_ACCEPTING, 5, NOT_ACCEPTING], 1, NOW) is StandBack.NO
    assert stand_back(5, [NOT_ACCEPTING, 5, 4], 1, NOW) is StandBack.LIVE_PEER


def test_a_worker_holding_connections_stands_back_for_a_starting_peer() -> None:
    """A starting peer will hold 0: whoever holds more leaves the connection to it."""
    assert stand_back(1, [1, starting(1.0)], 0, NOW) is StandBack.STARTING_PEER
    assert stand_back(7, [starting(0.5), 7, 3], 1, NOW) is StandBack.STARTING_PEER
    assert stand_back(3, [starting(0.5), 7, 3], 2, NOW) is StandBack.STARTING_PEER


def test_a_worker_holding_nothing_accepts_while_a_peer_starts() -> None:
    """The first worker up takes the first connection; so does each worker that starts."""
    assert stand_back(0, [0, starting(1.0)], 0, NOW) is StandBack.NO
    assert stand_back(0, [starting(1.0), 0, starting(1.0)], 1, NOW) is StandBack.NO


def test_a_starting_peer_past_its_deadline_is_ignored() -> None:
    """A worker that has not come up by its deadline no longer holds connections back."""
    assert stand_back(4, [4, starting(0.0)], 0, NOW) is StandBack.NO
    assert stand_back(4, [4, starting(-3.0)], 0, NOW) is StandBack.NO
    assert stand_back(4, [4, starting(-3.0), 2], 0, NOW) is StandBack.LIVE_PEER


def test_a_starting_peer_outranks_a_live_one() -> None:
    """Its wait is the longer: a worker with more than a live peer and a starting one waits
    for the starting one (the live peer, holding more than 0, waits for it too)."""
    assert stand_back(3, [3, 1, starting(1.0)], 0, NOW) is StandBack.STARTING_PEER
    assert stand_back(1, [3, 1, starting(1.0)], 1, NOW) is StandBack.STARTING_PEER


def test_a_single_worker_never_stands_back() -> None:
    assert stand_back(100, [100], 0, NOW) is StandBack.NO


# ------------------------------------------------------------------ the mark in the region


def test_the_supervisor_marks_a_region_starting_for_a_grace(region: Region) -> None:
    """mark_starting is one store of a negative number, read by a peer as a deadline that far
    ahead; the worker's first count replaces it; a grace of 0 means not waited for."""
    with Region.attach(region.name) as peer:
        region.mark_starting(2.0)
        deadline = starting_deadline(peer.connections)
        assert deadline is not None and peer.connections < 0
        assert stand_back(1, [1, peer.connections], 0, deadline - NS) is StandBack.STARTING_PEER
        assert stand_back(1, [1, peer.connections], 0, deadline) is StandBack.NO
        region.connections = 0  # the worker is up
        assert starting_deadline(peer.connections) is None
        region.mark_starting(0)
        assert peer.connections == NOT_ACCEPTING
    assert starting_deadline(NOT_ACCEPTING) is None
    assert starting_deadline(0) is None


# ------------------------------------------------------------------ how long a worker waits


class FakeTime:
    """A monotonic_ns clock that moves only when the code under test sleeps; `on_sleep` lets a
    test change the counts as time passes (a peer taking the connection, coming up)."""

    def __init__(self, counts: list[int], on_sleep: Callable[[FakeTime], None] = lambda t: None):
        self.now = NOW
        self.counts = counts
        self.on_sleep = on_sleep
        self.sleeps = 0

    def clock(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += int(seconds * NS)
        self.on_sleep(self)

    def elapsed(self) -> float:
        return (self.now - NOW) / NS

    def wait_turn(self, own_index: int = 0) -> None:
        balance = AcceptBalance(own_index, lambda: self.counts, self.clock)
        trio.run(balance.wait_turn, self.sleep)


def test_accept_balance_reads_the_counts_each_time() -> None:
    counts = [2, 1]
    balance = AcceptBalance(0, lambda: counts, lambda: NOW)
    assert balance.stand_back() is StandBack.LIVE_PEER
    counts[1] = 2  # the peer took the pending connection
    assert not balance.stand_back()
    counts[1] = NOT_ACCEPTING  # ... and then stopped
    assert not balance.stand_back()
    counts[1] = starting(1.0)  # ... and is being replaced
    assert balance.stand_back() is StandBack.STARTING_PEER


def test_no_reason_to_stand_back_means_no_wait() -> None:
    time = FakeTime([1, 1])
    time.wait_turn()
    assert time.sleeps == 0


def test_a_live_peer_that_does_not_take_the_connection_gets_accept_grace() -> None:
    time = FakeTime([3, 1])
    time.wait_turn()
    assert time.elapsed() == pytest.approx(ACCEPT_GRACE, abs=0.002)


def test_the_wait_ends_when_a_live_peer_takes_the_connection() -> None:
    def peer_accepts(t: FakeTime) -> None:
        if t.sleeps == 3:
            t.counts[1] = 2

    time = FakeTime([2, 1], peer_accepts)
    time.wait_turn()
    assert time.sleeps == 3


def test_a_starting_peer_is_waited_for_until_it_comes_up() -> None:
    """Longer than ACCEPT_GRACE: the worker waits while its peer starts; once the peer
    accepts and is level with it, it accepts the next connection itself."""
    def comes_up_then_accepts(t: FakeTime) -> None:
        if t.elapsed() >= 0.8 and t.counts[1] < 0:
            t.counts[1] = 0  # up
        elif t.counts[1] == 0 and t.elapsed() >= 0.81:
            t.counts[1] = 1  # took the pending connection

    time = FakeTime([1, starting(2.0)], comes_up_then_accepts)
    time.wait_turn()
    assert time.counts == [1, 1]
    assert 0.8 <= time.elapsed() < 0.9


def test_a_peer_that_comes_up_but_does_not_accept_gets_a_fresh_accept_grace() -> None:
    def comes_up(t: FakeTime) -> None:
        if t.elapsed() >= 0.5 and t.counts[1] < 0:
            t.counts[1] = 0

    time = FakeTime([1, starting(2.0)], comes_up)
    time.wait_turn()
    assert time.counts == [1, 0]
    assert time.elapsed() == pytest.approx(0.5 + ACCEPT_GRACE, abs=0.01)


def test_a_starting_peer_that_never_comes_up_is_waited_for_until_its_deadline_only() -> None:
    time = FakeTime([5, starting(1.5)])
    time.wait_turn()
    assert time.elapsed() == pytest.approx(1.5, abs=0.01)


def test_no_starting_mark_holds_a_connection_longer_than_max_start_wait() -> None:
    time = FakeTime([5, starting(10 * MAX_START_WAIT)])
    time.wait_turn()
    assert time.elapsed() == pytest.approx(MAX_START_WAIT, abs=0.01)


@pytest.mark.parametrize(
    ("counts", "own_index"),
    [([0, starting(1.0)], 0), ([NOT_ACCEPTING, 4], 1), ([3, starting(-1.0)], 0), ([2], 0)],
)
def test_cases_that_accept_at_once(counts: Sequence[int], own_index: int) -> None:
    time = FakeTime(list(counts))
    time.wait_turn(own_index)
    assert time.sleeps == 0


@pytest.fixture
def region() -> Iterator[Region]:
    created = Region.create(region_name(new_instance_id(), 0), ring_bytes=8192, slots=8,
                            arena_bytes=8192)
    yield created
    created.close()
    created.unlink()
