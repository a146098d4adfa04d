"""A featured queue's entries in arrival order: what browsers see (Qpid's Message Delivery).

The heaps of :mod:`broker.queues.featured.featured_queue` keep entries in delivery order (priority, groups,
holds), so browsers -- who see arrival order and never rewind -- read this list instead. It
holds every entry by position; deleted entries are pruned lazily, one window of the list at a
time, so that no single delete pays for a list of a million entries.

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable

from broker.messages.message import Message
from broker.queues.entry_state import ACQUIRED, AVAILABLE, DELETED
from broker.queues.queue_entry import QueueEntry

# What a browser sees: the queue's contents, acquired-but-unsettled entries included.
_BROWSABLE = frozenset((AVAILABLE, ACQUIRED))

# The list is compacted while more than _COMPACT_AT and half of its entries are deleted: one
# window of _COMPACT_WINDOW entries per _COMPACT_EVERY deletes (each window removes more than
# it costs, and no delete pays for a whole list of a million entries).
_COMPACT_AT = 1024
_COMPACT_WINDOW = 4096
_COMPACT_EVERY = 1024
_position = operator.attrgetter("position")  # the sort key of the list


class ArrivalOrder:
    """Every entry of a featured queue by position, deleted ones pruned a window at a time."""

    __slots__ = ("_cursor", "_dead", "_debt", "entries")

    def __init__(self, entries: Iterable[QueueEntry] = ()) -> None:
        self.entries: list[QueueEntry] = sorted(entries, key=_position)
        self._dead = 0  # deleted entries still in the list
        self._debt = 0  # deletes since the last compaction window
        self._cursor = 0  # where the next compaction window starts

    def append(self, entry: QueueEntry) -> None:
        """A new entry: its position is the highest yet."""
        self.entries.append(entry)

    def deleted(self) -> None:
        """One more entry was deleted: compact a window when enough have been."""
        self._dead += 1
        if self._dead > _COMPACT_AT and self._dead * 2 > len(self.entries):
            self._debt += 1
            if self._debt >= _COMPACT_EVERY:
                self._debt = 0
                self._compact()

    def next_after(self, position: int) -> QueueEntry | None:
        """The first entry still on the queue past ``position`` (a browser's next):
        available or acquired, as a browser sees the queue's contents."""
        order = self.entries
        for index in range(bisect.bisect_right(order, position, key=_position), len(order)):
            if order[index].state in _BROWSABLE:
                return order[index]
        return None

    def browse(self, position: int, max_n: int) -> list[QueueEntry]:
        """Up to ``max_n`` browsable entries past ``position``, in arrival order."""
        order = self.entries
        seen: list[QueueEntry] = []
        index = bisect.bisect_right(order, position, key=_position)
        while index < len(order) and len(seen) < max_n:
            if order[index].state in _BROWSABLE:
                seen.append(order[index])
            index += 1
        return seen

    def stored_in(self, file: int, limit: int, ttl: bool) -> list[tuple[Message, bool]] | None:
        """The messages whose E record is in index file ``file``, each with whether it was
        delivered, in arrival order (every entry is here, acquired ones too). None when more
        than ``limit`` are found, or one of them has a TTL (``ttl``: the queue's): its E
        record says when it was enqueued, which the queue does not keep."""
        found: list[tuple[Message, bool]] = []
        for entry in self.entries:
            if entry.state is DELETED:
                continue
            stored = entry.message.stored
            if stored is None or stored[5] < file:
                continue
            if stored[5] > file:
                if entry.state is not ACQUIRED:
                    return found
                continue
            if ttl or entry.message.expiration is not None:
                return None
            found.append((entry.message, entry.state is ACQUIRED or entry.redelivered))
            if len(found) > limit:
                return None
        return found

    def _compact(self) -> None:
        """Remove the deleted entries of one window, the next window next time (round the
        list): O(_COMPACT_WINDOW) and a memmove of the rest of the list."""
        order = self.entries
        start = self._cursor if self._cursor < len(order) else 0
        stop = start + _COMPACT_WINDOW
        window = order[start:stop]
        live = [e for e in window if e.state is not DELETED]
        if len(live) < len(window):
            order[start:stop] = live
            self._dead -= len(window) - len(live)
        self._cursor = start + len(live)
