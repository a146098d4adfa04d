"""A channel's publisher confirms that wait for the worker's body log (persistent messages).

With ``shoal serve --data-dir`` a persistent message's header and body go to the worker's body
log (``ipc.logfile.BodyLog``) as it is published, and its basic.ack must not reach the client
before that log is synced up to it, whatever the supervisor says. The supervisor's ``Confirm``
events come in publish order, each for the next ``count`` publishes in confirm mode; the gate
lets a publish's confirm through only once the body of that publish (if it wrote one) is
synced, and holds every later one of the channel behind a held one: the client counts confirms
in publish order (acks and nacks alike). An event may be let through in part.

A channel makes its gate at its first persistent publish in confirm mode. A gate holding
events is in the worker's ``confirm_waiters``; after each sync the worker's sync task
(``Worker.body_synced``) has every waiting gate's channel take its due events back
(``Channel.release_confirms``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ipc import records as r
from ipc.logfile import BodyLog


class BodySyncGate:
    """One channel's confirms held until the body log is synced, in publish order. ``conn`` and
    ``ch`` name the channel (the worker routes a release to it); the gate holds no reference
    to it: the channel passes its count of confirms applied."""

    __slots__ = ("_log", "_waiters", "_waits", "ch", "conn", "held")

    def __init__(self, conn: int, ch: int, log: BodyLog, waiters: set[BodySyncGate]) -> None:
        self.conn = conn
        self.ch = ch
        self._log = log
        self._waiters = waiters  # the worker's gates that hold events
        # (publish sequence number, BodyLog.appended after its append) of each persistent
        # publish whose Confirm has not come yet, ascending.
        self._waits: deque[tuple[int, int]] = deque()
        self.held: deque[list[Any]] = deque()  # [ack, count] not applied yet, in order

    def expect(self, seq: int) -> None:
        """Publish ``seq`` has just appended its body: its confirm waits for that append's sync."""
        self._waits.append((seq, self._log.appended))

    def admit(self, ev: r.Confirm, confirmed: int) -> int:
        """How many of ``ev``'s confirms to apply now (``confirmed``: the channel's confirms
        applied so far); the rest are held until a sync lets :meth:`release` hand them back."""
        n = 0 if self.held else self._due_run(confirmed, ev.count)
        if n < ev.count:
            self.held.append([ev.ack, ev.count - n])
            self._waiters.add(self)
        return n

    def release(self, confirmed: int) -> list[tuple[bool, int]]:
        """The log was synced: ``(ack, count)`` of the held confirms now due, in order, for the
        channel to apply (``confirmed``: its confirms applied so far)."""
        held = self.held
        due: list[tuple[bool, int]] = []
        applied = confirmed
        while held:
            ack, count = held[0]
            n = self._due_run(applied, count)
            if n:
                due.append((ack, n))
                applied += n
            if n < count:
                held[0][1] = count - n
                break
            held.popleft()
        if not held:
            self._waiters.discard(self)
        return due

    def drop(self) -> None:
        """The channel closed: its held confirms are never sent."""
        self._waits.clear()
        self.held.clear()
        self._waiters.discard(self)

    def _due_run(self, confirmed: int, count: int) -> int:
        """How many of the ``count`` publishes after ``confirmed`` may be confirmed now, in order."""
        n = 0
        while n < count and self._due(confirmed + n + 1):
            n += 1
        return n

    def _due(self, seq: int) -> bool:
        """May the confirm of publish ``seq`` be applied? (Its wait is used up when it may.)"""
        waits = self._waits
        while waits and waits[0][0] < seq:  # not expected: one Confirm comes per publish
            waits.popleft()
        if waits and waits[0][0] == seq:
            if waits[0][1] > self._log.synced:
                return False
            waits.popleft()
        return True
