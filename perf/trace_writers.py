"""The perf scripts' own trace rows, beside the broker's: psutil samples (``proc`` table, the
writer the traced broker's supervisor uses too: :class:`tracing.procs.ProcSampleWriter`) and the
load generator's send / receive times (``client`` table), for the Spark report.

Built on :class:`tracing.streams.ArrowWriter`; the tables are in :mod:`tracing.schema`. Imports
pyarrow: import this module only when tracing.
"""

from __future__ import annotations

import os
from typing import Any

from tracing import schema as ts
from tracing.procs import ProcSampleWriter
from tracing.streams import ArrowWriter

__all__ = ["ClientTraceWriter", "ProcSampleWriter"]


class ClientTraceWriter(ArrowWriter):
    """The load generator's per-message send / receive times, ``client`` table."""

    def __init__(self, directory: str | os.PathLike[str], process_name: str, **options: Any) -> None:
        super().__init__(directory, process_name, **options)
        self._send_cols = ("ts_ns", "publisher", "seq", "n", "queue")
        cols = ("ts_ns", "publisher", "seq", "sent_ns", "queue", "redelivered")
        (self._snd, self._rcv) = (b.appends for b in self._kinds(ts.CLIENT, "kind", {
            ts.SEND: (self._send_cols, {"client": self.process}),
            ts.RECV: (cols, {"client": self.process, "n": 1}),
        }))

    def sent(self, ts_ns: int, publisher: int, first_seq: int, n: int, queue: str) -> None:
        """Publisher ``publisher`` wrote messages ``first_seq .. first_seq+n-1`` at ``ts_ns``."""
        a0, a1, a2, a3, a4 = self._snd
        a0(ts_ns); a1(publisher); a2(first_seq); a3(n); a4(queue)

    def received(self, ts_ns: int, publisher: int, seq: int, sent_ns: int, queue: str,
                 redelivered: bool = False) -> None:
        """A consumer parsed message ``publisher``/``seq`` (stamped ``sent_ns``) at ``ts_ns``."""
        a0, a1, a2, a3, a4, a5 = self._rcv
        a0(ts_ns); a1(publisher); a2(seq); a3(sent_ns); a4(queue); a5(redelivered)

