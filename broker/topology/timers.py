"""Queue deadlines of one virtual host: when each queue's tick is next due.

A queue asks for a tick at a deadline (a TTL at its head, a held message, an x-expires lease)
through :meth:`VirtualHost.schedule`; an earlier request replaces a later one. The heap keeps
superseded entries and skips them lazily, so a reschedule is O(log n) and never a search.
Called from: the supervisor process (``broker.topology.step_host``, for ``broker.topology.vhost``).
"""

from __future__ import annotations

import heapq
import itertools

from broker.queues.queue import Queue


class Timers:
    """A heap of ``(deadline, tiebreak, queue)`` and the one deadline that counts per queue."""

    __slots__ = ("_deadlines", "_scheduled", "_tiebreak")

    def __init__(self) -> None:
        self._deadlines: list[tuple[float, int, Queue]] = []
        self._scheduled: dict[Queue, float] = {}
        self._tiebreak = itertools.count()

    def schedule(self, queue: Queue, deadline: float) -> None:
        """Tick ``queue`` at ``deadline`` unless it is due as early already (earlier wins)."""
        current = self._scheduled.get(queue)
        if current is not None and current <= deadline:
            return
        self._scheduled[queue] = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), queue))

    def cancel(self, queue: Queue) -> None:
        """``queue`` is gone: its heap entries are skipped from now on."""
        self._scheduled.pop(queue, None)

    def next_deadline(self) -> float | None:
        """The earliest deadline that still counts, or None."""
        deadlines = self._deadlines
        while deadlines:
            deadline, _, queue = deadlines[0]
            if self._scheduled.get(queue) == deadline:
                return deadline
            heapq.heappop(deadlines)  # superseded, or the queue is gone
        return None

    def pop_due(self, now: float, limit: int) -> list[tuple[float, Queue]]:
        """Take up to ``limit`` queues due by ``now``, earliest first, with their deadlines."""
        deadlines = self._deadlines
        due: list[tuple[float, Queue]] = []
        while deadlines and deadlines[0][0] <= now and len(due) < limit:
            deadline, _, queue = heapq.heappop(deadlines)
            if self._scheduled.get(queue) == deadline:
                del self._scheduled[queue]
                due.append((deadline, queue))
        return due
