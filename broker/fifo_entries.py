"""A plain queue's available entries: the log from its head on, and the released ones before it.

Seed 001 models a subscription as a pointer into the queue that only moves back when a
message is released. Without selectors every acquiring consumer's pointer is the same -- the
first available entry -- so the plain queue keeps one head for all of them:

* ``log`` holds the never-acquired entries from index ``head`` on. Acquisition only ever
  takes the first available entry, so the live part of the log is a run of *consecutive*
  positions: the entry at position ``p`` is ``log[head + p - first]``, O(1).
* ``released`` is a heap of released entries, keyed by their original position. A released
  entry was acquired from below the head, so its position is below every log entry: the next
  entry for an acquiring consumer is the heap's minimum if there is one, else the log head
  (seed 001: "the next entry that that subscriber sees is the returned message").
* browsers keep their own pointer (``QueueConsumer.browse_position``) and never rewind: their
  next entry is the first available one *after* the pointer (:mod:`broker.browsing`, which
  also searches the queue's acquired entries).

Every operation is O(1) (O(log r) for r released entries), :meth:`FifoEntries.bury` included:
the lists go to the host's :class:`broker.graveyard.Graveyard` whole, which lets go of their
messages a slice at a time between other work (Overload: no single operation may hold the
supervisor for long).

Called from: the supervisor process (``broker.queue``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from broker.browsing import Browsable, browse, next_after
from broker.consumer_manager import QueueConsumer
from broker.message import Message
from broker.queue_host import QueueHost

# Drop the consumed prefix of the log once it is this long and at least half of the list.
_COMPACT_AT = 4096

_Entry = TypeVar("_Entry", bound=Browsable)  # broker.queue.QueueEntry


class FifoEntries(Generic[_Entry]):
    """The available entries of a plain queue, in the order acquiring consumers take them."""

    __slots__ = ("head", "log", "released")

    def __init__(self) -> None:
        # Entries from head on; the consumed slots before it are None (so that a compaction,
        # a purge or a delete never deallocates a run of entries at once).
        self.log: list[_Entry | None] = []
        self.head = 0
        self.released: list[tuple[int, _Entry]] = []

    def __len__(self) -> int:
        return len(self.released) + len(self.log) - self.head

    def append(self, entry: _Entry) -> None:
        """A new entry, at the end."""
        self.log.append(entry)

    def put_back(self, entry: _Entry) -> None:
        """A released entry, back at its original position (before every log entry)."""
        heapq.heappush(self.released, (entry.position, entry))

    def take(self) -> _Entry | None:
        """The next entry for an acquiring consumer, taken off; None when there is none."""
        if self.released:
            return heapq.heappop(self.released)[1]
        head = self.head
        log = self.log
        if head >= len(log):
            return None
        entry = log[head]
        log[head] = None  # the entry lives on in the queue's acquired map while it must
        head += 1
        self.head = head
        if head == len(log) or head >= _COMPACT_AT:  # the hot path skips the call
            self._compact()
        return entry

    def _compact(self) -> None:
        # Amortised O(1): each consumed slot is dropped once.
        if self.head == len(self.log):
            self.log.clear()
            self.head = 0
        elif self.head >= _COMPACT_AT and self.head * 2 >= len(self.log):
            del self.log[: self.head]
            self.head = 0

    def bury(self, host: QueueHost[Any], on_drop: Callable[[Message], None] | None) -> None:
        """Hand every entry to the host's graveyard; none are left. O(1)."""
        if self.released:
            host.bury(self.released, pick=1, on_drop=on_drop)
            self.released = []
        if self.log:
            host.bury(self.log, keep=self.head, on_drop=on_drop)
            self.log = []
            self.head = 0

    def entries(self) -> list[_Entry]:
        """The entries in position order (introspection; O(n))."""
        released = [entry for _, entry in sorted(self.released, key=_first)]
        return released + self.log[self.head:]  # type: ignore[operator]  # no None from head on

    def next_after(self, acquired: Mapping[int, _Entry], position: int) -> _Entry | None:
        """The first entry still on the queue past ``position``, ``acquired`` ones included."""
        return next_after(self.log, self.head, self.released, acquired, position)

    def browse(self, consumer: QueueConsumer, max_n: int,
               acquired: Mapping[int, _Entry]) -> tuple[list[_Entry], bool]:
        """:func:`broker.browsing.browse` over these entries and ``acquired``."""
        return browse(consumer, max_n, self.log, self.head, self.released, acquired)


def _first(item: tuple[int, Any]) -> int:
    return item[0]
