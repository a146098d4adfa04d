"""Browsers' positions: where a browser goes next, and which browsers an entry concerns (seed 001).

Browsers see the queue's contents -- available entries and acquired ones not yet settled -- in
position order, keep their own pointer (``QueueConsumer.browse_position``) and never rewind, so
an entry that becomes available concerns only the browsers whose pointer is still before it
(:func:`browsers_before`, for every kind of queue).

A plain :class:`broker.queue.Queue` holds its entries in three places: the log from its head on
(consecutive positions), the heap of released entries and the acquired entries, both below the
log head. :func:`next_after` and :func:`browse` find a browser's next entries across the three
without merging them. (A featured queue keeps its own arrival order: broker.arrival_order.)

Called from: the supervisor process (``broker.queue``, ``broker.featured_queue``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from broker.consumer_manager import QueueConsumer, QueueConsumerManager
from broker.entry_state import new_entry_id


class Browsable(Protocol):
    """What browsing reads of an entry (broker.queue.QueueEntry), and the id it draws."""

    id: int
    position: int


_Entry = TypeVar("_Entry", bound=Browsable)


def _position(entry: Browsable) -> int:
    return entry.position


def browsers_before(consumers: QueueConsumerManager, position: int) -> list[QueueConsumer]:
    """The interested browsers whose pointer is before ``position``: those to tell of an entry
    that became available there (released, or made available late)."""
    if not consumers.has_non_acquiring:
        return []
    return [b for b in consumers.iter_non_acquiring() if b.browse_position < position]


def next_after(
    log: Sequence[_Entry | None],
    head: int,
    released: Sequence[tuple[int, _Entry]],
    acquired: Mapping[int, _Entry],
    position: int,
) -> _Entry | None:
    """The first entry still on the queue past ``position`` (a browser's next).

    Browsers see the queue's contents: available entries and acquired ones not
    yet settled, so what a browser sees does not depend on whether an acquiring
    consumer pulled first. Acquired entries all sit below the log head; they
    are only searched when the browser lags behind it."""
    best: _Entry | None = None
    for released_position, entry in released:  # few: released entries go first
        if released_position > position and (best is None or released_position < best.position):
            best = entry
    first = log[head] if head < len(log) else None  # never None from the head on
    if acquired and (first is None or first.position > position + 1):
        taken = first_acquired_after(acquired, position)
        if taken is not None and (best is None or taken.position < best.position):
            best = taken
    if first is None:
        return best
    if best is not None and best.position < first.position:
        return best
    index = head + max(0, position + 1 - first.position)
    return log[index] if index < len(log) else best


def first_acquired_after(acquired: Mapping[int, _Entry], position: int) -> _Entry | None:
    """The acquired entry with the lowest position past ``position``: O(acquired entries)."""
    after = [e for e in acquired.values() if e.position > position]
    return min(after, key=_position) if after else None


def browse(
    consumer: QueueConsumer,
    max_n: int,
    log: Sequence[_Entry | None],
    head: int,
    released: Sequence[tuple[int, _Entry]],
    acquired: Mapping[int, _Entry],
) -> tuple[list[_Entry], bool]:
    """Up to ``max_n`` entries past the browser's pointer, which moves past them; and whether
    more follow (a plain queue's storage, see :func:`next_after`).

    Each entry gets its id here if it has none yet: a plain queue draws it when the entry is
    first handed out (broker.queue.QueueEntry).
    """
    seen: list[_Entry] = []
    position = consumer.browse_position
    while len(seen) < max_n:
        entry = next_after(log, head, released, acquired, position)
        if entry is None:
            break
        if not entry.id:
            entry.id = new_entry_id()
        seen.append(entry)
        position = entry.position
    consumer.browse_position = position
    return seen, len(seen) == max_n and next_after(log, head, released, acquired, position) is not None
