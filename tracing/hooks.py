"""What the broker's processes call when ``shoal serve --trace DIR`` is on: :class:`TraceWriter`.

This module imports nothing heavy: the supervisor and the workers annotate ``trace: TraceWriter |
None`` with it at import time, and type-checking them needs neither pyarrow nor the writer.
Tracing off costs only the caller's ``if trace is not None`` check; pyarrow (~0.3 s and ~50 MB to
load) comes with :mod:`tracing.writer`, which a process imports only when it traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tracing.names import ACKED


class TraceWriter(Protocol):
    """The hooks the broker calls, one method per trace row (see :mod:`tracing.schema`).

    All timestamps are ``time.monotonic_ns()``. Which process calls what, and when:

    * worker, a complete publish put on the request ring: :meth:`published` (returns pub_seq);
    * supervisor, per entry created: :meth:`enqueued` (or stamp the entry, see :meth:`settled`);
      per notifyWork: :meth:`notify_event` (and :meth:`notified` for the entry whose enqueue did
      it); per Pull answered: :meth:`pull_event` (and :meth:`pulled` per entry acquired);
    * worker, Basic.Deliver / Get-Ok written: :meth:`delivered`; a client's ack / nack / reject
      read: :meth:`acked` (or :meth:`acked_many` for one ``multiple`` frame);
    * supervisor, an entry's final settlement (ack, reject, expiry, dead-letter, drop):
      :meth:`settled`; an entry put back: :meth:`requeue_event`; consumers coming and going:
      :meth:`consume_event`, :meth:`cancel_event`;
    * both, from their loop: :meth:`maybe_flush`; at exit: :meth:`close`.

    A writer is not thread-safe and belongs to one process.
    """

    # ------------------------------------------------------------------- message stage rows

    def published(self, ts_ns: int, conn: int, channel: int, exchange: str, routing_key: str,
                  body_size: int) -> int:
        """Worker: a publish is complete and its Publish record goes to the supervisor.

        Call it exactly once per Publish record, in ring order; returns that record's pub_seq."""
        ...

    def enqueued(self, ts_ns: int, msg_id: int, entry_id: int, queue: str, pub_worker: int,
                 pub_pid: int, pub_seq: int, exchange: str, routing_key: str,
                 body_size: int) -> None:
        """Supervisor (optional partial row): entry ``entry_id`` of message ``msg_id`` was added
        to ``queue``; the publish key names the worker's Publish record it came from."""
        ...

    def notified(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor (optional partial row): enqueuing ``entry_id`` notified this consumer."""
        ...

    def pulled(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor (optional partial row): a Pull acquired ``entry_id`` for this consumer."""
        ...

    def delivered(self, ts_ns: int, entry_id: int, queue: str, consumer_id: int | None,
                  consumer_tag: str, redelivered: bool) -> None:
        """Worker: Basic.Deliver (or Get-Ok, ``consumer_id`` None) for ``entry_id`` went into the
        socket's send buffer; one row per delivery attempt."""
        ...

    def acked(self, ts_ns: int, entry_id: int, outcome: str = ACKED) -> None:
        """Worker: the client settled ``entry_id``: ``acked``, ``rejected`` or ``requeued``."""
        ...

    def acked_many(self, ts_ns: int, entry_ids: Sequence[int], outcome: str = ACKED) -> None:
        """Worker: one frame (``multiple=True``) settled every entry of ``entry_ids``."""
        ...

    def settled(self, ts_ns: int, outcome: str, msg_id: int, entry_id: int, queue: str,
                pub_worker: int | None, pub_pid: int | None, pub_seq: int | None,
                consumer_worker: int | None = None, consumer_id: int | None = None,
                redelivered: int = 0, enqueued_ns: int | None = None,
                notified_ns: int | None = None, pulled_ns: int | None = None,
                exchange: str | None = None, routing_key: str | None = None,
                body_size: int | None = None) -> None:
        """Supervisor: the wide row, once per entry at its final settlement.

        ``outcome``: acked, rejected, expired, dead-lettered or dropped (a requeue is not final:
        :meth:`requeue_event`). ``consumer_*``: who held it last (None if nobody); ``redelivered``
        how often it was redelivered; the three timestamps if they were stamped on the entry;
        exchange / routing key / size, if given, are checked against the publish row."""
        ...

    # ------------------------------------------------------------------- event rows

    def notify_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor: notifyWork for this consumer (its notify slot set)."""
        ...

    def pull_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int, n: int,
                   found_work: bool | None) -> None:
        """Supervisor: a Pull answered with ``n`` entries. ``found_work`` = ``n > 0`` for the
        first pull of this consumer after a notify (the pull the wake-up caused), else None."""
        ...

    def requeue_event(self, ts_ns: int, queue: str, entry_id: int, consumer_worker: int | None,
                      consumer_id: int | None) -> None:
        """Supervisor: ``entry_id`` went back to its queue (client requeue, channel or worker gone)."""
        ...

    def consume_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int,
                      consumer_tag: str, priority: int = 0, browser: bool = False) -> None:
        """A consumer subscribed (lets the report count consumers that received nothing)."""
        ...

    def cancel_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        """A consumer left its queue."""
        ...

    # ------------------------------------------------------------------- flushing

    def maybe_flush(self, now_ns: int | None = None) -> bool:
        """Flush if enough rows are pending or enough time passed since the last flush; cheap
        otherwise. Call it from the process's loop. Returns whether it flushed."""
        ...

    def close(self) -> None:
        """Flush what is pending and end every file (idempotent)."""
        ...

