"""Where a queue entry is in its life, and the ids that name entries across every queue.

Its own module so that :mod:`broker.queues.queue` and :mod:`broker.queues.graveyard` (which marks the
entries it drops deleted) share it without importing each other.
"""

from __future__ import annotations

import enum
import itertools


class EntryState(enum.Enum):
    """Where a queue entry is in its life (Qpid: QueueEntry available / acquired / deleted)."""

    AVAILABLE = "available"
    HELD = "held"  # Qpid: "held" -- not available before its not-valid-before time
    ACQUIRED = "acquired"
    DELETED = "deleted"


AVAILABLE = EntryState.AVAILABLE
HELD = EntryState.HELD
ACQUIRED = EntryState.ACQUIRED
DELETED = EntryState.DELETED

# Entry ids are unique across every queue of the process: the runtime uses them as handles.
_entry_ids = itertools.count(1)
new_entry_id = _entry_ids.__next__


class Packed:
    """The type of :data:`PACKED` (one value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PACKED"


# A plain queue's log slot whose message is kept as its body handle's two words, in arrays
# beside the log (broker.queues.fifo_entries; the graveyard reads them back when the log is buried).
PACKED = Packed()
