"""``shoal serve --trace``: the hooks the broker's processes call, their Arrow writer, the trace schema.

    tracing.hooks    TraceWriter (the interface the runtime annotates with) and open_writer()
    tracing.schema   the tables, row kinds and columns of a trace directory (pyarrow)
    tracing.streams  ArrowWriter: buffering, flushing and rotating Arrow IPC stream files (pyarrow)
    tracing.writer   ArrowTraceWriter: the supervisor's and the workers' writer (pyarrow)
    tracing.reader   reading trace files back, whole or cut short (pyarrow)

Importing this package, or :mod:`tracing.hooks`, loads nothing heavy; pyarrow is imported only when
a writer is opened or a trace read.
"""

from tracing.hooks import TraceWriter, open_writer

__all__ = ["TraceWriter", "open_writer"]
