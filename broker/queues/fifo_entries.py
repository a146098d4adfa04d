"""A plain queue's available entries: the log from its head on, and the released ones before it.

Qpid's Message Delivery (docs/design.md, "The seeds") models a subscription as a pointer into
the queue that only moves back when a message is released. Without selectors every acquiring
consumer's pointer is the same -- the first available entry -- so the plain queue keeps one
head for all of them:

* ``log`` holds the never-acquired entries from index ``head`` on. Acquisition only ever
  takes the first available entry, so the live part of the log is a run of *consecutive*
  positions: the entry at index ``i`` has position ``base + i``, and is found in O(1).
* ``released`` is a heap of released entries, keyed by their original position. A released
  entry was acquired from below the head, so its position is below every log entry: the next
  entry for an acquiring consumer is the heap's minimum if there is one, else the log head
  (Qpid's Message Delivery: "the next entry that that subscriber sees is the returned message").
* browsers keep their own pointer (``QueueConsumer.browse_position``) and never rewind: their
  next entry is the first available one *after* the pointer (:meth:`FifoEntries.next_after`,
  which also searches the queue's acquired entries).

What a log slot holds (S8, and Durability's ten million queued messages). An entry that only
waits needs no object of its own, so a slot holds the least that says what it is:

* the :class:`~broker.messages.message.Message` itself, from enqueue on. The
  :class:`~broker.queues.queue_entry.QueueEntry` -- id, position, state -- is made when the entry is
  handed out (:meth:`FifoEntries.take`, browsing) or needs a state while it waits (browsed,
  restored redelivered); then the slot holds the entry;
* only the message's body handle, for a message that nothing but this queue holds and whose
  every other field the queue can tell: a :class:`~broker.messages.message.PlainMessage`
  (or a :class:`~broker.messages.message.PageableMessage` whose body is paged out already: nothing
  changes its handle any more) with one reference and the queue's usual exchange and routing
  key (``exchange``, ``routing_key``: the first such message's). :meth:`FifoEntries._sweep`
  turns the slots of a long log into handles, ``_SWEEP_LAG`` slots behind its tail (the
  newest entries are the next to be paged, and with consumers that keep up, to be taken);
  :meth:`FifoEntries.take` makes the message again, its size read from the handle. The
  handle is kept as two unsigned 64-bit words in the arrays ``lo`` and ``hi`` beside the log,
  the slot holding :data:`~broker.queues.entry_state.PACKED`, or as the int itself where it does not
  fit two words. The runtime's ``body_codec`` (``broker.queues.queue_host.BodyCodec``) reads sizes and
  words: the domain does not know the handle's layout; without one, as in a queue made outside
  a runtime, nothing is swept.

What each form costs per queued message, the supervisor's part, is measured by
``perf/bench_queue_memory.py`` (tracemalloc); the two words and the slot are the least.

Every operation is O(1) (O(log r) for r released entries; sweeping is amortised O(1) per
append), :meth:`FifoEntries.bury` included: the lists go to the host's
:class:`broker.queues.graveyard.Graveyard` whole, which lets go of their messages a slice at a time
between other work (Overload: no single operation may hold the supervisor for long).

Called from: the supervisor process (``broker.queues.queue``).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

from broker.messages.message import Message, PageableMessage, PlainMessage
from broker.queues.browsing import first_acquired_after
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.entry_state import PACKED, Packed, new_entry_id
from broker.queues.queue_host import BodyCodec, QueueHost

# Drop the consumed prefix of the log once it is this long and at least half of the list.
_COMPACT_AT = 4096
# Slots nearest the tail are left as they are; the older ones are swept once this many more
# have been appended.
_SWEEP_LAG = 16384
_SWEEP_EVERY = 4096


class Entry(Protocol):
    """What this module reads and sets of an entry (broker.queues.queue_entry.QueueEntry)."""

    id: int
    position: int
    message: Message
    redelivered: bool


_Entry = TypeVar("_Entry", bound=Entry)


class FifoEntries(Generic[_Entry]):
    """The available entries of a plain queue, in the order acquiring consumers take them.

    ``new_entry(queue, position, message)`` makes an entry (``broker.queues.queue_entry.QueueEntry``, which
    this module does not import: the queue module imports this one)."""

    __slots__ = ("base", "codec", "exchange", "head", "hi", "lo", "log", "new_entry", "queue",
                 "released", "routing_key", "swept")

    def __init__(self, queue: Any, new_entry: Callable[[Any, int, Message], _Entry],
                 codec: BodyCodec | None = None) -> None:
        # Slots from head on -- an entry, a message or a body handle -- and the consumed ones
        # before it, None (so that a compaction, a purge or a delete never deallocates a run
        # of entries at once).
        self.log: list[_Entry | Message | int | Packed | None] = []
        self.head = 0
        self.base = 1  # the position of log[0]
        self.released: list[tuple[int, _Entry]] = []
        self.queue = queue
        self.new_entry = new_entry
        self.codec = codec  # the runtime's reading of body handles (None: never swept)
        self.swept = 0  # slots before this index were swept
        # The two words of each PACKED slot's handle, by log index (up to ``swept``).
        self.lo = array("Q")
        self.hi = array("Q")
        self.exchange: str | None = None  # what a handle's message was published to
        self.routing_key: str | None = None

    def __len__(self) -> int:
        return len(self.released) + len(self.log) - self.head

    def append(self, message: Message, position: int) -> None:
        """A new entry, at the end (``position``: one past the last one's)."""
        log = self.log
        if not log:
            self.base = position
        log.append(message)
        if len(log) - self.swept >= _SWEEP_LAG + _SWEEP_EVERY:
            self._sweep()

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
        slot = log[head]
        log[head] = None  # the entry lives on in the queue's acquired map while it must
        position = self.base + head
        if slot is PACKED:  # read before a compaction moves the arrays
            slot = self._handle(head)
        head += 1
        self.head = head
        if head == len(log) or head >= _COMPACT_AT:  # the hot path skips the call
            self._compact()
        if type(slot) is int:
            return self.new_entry(self.queue, position, self._message(slot))
        if isinstance(slot, Message):
            return self.new_entry(self.queue, position, slot)
        return slot  # type: ignore[return-value]  # an entry: not None from the head on

    def last(self) -> _Entry:
        """The entry appended last, made in its slot if it had none (restore marks it)."""
        return self._entry_at(len(self.log) - 1)

    def _entry_at(self, index: int) -> _Entry:
        slot = self.log[index]
        if slot is PACKED:
            entry = self.new_entry(self.queue, self.base + index, self._message(self._handle(index)))
        elif type(slot) is int:
            entry = self.new_entry(self.queue, self.base + index, self._message(slot))
        elif isinstance(slot, Message):
            entry = self.new_entry(self.queue, self.base + index, slot)
        else:
            return slot  # type: ignore[return-value]  # an entry
        self.log[index] = entry
        return entry

    def _handle(self, index: int) -> Any:
        """The handle a PACKED slot's words make."""
        assert self.codec is not None
        return self.codec.handle(self.lo[index], self.hi[index])

    def _message(self, ref: Any) -> PlainMessage:
        """The message a handle stands for (only this queue held it)."""
        assert self.codec is not None and self.exchange is not None and self.routing_key is not None
        message = PlainMessage(self.exchange, self.routing_key, ref, self.codec.size(ref))
        message.refs = 1
        return message

    def _compact(self) -> None:
        # Amortised O(1): each consumed slot is dropped once.
        head = self.head
        if head == len(self.log):
            self.log.clear()
            self.head = self.swept = 0
            if self.lo:
                self.lo = array("Q")
                self.hi = array("Q")
        elif head >= _COMPACT_AT and head * 2 >= len(self.log):
            del self.log[:head]
            if self.lo:
                del self.lo[:head]
                del self.hi[:head]
            self.base += head
            self.head = 0
            self.swept = max(0, self.swept - head)

    def _sweep(self) -> None:
        """Turn the slots before the last ``_SWEEP_LAG`` into handles where a handle says all
        (module docstring). Each slot is looked at once."""
        log = self.log
        stop = len(log) - _SWEEP_LAG
        start = max(self.swept, self.head)
        self.swept = stop
        codec = self.codec
        if codec is None:
            return
        lo, hi = self.lo, self.hi
        if len(lo) < stop:  # the arrays cover every index up to ``swept``
            lo.frombytes(bytes(8 * (stop - len(lo))))
            hi.frombytes(bytes(8 * (stop - len(hi))))
        words = codec.words
        exchange, routing_key = self.exchange, self.routing_key
        for index in range(start, stop):
            message = log[index]
            cls = type(message)
            if not (cls is PlainMessage or (cls is PageableMessage and message.body_ref < 0)):  # type: ignore[union-attr]
                continue
            if message.refs != 1:  # type: ignore[union-attr]
                continue
            if message.routing_key is not routing_key or message.exchange is not exchange:  # type: ignore[union-attr]
                if exchange is not None:
                    continue  # another destination than the usual: it keeps its message
                exchange = self.exchange = message.exchange  # type: ignore[union-attr]
                routing_key = self.routing_key = message.routing_key  # type: ignore[union-attr]
            ref = message.body_ref  # type: ignore[union-attr]
            packed = words(ref)
            if packed is None:
                log[index] = ref
            else:
                lo[index], hi[index] = packed
                log[index] = PACKED

    def bury(self, host: QueueHost[Any], on_drop: Callable[[Message], None] | None) -> None:
        """Hand every entry to the host's graveyard; none are left. O(1)."""
        if self.released:
            host.bury(self.released, pick=1, on_drop=on_drop)
            self.released = []
        if self.log:
            codec = self.codec
            host.bury(self.log, keep=self.head, on_drop=on_drop,
                      words=None if codec is None else (self.lo, self.hi, codec.handle))
            self.log = []
            self.head = self.swept = 0
            self.lo = array("Q")
            self.hi = array("Q")

    def entries(self) -> list[_Entry]:
        """The entries in position order, each made in its slot (introspection; O(n))."""
        released = [entry for _, entry in sorted(self.released, key=_first)]
        return released + [self._entry_at(index) for index in range(self.head, len(self.log))]

    def body_refs(self) -> Iterator[Any]:
        """The body handle of every available entry (a dead-letter copy's: its origin's),
        without making anything (an arena sweep)."""
        for _, entry in self.released:
            yield (entry.message.origin or entry.message).body_ref
        log = self.log
        for index in range(self.head, len(log)):
            slot = log[index]
            if slot is PACKED:
                yield self._handle(index)
            elif type(slot) is int:
                yield slot
            else:
                message = slot if isinstance(slot, Message) else slot.message  # type: ignore[union-attr]
                yield (message.origin or message).body_ref

    def stored_in(self, file: int, limit: int) -> list[tuple[Message, bool]] | None:
        """The available messages whose E record is in index file ``file``, each with whether
        it was delivered (``Queue.stored_in``); None when that cannot be told by looking at
        ``limit`` log slots. The log holds them in enqueue order, so the look stops at the first
        message recorded in a later file."""
        found = [(entry.message, True) for _, entry in self.released
                 if entry.message.stored is not None and entry.message.stored[5] == file]
        log = self.log
        stop = min(len(log), self.head + limit)
        for index in range(self.head, stop):
            slot = log[index]
            if isinstance(slot, Message):
                message, delivered = slot, False
            elif slot is PACKED or type(slot) is int:
                continue  # a handle: a transient message
            else:
                message, delivered = slot.message, slot.redelivered  # type: ignore[union-attr]
            stored = message.stored
            if stored is None:
                continue
            if stored[5] > file:
                return found
            if stored[5] == file:
                found.append((message, delivered))
        return found if stop == len(log) else None

    # ------------------------------------------------------------------ browsing

    def next_after(self, acquired: Mapping[int, _Entry], position: int) -> _Entry | None:
        """The first entry still on the queue past ``position`` (a browser's next).

        Browsers see the queue's contents: available entries and acquired ones not yet
        settled, so what a browser sees does not depend on whether an acquiring consumer
        pulled first. Acquired entries all sit below the log head; they are only searched when
        the browser lags behind it. The entry found is made in its slot."""
        best: _Entry | None = None
        for released_position, entry in self.released:  # few: released entries go first
            if released_position > position and (best is None or released_position < best.position):
                best = entry
        head, log = self.head, self.log
        first = self.base + head if head < len(log) else None  # the log head's position
        if acquired and (first is None or first > position + 1):
            taken = first_acquired_after(acquired, position)
            if taken is not None and (best is None or taken.position < best.position):
                best = taken
        if first is None or (best is not None and best.position < first):
            return best
        index = head + max(0, position + 1 - first)
        return self._entry_at(index) if index < len(log) else best

    def browse(self, consumer: QueueConsumer, max_n: int,
               acquired: Mapping[int, _Entry]) -> tuple[list[_Entry], bool]:
        """Up to ``max_n`` entries past the browser's pointer, which moves past them; and
        whether more follow. Each entry gets its id here if it has none yet."""
        seen: list[_Entry] = []
        position = consumer.browse_position
        while len(seen) < max_n:
            entry = self.next_after(acquired, position)
            if entry is None:
                break
            if not entry.id:
                entry.id = new_entry_id()
            seen.append(entry)
            position = entry.position
        consumer.browse_position = position
        return seen, len(seen) == max_n and self.next_after(acquired, position) is not None


def _first(item: tuple[int, Any]) -> int:
    return item[0]
