"""``shoal serve --trace``: the hooks the broker's processes call, their Arrow writer, the trace schema.

    tracing            re-exports TraceWriter, the interface the runtime annotates with
    tracing.hooks      the TraceWriter Protocol: which process calls which hook, and when
    tracing.names      the outcome column's words (acked, rejected, ...): plain strings, no pyarrow
    tracing.schema     the tables, row kinds and columns of a trace directory (pyarrow)
    tracing.streams    ArrowWriter: buffering, flushing and rotating Arrow IPC stream files (pyarrow)
    tracing.writer     ArrowTraceWriter and open_writer(): a broker process's writer (pyarrow)
    tracing.procs      ProcSampleWriter: psutil samples of the broker's processes (pyarrow)
    tracing.reader     reading trace files back, whole or cut short (pyarrow)

Importing this package loads nothing heavy and nothing else of it but ``tracing.hooks`` (which
imports none of its siblings' parents: no import cycle through this file). A process that traces
imports ``tracing.writer`` in its ``--trace`` branch; pyarrow comes with it.
"""

from __future__ import annotations

from tracing.hooks import TraceWriter

__all__ = ["TraceWriter"]
