"""Least-connections accept (workers.balance): who stands back, without processes."""

from __future__ import annotations

from ipc.region import NOT_ACCEPTING
from workers.balance import AcceptBalance, should_stand_back


def test_a_worker_with_more_connections_than_a_live_peer_stands_back() -> None:
    assert should_stand_back(3, [3, 2], own_index=0)
    assert should_stand_back(1, [5, 1, 0], own_index=1)


def test_a_worker_at_the_least_count_accepts() -> None:
    assert not should_stand_back(2, [2, 2], own_index=0)
    assert not should_stand_back(0, [4, 0, 7], own_index=1)
    assert not should_stand_back(1, [1, 3], own_index=0)


def test_peers_not_accepting_are_ignored() -> None:
    """A dead, starting or stopping peer must not hold connections back."""
    assert not should_stand_back(9, [9, NOT_ACCEPTING], own_index=0)
    assert not should_stand_back(5, [NOT_ACCEPTING, 5, NOT_ACCEPTING], own_index=1)
    assert should_stand_back(5, [NOT_ACCEPTING, 5, 4], own_index=1)


def test_a_single_worker_never_stands_back() -> None:
    assert not should_stand_back(100, [100], own_index=0)


def test_accept_balance_reads_the_counts_each_time() -> None:
    counts = [2, 1]
    balance = AcceptBalance(0, lambda: counts)
    assert balance.stand_back()
    counts[1] = 2  # the peer took the pending connection
    assert not balance.stand_back()
    counts[1] = NOT_ACCEPTING  # ... and then died
    assert not balance.stand_back()
