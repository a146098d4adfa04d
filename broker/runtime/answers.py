"""What the dispatcher says back to a worker's channel: replies, errors, confirms, in order.

Each worker has an *outbox* of events the runtime writes into its event ring after the batch.
An answer to a channel whose confirms wait for the index log's sync (:class:`IndexSyncGate`)
queues behind them, since a client matches a channel's answers in order.

Called from: the supervisor process (``broker.runtime.dispatch`` and its parts).
"""

from __future__ import annotations

from typing import Any

from broker.errors import AMQPError
from broker.messages.message_journal import IndexSyncGate
from broker.queues.message_counts import MessageCounts
from ipc import records as r

# AMQP (class_id, method_id) of the method each request stands for, so that a
# domain error can name it in channel.close (AMQP 0-9-1 §1.5.2.8 reply fields).
METHOD_IDS: dict[type, tuple[int, int]] = {
    r.ExchangeDeclare: (40, 10),
    r.ExchangeDelete: (40, 20),
    r.ExchangeBind: (40, 30),
    r.ExchangeUnbind: (40, 40),
    r.QueueDeclare: (50, 10),
    r.QueueBind: (50, 20),
    r.QueuePurge: (50, 30),
    r.QueueDelete: (50, 40),
    r.QueueUnbind: (50, 50),
    r.Consume: (60, 20),
    r.Cancel: (60, 30),
    r.Publish: (60, 40),
    r.PublishRun: (60, 40),
    r.Get: (60, 70),
}


class Answers:
    """Every worker's outbox, and the confirms (and answers behind them) held for the sync;
    and the broker's message counters (``counts``), which the dispatcher's parts share."""

    __slots__ = ("confirms", "counts", "outbox")

    def __init__(self, workers: int) -> None:
        self.outbox: list[list[r.Event]] = [[] for _ in range(workers)]
        # Publisher confirms waiting for the index log's sync (shoal serve --data-dir).
        self.confirms = IndexSyncGate()
        self.counts = MessageCounts()  # message statistics (broker.queues.message_counts)

    def answer(self, worker: int, conn: int, ch: int, event: r.Event) -> None:
        """An answer to channel (conn, ch): behind its held confirms if it has any."""
        if self.confirms and self.confirms.holds((worker, conn, ch)):
            self.confirms.admit((worker, conn, ch), event, 0)
        else:
            self.outbox[worker].append(event)

    def reply(self, worker: int, rec: Any, **fields: Any) -> None:
        """The method's -ok to ``rec`` (none when it was sent nowait)."""
        if not getattr(rec, "nowait", False):
            self.answer(worker, rec.conn, rec.ch,
                        r.Reply(rec.conn, rec.ch, rec.__struct_config__.tag, **fields))

    def fail(self, worker: int, rec: r.Request, exc: AMQPError) -> None:
        """``rec`` failed with ``exc``: the worker closes the channel or connection with it."""
        class_id, method_id = exc.class_id, exc.method_id
        if not class_id:
            class_id, method_id = METHOD_IDS.get(type(rec), (0, 0))
        conn, ch = getattr(rec, "conn", 0), getattr(rec, "ch", 0)
        self.answer(worker, conn, ch,
                    r.Error(conn, ch, exc.reply_code, exc.reply_text, class_id, method_id))

    def confirm(self, worker: int, confirm: r.Confirm, need: int) -> None:
        """A publish's confirm: sent now, or held until the index log is synced to ``need``
        (0: it wrote nothing there), behind the channel's confirms held before it."""
        if confirm.ack:
            self.counts.confirm += confirm.count
        if (not need and not self.confirms) or self.confirms.admit(
                (worker, confirm.conn, confirm.ch), confirm, need):
            send_confirm(self.outbox[worker], confirm)

    def synced(self, mark: int) -> None:
        """The index log is on disk up to journal mark ``mark``: send what it held."""
        for (worker, _, _), event in self.confirms.release(mark):
            if type(event) is r.Confirm:
                send_confirm(self.outbox[worker], event)
            else:
                self.outbox[worker].append(event)


def send_confirm(outbox: list[r.Event], confirm: r.Confirm) -> None:
    """``confirm`` joins the outbox's last event when that is the same channel's confirm of the
    same kind (ack or nack): one record for a run of them."""
    if outbox:
        last = outbox[-1]
        if (type(last) is r.Confirm and last.ch == confirm.ch and last.conn == confirm.conn
                and last.ack == confirm.ack):
            outbox[-1] = r.Confirm(last.conn, last.ch, last.ack, last.count + confirm.count)
            return
    outbox.append(confirm)
