"""What purged and deleted queues let go of, dropped a slice at a time (Overload).

Called from: the supervisor process (the virtual host, as a queue's host).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from broker.messages.message import Message, PlainMessage, drop_reference
from broker.queues.entry_state import DELETED, PACKED
from broker.queues.sliced_work import SlicedWork

# A plain queue's arrays beside its log, and the runtime's function making a handle of two of
# their words (broker.queues.fifo_entries, broker.queues.queue_host.BodyCodec.handle).
Words = tuple[Any, Any, Callable[[int, int], Any]]

# Letting go of a container's slot (a None, an object whose last reference it was, a dict item)
# costs about this many times less than dropping an entry.
DISMANTLE_PER_DROP = 8


REAP = "reap"  # the budget of a step's graveyard work (broker.queues.sliced_work)


class Graveyard:
    """Entries of purged and deleted queues whose messages are still to be let go of.

    queue.purge and queue.delete answer at once (with the message count, as RabbitMQ does);
    the containers that held the entries are handed over whole (:meth:`bury`) and
    :meth:`reap` works them off a slice at a time, in the order they were buried: each entry is
    marked deleted and its message reference dropped (``on_drop`` -- the body freed -- on the
    last one), exactly once. Containers whose contents only need deallocating (a featured
    queue's index of entries, its per-entry dicts) are handed over too (:meth:`discard`):
    freeing a million objects at once costs about as much as dropping them.

    What a plain queue buries is its log (``broker.queues.fifo_entries``): besides entries, waiting
    messages, and body handles that stand for a plain message only that queue held -- as ints,
    or ``PACKED`` with the handle's two words in arrays beside the log (``words``); its
    ``on_drop`` gets a message made for the handle. Nothing else sees a buried entry: the
    queue no longer holds it, and delivered entries are never buried (they stay with their
    channel until settled). Until it is reaped a buried entry still holds its body, so an
    arena sweep must count it live (:meth:`body_refs`).

    Its work waits in the ``REAP`` line of ``work`` (the virtual host's sliced work), beside
    other jobs deferred there (:meth:`defer`), in one order.
    """

    def __init__(self, work: SlicedWork | None = None) -> None:
        self.work = work if work is not None else SlicedWork(**{REAP: 0})
        self.pending = 0  # buried entries whose message reference is not dropped yet

    def __bool__(self) -> bool:
        return self.work.pending(REAP)

    def bury(self, items: list[Any], *, pick: int | None = None, keep: int = 0,
             on_drop: Callable[[Message], None] | None, words: Words | None = None) -> None:
        """Take ``items[keep:]`` (entries, or heap tuples whose ``[pick]`` is the entry) to drop.

        The caller lets go of ``items``; ``items[:keep]`` holds nothing to drop. ``words``: a
        plain queue's arrays beside its log, for the slots that are ``PACKED``.
        """
        if not items:
            return
        self.pending += len(items) - keep
        self.work.add(REAP, _Grave(self, items, pick, keep, on_drop or _no_drop, words))

    def discard(self, container: list[Any] | dict[Any, Any]) -> None:
        """Take a container the caller let go of, to be dismantled a slice at a time."""
        if container:
            self.work.add(REAP, _Grave(self, container, None, 0, None, None))

    def defer(self, job: Callable[[int], int]) -> None:
        """Take other work to do a slice at a time (a deleted exchange's bindings): ``job(n)``
        does at most ``n`` units of it and returns how many it did; fewer: it is done."""
        def step(n: int) -> tuple[int, bool]:
            done = job(n)
            return done, done < n
        self.work.add(REAP, step)

    def reap(self, limit: int) -> int:
        """Drop at most ``limit`` entries (dismantling counts ``1/DISMANTLE_PER_DROP`` each),
        oldest burial first; returns the work done in those units."""
        return self.work.run_within(REAP, limit)

    def body_refs(self) -> Iterator[Any]:
        """The body handles of buried entries not reaped yet (a dead-letter copy's: its
        origin's; O(buried): an arena sweep)."""
        for grave in self.work.jobs(REAP):
            if isinstance(grave, _Grave) and grave.on_drop is not None:
                yield from grave.body_refs()


class _Grave:
    """One burial: ``items[start:]`` are entries still to drop (``item[pick]`` when the list
    holds heap tuples); a dropped one's slot is set to None. ``on_drop`` None: only dismantle
    ``items`` (a list from its end, a dict by popitem)."""

    __slots__ = ("items", "on_drop", "pick", "start", "words", "yard")

    def __init__(self, yard: Graveyard, items: Any, pick: int | None, start: int,
                 on_drop: Callable[[Message], None] | None, words: Words | None) -> None:
        self.yard = yard
        self.items = items
        self.pick = pick
        self.start = start
        self.on_drop = on_drop
        self.words = words

    def __call__(self, budget: int) -> tuple[int, bool]:
        done = 0
        if self.on_drop is not None:
            done = self._drop(budget)
            if self.on_drop is not None:
                return done, False
        if done < budget:
            n = self._dismantle(budget - done)
            done += -(-n // DISMANTLE_PER_DROP)
        return done, not self.items

    def _drop(self, budget: int) -> int:
        items, pick, start, on_drop = self.items, self.pick, self.start, self.on_drop
        assert on_drop is not None
        stop = min(start + budget, len(items))
        for index in range(start, stop):
            item = items[index]
            items[index] = None
            if pick is not None:
                item = item[pick]
            if item is PACKED:  # a plain queue's handle as words: only it held it
                lo, hi, handle = self.words  # type: ignore[misc]
                on_drop(PlainMessage("", "", handle(lo[index], hi[index]), 0))
            elif type(item) is int:  # a plain queue's handle: only that queue held it
                on_drop(PlainMessage("", "", item, 0))
            elif isinstance(item, Message):  # a plain queue's waiting message
                drop_reference(item, on_drop)
            else:
                item.state = DELETED
                drop_reference(item.message, on_drop)
        self.yard.pending -= stop - start
        self.start = stop
        if stop == len(items):  # what is left is Nones (and consumed slots): dismantle
            self.on_drop = None
        return stop - start

    def _dismantle(self, budget: int) -> int:
        items = self.items
        n = min(budget * DISMANTLE_PER_DROP, len(items))
        if isinstance(items, dict):
            popitem = items.popitem
            for _ in range(n):
                popitem()
        else:
            del items[len(items) - n:]
        return n

    def body_refs(self) -> Iterator[Any]:
        items, pick = self.items, self.pick
        for index in range(self.start, len(items)):
            item = items[index]
            if pick is not None:
                item = item[pick]
            if item is PACKED:
                lo, hi, handle = self.words  # type: ignore[misc]
                yield handle(lo[index], hi[index])
                continue
            if type(item) is int:
                yield item
                continue
            message = item if isinstance(item, Message) else item.message
            yield (message.origin or message).body_ref


def _no_drop(message: Message) -> None:
    """on_drop of a queue made without one: the reference is dropped, nothing to free."""
