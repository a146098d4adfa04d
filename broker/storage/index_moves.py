"""Letting the oldest index file go while a few of its messages live on (Durability: disk use).

An index file (``broker.storage.message_store``) can only go once no live message has its E record in
it, oldest first. One old message that stays queued or unacknowledged -- a consumer that holds a
delivery for an hour -- would then keep every newer file too, however many messages have come
and gone since (RabbitMQ's users report 400 GiB on disk for 1 GiB queued, rabbitmq-server#13939).
So when the index has more than ``KEEP_FILES`` files and the oldest holds at most ``MOVE_LIMIT``
live messages, those are recorded again in the current file -- their E record, and D if they
were delivered -- and the old file goes once the log is synced past them
(``MessageJournal.file_moved``). The messages are found on the durable queues
(``Queue.stored_in``): every one of the file's live messages must be found, or nothing is moved
(one held elsewhere -- a dead-letter copy's origin, a purged queue's entry not yet let go of --
keeps the file until a later attempt). Done once per new index file, in the batch that began it.

Called from: the supervisor process (``broker.runtime.durability``).
"""

from __future__ import annotations

from broker.messages.message import Message
from broker.messages.message_journal import MessageJournal, queue_key
from broker.queues.queue import Queue
from broker.topology.vhosts import VirtualHosts

KEEP_FILES = 4  # an index of at most this many files is left as it is
MOVE_LIMIT = 4096  # live messages a file may hold and still be moved out of, at once


def move_oldest(vhosts: VirtualHosts, journal: MessageJournal, files: list[int], now: float) -> int:
    """Record the oldest index file's live messages again, if it is time (module docstring);
    returns how many entries were recorded again (0: nothing moved)."""
    if len(files) <= KEEP_FILES:
        return 0
    file = files[0]
    live = journal.live_in(file)
    if not 0 < live <= MOVE_LIMIT:
        return 0
    found: list[tuple[Queue, Message, bool]] = []
    for queue in vhosts.queues():
        if queue.store is None:
            continue
        held = queue.stored_in(file, MOVE_LIMIT)
        if held is None:
            return 0
        found.extend((queue, message, delivered) for message, delivered in held)
    if len({id(m) for _, m, _ in found if m.origin is None}) != live:
        return 0
    for queue, message, delivered in found:
        journal.recorded_again(queue_key(queue.vhost, queue.name), message, delivered, now)
    journal.file_moved(file)
    return len(found)
