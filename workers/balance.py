"""Least-connections accept on the listening socket every worker shares.

All workers wait on one listening socket. The kernel wakes each of them for a
new connection and the first to call accept() wins, which on an idle host is
usually the same worker every time: a client opening connections one after
another would put them all on one core. So each worker publishes how many
connections it holds (``Region.connections``, in its control block), and a
worker holding more than the least-loaded peer stands back and lets that peer
accept:

* a **live** peer (a count >= 0) holding fewer: stand back for ACCEPT_GRACE at
  most, so a peer that is busy, or has just died, does not keep a client
  waiting;
* a **starting** peer (a starting mark: the supervisor has just started or is
  restarting its worker; the peer will hold 0): a worker holding any
  connection stands back until the peer accepts or the mark's deadline passes,
  whichever comes first. A Python worker takes about half a second to start
  (more under load), so without this every connection opened while a worker
  starts -- a broker just started, a fleet of clients reconnecting after a
  worker crash -- would pile onto the workers already up and stay there. The
  supervisor sets the deadline (``shoal serve --start-grace``) and does not
  mark a worker that keeps failing to start, so a crash loop cannot hold
  connections back; MAX_START_WAIT bounds one connection's wait whatever the
  mark says.

A peer whose count is ``NOT_ACCEPTING`` (stopping, dead and not waited for),
or whose starting deadline has passed, is not a peer for this purpose.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Sequence

from ipc.region import NOT_ACCEPTING

__all__ = [
    "ACCEPT_GRACE", "ACCEPT_POLL", "MAX_START_WAIT", "START_POLL", "AcceptBalance", "StandBack",
    "stand_back",
]

ACCEPT_GRACE = 0.025  # longest a loaded worker leaves a pending connection to a live peer
ACCEPT_POLL = 0.001  # how often it looks again whether the peer took it
START_POLL = 0.005  # the same while waiting for a starting peer (it takes ~0.5 s or more)
MAX_START_WAIT = 60.0  # longest one connection waits for starting peers, whatever their marks say

_NS = 1_000_000_000


class StandBack(enum.IntEnum):
    """Why a worker leaves the pending connection to a peer (falsy: it does not)."""

    NO = 0
    LIVE_PEER = 1  # a live peer holds fewer connections
    STARTING_PEER = 2  # a peer is starting, and we hold more than its 0


def stand_back(own: int, counts: Sequence[int], own_index: int, now_ns: int) -> StandBack:
    """Whether a worker holding ``own`` connections leaves the next one to a peer.

    ``counts`` are every worker's ``Region.connections``; ``now_ns`` is
    ``time.monotonic_ns()``, against which starting marks' deadlines are read.
    A starting peer outranks a live one: its wait is the longer.
    """
    least = NOT_ACCEPTING
    starting = False
    for index, count in enumerate(counts):
        if index == own_index:
            continue
        if count < 0:  # a starting mark: -deadline
            starting = starting or -count > now_ns
        elif count < least:
            least = count
    if starting and own > 0:
        return StandBack.STARTING_PEER
    if least != NOT_ACCEPTING and own > least:
        return StandBack.LIVE_PEER
    return StandBack.NO


class AcceptBalance:
    """One worker's view of every worker's connection count."""

    def __init__(
        self,
        own_index: int,
        counts: Callable[[], Sequence[int]],
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.own_index = own_index
        self._counts = counts
        self._clock = clock

    def stand_back(self) -> StandBack:
        counts = self._counts()
        return stand_back(counts[self.own_index], counts, self.own_index, self._clock())

    async def wait_turn(self, sleep: Callable[[float], Awaitable[object]]) -> None:
        """A connection is pending: return when this worker should accept it.

        That is at once when no peer should take it first; once peers have had
        their grace (ACCEPT_GRACE since a live peer became the reason,
        the starting peer's deadline, MAX_START_WAIT in all); or earlier, as soon
        as the counts say so (a peer took it, or came up and is level with us).
        """
        clock = self._clock
        started = clock()
        live_since: int | None = None
        while True:
            reason = self.stand_back()
            now = clock()
            if reason is StandBack.NO:
                return
            if reason is StandBack.STARTING_PEER:
                if now - started >= MAX_START_WAIT * _NS:
                    return
                live_since = None
                await sleep(START_POLL)
            else:
                if live_since is None:
                    live_since = now
                elif now - live_since >= ACCEPT_GRACE * _NS:
                    return
                await sleep(ACCEPT_POLL)
