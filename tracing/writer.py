"""The broker's trace writer: :class:`tracing.hooks.TraceWriter` written as Arrow IPC streams.

Made by :func:`open_writer` (the runtime, in its ``--trace`` branch) or directly (tests,
benchmarks); imports pyarrow. The cost model is in :mod:`tracing.streams`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from tracing import schema as ts
from tracing.hooks import TraceWriter
from tracing.names import ACKED
from tracing.streams import (
    DEFAULT_FLUSH_MS,
    DEFAULT_FLUSH_ROWS,
    DEFAULT_ROTATE_BYTES,
    ArrowWriter,
)


class ArrowTraceWriter(ArrowWriter, TraceWriter):
    """The broker's trace: message stage rows (``msg`` table) and event rows (``event`` table).

    ``process_name``: ``"supervisor"`` or ``"worker<k>"``; ``worker``: the worker index ``k``
    (None in the supervisor) — it fills ``pub_worker`` of publish rows and ``consumer_worker`` of
    deliver / ack rows. Which process calls which method, and when, is documented on
    :class:`tracing.hooks.TraceWriter`; the columns each row fills, in :mod:`tracing.schema`.
    """

    def __init__(self, directory: str | os.PathLike[str], process_name: str, *,
                 worker: int | None = None, flush_rows: int = DEFAULT_FLUSH_ROWS,
                 flush_ms: float = DEFAULT_FLUSH_MS, rotate_bytes: int = DEFAULT_ROTATE_BYTES,
                 rotate_batches: int | None = None, compression: str | None = None,
                 pid: int | None = None) -> None:
        super().__init__(directory, process_name, flush_rows=flush_rows, flush_ms=flush_ms,
                         rotate_bytes=rotate_bytes, rotate_batches=rotate_batches,
                         compression=compression, pid=pid)
        self.worker = worker
        self.pub_seq = 0  # Publish records traced so far by this process (worker side)

        def stage(name: str) -> tuple[tuple[str, ...], dict[str, Any]]:
            consts = {col: getattr(self, attr) for col, attr in
                      ts.STAGE_CONSTANTS.get(name, {}).items()}
            return ts.STAGE_COLUMNS[name], consts

        msg = self._kinds(ts.MESSAGES, "stage", {s: stage(s) for s in ts.STAGES})
        (self._pub, self._enq, self._ntf, self._pul, self._dlv, self._ack, self._stl) = (
            b.appends for b in msg)
        self._ack_lists = msg[ts.STAGES.index(ts.ACK)].lists
        (self._e_ntf, self._e_pul, self._e_rq, self._e_con, self._e_can) = (
            b.appends for b in self._kinds(ts.EVENTS, "kind", {
                kind: (ts.EVENT_COLUMNS[kind], {}) for kind in ts.EVENT_KINDS
            })
        )

    # ------------------------------------------------------------------- message stage rows

    def published(self, ts_ns: int, conn: int, channel: int, exchange: str, routing_key: str,
                  body_size: int) -> int:
        self.pub_seq = seq = self.pub_seq + 1
        a0, a1, a2, a3, a4, a5, a6 = self._pub
        a0(ts_ns); a1(seq); a2(conn); a3(channel); a4(exchange); a5(routing_key); a6(body_size)
        return seq

    def enqueued(self, ts_ns: int, msg_id: int, entry_id: int, queue: str, pub_worker: int,
                 pub_pid: int, pub_seq: int, exchange: str, routing_key: str,
                 body_size: int) -> None:
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = self._enq
        a0(ts_ns); a1(msg_id); a2(entry_id); a3(queue); a4(pub_worker); a5(pub_pid)
        a6(pub_seq); a7(exchange); a8(routing_key); a9(body_size)

    def notified(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        a0, a1, a2, a3 = self._ntf
        a0(ts_ns); a1(entry_id); a2(consumer_worker); a3(consumer_id)

    def pulled(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        a0, a1, a2, a3 = self._pul
        a0(ts_ns); a1(entry_id); a2(consumer_worker); a3(consumer_id)

    def delivered(self, ts_ns: int, entry_id: int, queue: str, consumer_id: int | None,
                  consumer_tag: str, redelivered: bool) -> None:
        a0, a1, a2, a3, a4, a5 = self._dlv
        a0(ts_ns); a1(entry_id); a2(queue); a3(consumer_id); a4(consumer_tag)
        a5(1 if redelivered else 0)

    def acked(self, ts_ns: int, entry_id: int, outcome: str = ACKED) -> None:
        a0, a1, a2 = self._ack
        a0(ts_ns); a1(entry_id); a2(outcome)

    def acked_many(self, ts_ns: int, entry_ids: Sequence[int], outcome: str = ACKED) -> None:
        n = len(entry_ids)
        c0, c1, c2 = self._ack_lists
        c0.extend([ts_ns] * n); c1.extend(entry_ids); c2.extend([outcome] * n)

    def settled(self, ts_ns: int, outcome: str, msg_id: int, entry_id: int, queue: str,
                pub_worker: int | None, pub_pid: int | None, pub_seq: int | None,
                consumer_worker: int | None = None, consumer_id: int | None = None,
                redelivered: int = 0, enqueued_ns: int | None = None,
                notified_ns: int | None = None, pulled_ns: int | None = None,
                exchange: str | None = None, routing_key: str | None = None,
                body_size: int | None = None) -> None:
        (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16) = self._stl
        a0(ts_ns); a1(outcome); a2(msg_id); a3(entry_id); a4(queue); a5(pub_worker)
        a6(pub_pid); a7(pub_seq); a8(consumer_worker); a9(consumer_id); a10(redelivered)
        a11(enqueued_ns); a12(notified_ns); a13(pulled_ns); a14(exchange); a15(routing_key)
        a16(body_size)

    # ------------------------------------------------------------------- event rows

    def notify_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        a0, a1, a2, a3 = self._e_ntf
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id)

    def pull_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int, n: int,
                   found_work: bool | None) -> None:
        a0, a1, a2, a3, a4, a5 = self._e_pul
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id); a4(n); a5(found_work)

    def requeue_event(self, ts_ns: int, queue: str, entry_id: int, consumer_worker: int | None,
                      consumer_id: int | None) -> None:
        a0, a1, a2, a3, a4 = self._e_rq
        a0(ts_ns); a1(queue); a2(entry_id); a3(consumer_worker); a4(consumer_id)

    def consume_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int,
                      consumer_tag: str, priority: int = 0, browser: bool = False) -> None:
        a0, a1, a2, a3, a4, a5, a6 = self._e_con
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id); a4(consumer_tag)
        a5(priority); a6(browser)

    def cancel_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        a0, a1, a2, a3 = self._e_can
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id)


def open_writer(directory: str | os.PathLike[str], process_name: str, *,
                worker: int | None = None) -> TraceWriter:
    """The Arrow trace writer of one broker process: ``process_name`` ``"supervisor"`` (``worker``
    None) or ``"worker<k>"`` (``worker`` = ``k``); it creates ``directory`` if need be."""
    return ArrowTraceWriter(directory, process_name, worker=worker)
