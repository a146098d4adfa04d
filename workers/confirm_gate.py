"""A channel's publisher confirms that wait for the worker's body log (persistent messages).

With ``shoal serve --data-dir`` a persistent message's header and body go to the worker's body
log (``ipc.logfile.BodyLog``) as it is published, and its basic.ack must not reach the client
before that log is synced up to it, whatever the supervisor says. The supervisor's ``Confirm``
events come in publish order, one per publish in confirm mode; the gate lets one through only
once the body of its publish (if it wrote one) is synced, and holds every later one of the
channel behind a held one: the client counts confirms in publish order (acks and nacks alike).

A channel makes its gate at its first persistent publish in confirm mode. A gate holding
events is in the worker's ``confirm_waiters``; after each sync the worker's sync task
(``Worker.body_synced``) has every waiting gate's channel take its due events back
(``Channel.release_confirms``).
"""

from __future__ import annotations

from collections import deque

from ipc import records as r
from ipc.logfile import BodyLog


class ConfirmGate:
    """One channel's confirms held until the body log is synced, in publish order. ``conn`` and
    ``ch`` name the channel (the worker routes a release to it); the gate holds no reference
    to it: the channel passes its count of confirms applied."""

    __slots__ = ("_log", "_waiters", "_waits", "ch", "conn", "held")

    def __init__(self, conn: int, ch: int, log: BodyLog, waiters: set[ConfirmGate]) -> None:
        self.conn = conn
        self.ch = ch
        self._log = log
        self._waiters = waiters  # the worker's gates that hold events
        # (publish sequence number, BodyLog.appended after its append) of each persistent
        # publish whose Confirm has not come yet, ascending.
        self._waits: deque[tuple[int, int]] = deque()
        self.held: deque[r.Confirm] = deque()  # Confirm events not applied yet, in order

    def expect(self, seq: int) -> None:
        """Publish ``seq`` has just appended its body: its confirm waits for that append's sync."""
        self._waits.append((seq, self._log.appended))

    def admit(self, ev: r.Confirm, confirmed: int) -> bool:
        """True: apply ``ev`` now (``confirmed``: the channel's confirms applied so far).
        False: it is held until a sync lets :meth:`release` hand it back."""
        if not self.held and self._due(confirmed + 1):
            return True
        self.held.append(ev)
        self._waiters.add(self)
        return False

    def release(self, confirmed: int) -> list[r.Confirm]:
        """The log was synced: the held events now due, in order, for the channel to apply
        (``confirmed``: its confirms applied so far; each event applied adds one)."""
        held = self.held
        due: list[r.Confirm] = []
        while held and self._due(confirmed + len(due) + 1):
            due.append(held.popleft())
        if not held:
            self._waiters.discard(self)
        return due

    def drop(self) -> None:
        """The channel closed: its held confirms are never sent."""
        self._waits.clear()
        self.held.clear()
        self._waiters.discard(self)

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
