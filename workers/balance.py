"""Least-connections accept on the listening socket every worker shares.

All workers wait on one listening socket. The kernel wakes each of them for a
new connection and the first to call accept() wins, which on an idle host is
usually the same worker every time: a client opening connections one after
another would put them all on one core. So each worker publishes how many
connections it holds (``Region.connections``, in its control block), and a
worker holding more than the least-loaded live peer stands back and lets that
peer accept. It stands back for ACCEPT_GRACE at most: a peer that is busy, or
has died and is being replaced, must not keep a client waiting.

A peer whose count is ``NOT_ACCEPTING`` (not started, dead, or shutting down)
is not a peer for this purpose.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ipc.region import NOT_ACCEPTING

__all__ = ["ACCEPT_GRACE", "ACCEPT_POLL", "AcceptBalance", "should_stand_back"]

ACCEPT_GRACE = 0.025  # longest a loaded worker leaves a pending connection to a peer
ACCEPT_POLL = 0.001  # how often it looks again whether the peer took it


def should_stand_back(own: int, counts: Sequence[int], own_index: int) -> bool:
    """True when a live peer (count not NOT_ACCEPTING) holds fewer connections than we do."""
    least = NOT_ACCEPTING
    for index, count in enumerate(counts):
        if index != own_index and count < least:
            least = count
    return least != NOT_ACCEPTING and own > least


class AcceptBalance:
    """One worker's view of every worker's connection count."""

    def __init__(self, own_index: int, counts: Callable[[], Sequence[int]]) -> None:
        self.own_index = own_index
        self._counts = counts

    def stand_back(self) -> bool:
        counts = self._counts()
        return should_stand_back(counts[self.own_index], counts, self.own_index)
