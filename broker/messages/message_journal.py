"""Persistent messages on durable queues as index records: what the supervisor's log must say.

RabbitMQ keeps a persistent message (delivery_mode 2) routed to a durable queue across restarts.
Here the publishing worker has already written the body (``ipc.logfile.BodyLog``: a message's
``stored`` location); the domain records, per durable queue, what happens to it -- enqueued,
first delivered (so a restart marks it redelivered), removed for good (ack, reject, expiry,
drop-head...), or swept by a purge or a queue deletion -- in a :class:`MessageJournal`. The
runtime takes the records after each batch and appends them to the index log
(``broker.storage.message_store``); a publisher confirm for a message with records waits until the log
is synced up to them (``mark``).

The journal also counts what each file on disk still holds, so the runtime can remove files as
the messages in them go: per body segment, the stored messages whose body is still held; per
index file, the stored messages whose ``E`` records are in it. Index files go oldest first (a
later file's ``R`` records only matter while an earlier one's ``E`` records are read), body
segments in any order.

A message that goes before its records are written leaves nothing to write: while the runtime
holds the records (it writes them when the next sync starts, ``broker.runtime.durability``), an ``R``
for a message whose ``E`` is still among them cancels that ``E``, its ``D`` and itself
(``cancelled``). A consumer that keeps up acks most messages inside one sync, and none of its
messages reaches the index at all, as RabbitMQ's message store skips the write of a message
acked before it is written. Records that let an old index file go (``recorded_again``) are
never cancelled: the old file's ``E`` is on disk until the new ones are.

Records are tuples, msgpack-encoded by the store:

    ("E", queue, id, worker, segment, offset, length, exchange, routing_key, headers,
          expiration, priority, reheadered, enqueued_at)
                                                 enqueued (``enqueued_at``: Unix time;
                                                 ``reheadered``: delivered with ``headers``
                                                 re-encoded, as a dead-letter copy is)
    ("D", queue, id)                             delivered for the first time
    ("R", queue, id)                             gone from the queue for good
    ("P", queue, [ids kept])                     purged: every entry but these (acquired) went
    ("X", queue)                                 the queue was deleted

A queue's name in these records is its index key (:func:`queue_key`): the bare name in the
vhost ``/`` (so a data directory from before there were other vhosts reads the same), the vhost
and the name otherwise. The journal is the broker's one; a queue of another vhost writes to it
through a :class:`VhostJournal`, which keys its names.

Pure: no IO here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.messages.message import Message

DEFAULT_VHOST = "/"
# Starts the index key of a queue that is not simply named: ``KEYED len(vhost) ":" vhost name``.
KEYED = "\x00"


def queue_key(vhost: str, queue: str) -> str:
    """The index's name for ``queue`` of ``vhost``: the bare name in "/", else KEYED, the
    vhost's length, ":", the vhost and the name. (A "/" queue whose own name begins with NUL
    and a length would read back as another vhost's: no client names a queue so.)"""
    if vhost == DEFAULT_VHOST:
        return queue
    return f"{KEYED}{len(vhost)}:{vhost}{queue}"


def split_key(key: str) -> tuple[str, str]:
    """``(vhost, queue)`` of an index key (:func:`queue_key`'s inverse)."""
    if not key.startswith(KEYED):
        return DEFAULT_VHOST, key
    length, colon, rest = key[1:].partition(":")
    if not colon or not length.isdigit() or int(length) > len(rest):
        return DEFAULT_VHOST, key
    n = int(length)
    return rest[:n], rest[n:]


# (store id, worker, segment, offset, length, index file): a stored message's identity, where
# its body is, and the index file its E records went to.
Stored = tuple[int, int, int, int, int, int]


class MessageJournal:
    """Index records not yet written, the id counter, and which body segments are still needed."""

    __slots__ = ("_file_live", "_last_id", "_moved", "_segment_idle", "_segment_live",
                 "_segment_max", "_unwritten", "cancelled", "epoch_offset", "index_file", "mark",
                 "records", "replaying", "segments_free", "synced")

    def __init__(self, *, last_id: int = 0, epoch_offset: float = 0.0) -> None:
        # Not yet written; None: cancelled (the message went before its records were written).
        self.records: list[tuple[Any, ...] | None] = []
        # (queue, store id) -> the positions in ``records`` of its E record and D records.
        self._unwritten: dict[tuple[str, int], list[int]] = {}
        self.cancelled = 0  # records never written because they cancelled out (counted ever)
        self.mark = 0  # records appended ever: a confirm waits until the log is synced to it
        self._last_id = last_id
        self.epoch_offset = epoch_offset  # Unix time minus the domain's monotonic time
        self._segment_live: dict[tuple[int, int], int] = {}
        self._segment_max: dict[int, int] = {}  # per worker: the newest segment seen
        self._segment_idle: dict[int, set[int]] = {}  # newest-then segments with nothing live
        self.segments_free: list[tuple[int, int]] = []  # (worker, segment) the runtime may remove
        self.index_file = 0  # the index file records go to now (the runtime moves it on)
        self._file_live: dict[int, int] = {}  # index file -> stored messages with E records there
        # At start (broker.storage.message_store.restore): restored messages' E and D records are in
        # the index files already, and are not written again; everything else is.
        self.replaying = False
        # Index files whose live messages were recorded again in a newer one (broker.storage.index_moves):
        # file -> the mark those records end at; the file goes once the log is synced past it.
        self._moved: dict[int, int] = {}
        self.synced = 0  # the mark the index log is on disk up to (the runtime sets it)

    def take(self) -> list[tuple[Any, ...]]:
        """The records to write now, cancelled ones left out; none of them can cancel later."""
        records, self.records = self.records, []
        self._unwritten.clear()
        return [rec for rec in records if rec is not None]

    def _append(self, record: tuple[Any, ...]) -> None:
        self.records.append(record)
        self.mark += 1

    # ------------------------------------------------------------------ bodies

    def new_body(self, worker: int, segment: int, offset: int, length: int) -> Stored:
        """A persistent message's body was written by ``worker``: its identity from now on."""
        self._last_id += 1
        self.segment_used(worker, segment)
        file = self.index_file
        self._file_live[file] = self._file_live.get(file, 0) + 1
        return (self._last_id, worker, segment, offset, length, file)

    def restored_bodies(self, last_id: int, segments: dict[tuple[int, int], int],
                        files: dict[int, int]) -> None:
        """Messages came back at start (the ids continue after ``last_id``): how many hold a
        body in each (worker, segment), and how many have their E record in each index file
        (each counts there, as a new message counts in the file its E record goes to)."""
        self._last_id = max(self._last_id, last_id)
        newest = self._segment_max
        for key, n in segments.items():
            self._segment_live[key] = self._segment_live.get(key, 0) + n
            # No worker appends to a segment that was on disk at start (ipc.logfile.BodyLog
            # begins one past them): each goes as soon as its last message does.
            worker, segment = key
            if segment >= newest.get(worker, -1):
                newest[worker] = segment + 1
        for file, n in files.items():
            self._file_live[file] = self._file_live.get(file, 0) + n

    def body_dropped(self, stored: Stored) -> None:
        """No queue holds the message any more: its body is not needed."""
        self._file_released(stored[5])
        self.segment_released(stored[1], stored[2])

    def _file_released(self, file: int) -> None:
        """One stored message fewer has its E record in index file ``file``."""
        left = self._file_live.get(file, 0) - 1
        if left > 0:
            self._file_live[file] = left
        else:
            self._file_live.pop(file, None)

    def segment_used(self, worker: int, segment: int) -> None:
        """A message's body is in this segment: a persistent one, or a transient one paged out
        (``broker.storage.paging``; no index records: a restart forgets it). Needed while it lives."""
        key = (worker, segment)
        self._segment_live[key] = self._segment_live.get(key, 0) + 1
        if segment > self._segment_max.get(worker, -1):
            self._segment_max[worker] = segment
            self._free_older(worker)

    def segment_released(self, worker: int, segment: int) -> None:
        """A message whose body is in this segment is gone (persistent, or paged out)."""
        key = (worker, segment)
        left = self._segment_live.get(key, 0) - 1
        if left > 0:
            self._segment_live[key] = left
            return
        self._segment_live.pop(key, None)
        if segment < self._segment_max.get(worker, -1):
            self.segments_free.append(key)
        else:  # the worker may still append to its newest segment: freed once it moves on
            self._segment_idle.setdefault(worker, set()).add(segment)

    def _free_older(self, worker: int) -> None:
        idle = self._segment_idle.get(worker)
        if not idle:
            return
        newest = self._segment_max[worker]
        for segment in [s for s in idle if s < newest and (worker, s) not in self._segment_live]:
            idle.discard(segment)
            self.segments_free.append((worker, segment))

    def live_segments(self) -> set[tuple[int, int]]:
        """Segments some message still needs."""
        return set(self._segment_live)

    def index_file_needed(self, file: int) -> bool:
        """Whether a stored message still alive has its E records in index file ``file``, or
        they were recorded again elsewhere and those records are not on disk yet."""
        if file in self._file_live:
            return True
        mark = self._moved.get(file)
        if mark is None:
            return False
        if self.synced < mark:
            return True
        del self._moved[file]
        return False

    def live_in(self, file: int) -> int:
        """Stored messages alive with their E records in index file ``file``."""
        return self._file_live.get(file, 0)

    def recorded_again(self, queue: str, message: Message, delivered: bool, now: float) -> None:
        """``message``, on durable ``queue``, is recorded again in the current index file (its
        E record, and D if it was delivered), to let its old file go (broker.storage.index_moves). The
        message counts in the new file from now on; call once per queue holding it."""
        stored = message.stored
        assert stored is not None
        file = self.index_file
        if stored[5] != file:
            if message.origin is None:  # a dead-letter copy is not counted (enqueued)
                self._file_released(stored[5])
                self._file_live[file] = self._file_live.get(file, 0) + 1
            stored = (*stored[:5], file)
            message.stored = stored  # type: ignore[misc]  # FullMessage's slot
        self._unwritten.pop((queue, stored[0]), None)  # its R must be written after these
        self._append(self._e_record(queue, message, stored, now))
        if delivered:
            self._append(("D", queue, stored[0]))

    def file_moved(self, file: int) -> None:
        """Every live message of index file ``file`` was recorded again: it goes once the log
        is synced past those records."""
        self._moved[file] = self.mark

    # ------------------------------------------------------------------ queues

    def enqueued(self, queue: str, message: Message, now: float) -> None:
        """``message`` joined durable ``queue`` at monotonic ``now``, if it is persistent."""
        stored = message.stored
        if stored is not None and self.replaying:
            return  # restored: its E record is on disk already
        if stored is None:
            origin = message.origin
            if origin is None or origin.stored is None:
                return  # not persistent
            # A dead-letter copy of a persistent message: its own id, its origin's body. It is not
            # counted in its index file: its origin, in an older or the same file, outlives it.
            self._last_id += 1
            stored = (self._last_id, *origin.stored[1:5], self.index_file)
            message.stored = stored  # type: ignore[misc]  # a DeadLetter: FullMessage's slot
        self._unwritten[(queue, stored[0])] = [len(self.records)]
        self._append(self._e_record(queue, message, stored, now))

    def _e_record(self, queue: str, message: Message, stored: Stored, now: float) -> tuple[Any, ...]:
        return (
            "E", queue, stored[0], stored[1], stored[2], stored[3], stored[4], message.exchange,
            message.routing_key, message.headers, message.expiration, message.priority,
            message.reheadered, now + self.epoch_offset,
        )

    def delivered(self, queue: str, message: Message) -> None:
        if message.stored is not None and not self.replaying:
            unwritten = self._unwritten.get((queue, message.stored[0]))
            if unwritten is not None:
                unwritten.append(len(self.records))
            self._append(("D", queue, message.stored[0]))

    def removed(self, queue: str, message: Message) -> None:
        if message.stored is not None:
            unwritten = self._unwritten.pop((queue, message.stored[0]), None)
            if unwritten is None:
                self._append(("R", queue, message.stored[0]))
                return
            records = self.records
            for at in unwritten:  # nothing of it reaches the disk
                records[at] = None
            self.cancelled += len(unwritten) + 1
            self.mark += 1  # as if written: marks only ever grow

    def lost(self, queue: str, store_id: int) -> None:
        """At start: entry ``store_id`` of ``queue`` has no body left on disk (never confirmed)."""
        self._append(("R", queue, store_id))

    def purged(self, queue: str, kept: list[Message]) -> None:
        self._unwritten.clear()  # rare: what was recorded so far is written as it is
        self._append(("P", queue, [m.stored[0] for m in kept if m.stored is not None]))

    def deleted(self, queue: str) -> None:
        self._unwritten.clear()
        self._append(("X", queue))


class IndexSyncGate:
    """Publisher confirms (and tx.commit's answer) that wait for the index log's sync (the
    supervisor's group commit, not the workers' body-log sync), per channel, in order.

    A confirm for a publish that wrote index records waits until the log is on disk up to them;
    so does the answer to the Sync that ends a tx.commit. Whatever the channel is answered after
    that -- confirms, replies, basic.get's answers, errors -- waits behind it, since a client
    matches them in order. ``key`` is the runtime's channel key."""

    __slots__ = ("_held", "synced")

    def __init__(self) -> None:
        self._held: dict[Any, list[tuple[int, Any]]] = {}
        self.synced = 0  # the journal mark the log is synced to

    def __bool__(self) -> bool:
        return bool(self._held)

    def holds(self, key: Any) -> bool:
        """Whether events of channel ``key`` are held: its next answers must queue behind."""
        return key in self._held

    def admit(self, key: Any, confirm: Any, need: int) -> bool:
        """True: send ``confirm`` now. False: it is held until the log reaches ``need``."""
        held = self._held.get(key)
        if held is None:
            if need <= self.synced:
                return True
            self._held[key] = [(need, confirm)]
            return False
        held.append((need, confirm))
        return False

    def release(self, synced: int) -> list[tuple[Any, Any]]:
        """The log is synced up to ``synced``: ``(key, confirm)`` pairs now due, in order."""
        self.synced = max(self.synced, synced)
        out: list[tuple[Any, Any]] = []
        for key in list(self._held):
            held = self._held[key]
            n = 0
            while n < len(held) and held[n][0] <= self.synced:
                out.append((key, held[n][1]))
                n += 1
            if n == len(held):
                del self._held[key]
            elif n:
                del held[:n]
        return out

    def forget(self, match: Any) -> None:
        """Drop held confirms whose key ``match(key)`` says (a channel, connection or worker gone)."""
        for key in [k for k in self._held if match(k)]:
            del self._held[key]


class VhostJournal(MessageJournal):
    """The journal as the durable queues of a vhost other than "/" write to it: each queue
    name becomes its index key (:func:`queue_key`). Only the queues' calls are here."""

    __slots__ = ("journal", "vhost")

    def __init__(self, journal: MessageJournal, vhost: str) -> None:
        self.journal = journal  # no MessageJournal state of its own: every call goes there
        self.vhost = vhost

    def enqueued(self, queue: str, message: Message, now: float) -> None:
        self.journal.enqueued(queue_key(self.vhost, queue), message, now)

    def delivered(self, queue: str, message: Message) -> None:
        self.journal.delivered(queue_key(self.vhost, queue), message)

    def removed(self, queue: str, message: Message) -> None:
        self.journal.removed(queue_key(self.vhost, queue), message)

    def purged(self, queue: str, kept: list[Message]) -> None:
        self.journal.purged(queue_key(self.vhost, queue), kept)

    def deleted(self, queue: str) -> None:
        self.journal.deleted(queue_key(self.vhost, queue))


def journal_for(journal: MessageJournal, vhost: str) -> MessageJournal:
    """What the durable queues of ``vhost`` write their records to: the journal itself in "/"
    (bare names, no extra call on the hot path), a :class:`VhostJournal` elsewhere."""
    return journal if vhost == DEFAULT_VHOST else VhostJournal(journal, vhost)
