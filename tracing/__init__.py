"""``shoal serve --trace``: the hooks the broker's processes call, their Arrow writer, the trace schema.

    tracing            TraceWriter (the interface the runtime annotates with) and open_writer()
    tracing.hooks      the TraceWriter Protocol: which process calls which hook, and when
    tracing.schema     the tables, row kinds and columns of a trace directory (pyarrow)
    tracing.streams    ArrowWriter: buffering, flushing and rotating Arrow IPC stream files (pyarrow)
    tracing.writer     ArrowTraceWriter: the supervisor's and the workers' writer (pyarrow)
    tracing.reader     reading trace files back, whole or cut short (pyarrow)

Importing this package loads nothing heavy; pyarrow is imported only when a writer is opened or a
trace read.
"""

from __future__ import annotations

import os

from tracing.hooks import TraceWriter

__all__ = ["TraceWriter", "open_writer"]


def open_writer(directory: str | os.PathLike[str], process_name: str, *,
                worker: int | None = None) -> TraceWriter:
    """The Arrow trace writer of one broker process: ``process_name`` ``"supervisor"`` (``worker``
    None) or ``"worker<k>"`` (``worker`` = ``k``); it creates ``directory`` if need be. Imports
    pyarrow: call it only with ``--trace``."""
    from tracing.writer import ArrowTraceWriter

    return ArrowTraceWriter(directory, process_name, worker=worker)
