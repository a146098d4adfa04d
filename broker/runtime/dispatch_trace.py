"""The supervisor's trace rows (``shoal serve --trace``): what the dispatcher tells its writer.

The dispatcher holds one :class:`DispatchTrace` while tracing, else None, so every hook costs the
untraced broker one ``is not None`` check. Besides forwarding events it keeps the two joins the
report needs: which pull a notifyWork caused (docs/design.md, notifyWork: it found work, or
the wake-up was spurious), and when each entry was pulled (a settle row's delivery time).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from broker.queues.queue_entry import QueueEntry
from ipc import records as r
from tracing import TraceWriter, names


class DispatchTrace:
    """The dispatcher's hooks onto one :class:`tracing.TraceWriter` (``writer``)."""

    __slots__ = ("_notified", "_pulled_ns", "writer")

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self._pulled_ns: dict[int, int] = {}  # entry id -> when it was pulled
        self._notified: set[tuple[int, int]] = set()  # (worker, consumer id) notified, not pulled

    def notified(self, queue: str, worker: int, cid: int) -> None:
        self.writer.notify_event(time.monotonic_ns(), queue, worker, cid)
        self._notified.add((worker, cid))

    def pulled(self, worker: int, cid: int, queue: str, entries: Sequence[QueueEntry]) -> None:
        """docs/design.md, notifyWork: a pull a notifyWork caused either found work or was a
        spurious wake-up."""
        now = time.monotonic_ns()
        key = (worker, cid)
        found = bool(entries) if key in self._notified else None
        self._notified.discard(key)
        self.writer.pull_event(now, queue, worker, cid, len(entries), found)
        for entry in entries:
            self._pulled_ns[entry.id] = now

    def requeued(self, entry: QueueEntry, worker: int) -> None:
        """An acquired entry went back because its channel, connection or worker went away."""
        self.writer.requeue_event(time.monotonic_ns(), entry.queue.name, entry.id, worker, None)

    def settled(self, worker: int, entry: QueueEntry, action: int) -> None:
        now = time.monotonic_ns()
        pulled = self._pulled_ns.pop(entry.id, None)
        if action == r.REQUEUE:
            self.writer.requeue_event(now, entry.queue.name, entry.id, worker, None)
            return
        m = entry.message
        pub = m.trace or (None, None, None, None)
        self.writer.settled(
            now, names.ACKED if action in (r.ACK, r.AUTO_ACK) else names.REJECTED, m.id, entry.id,
            entry.queue.name,
            pub[0], pub[1], pub[2], consumer_worker=worker, redelivered=int(entry.redelivered),
            enqueued_ns=pub[3], pulled_ns=pulled, exchange=m.exchange,
            routing_key=m.routing_key, body_size=m.body_size,
        )

    def consumed(self, queue: str, worker: int, cid: int, tag: str, priority: int,
                 browser: bool) -> None:
        self.writer.consume_event(time.monotonic_ns(), queue, worker, cid, tag, priority, browser)

    def cancelled(self, queue: str, worker: int, cid: int) -> None:
        self.writer.cancel_event(time.monotonic_ns(), queue, worker, cid)
