"""Transitional: the runtime's trace writer moved to :mod:`tracing`. Only ``broker/supervisor.py``
and ``workers/worker.py`` still import it from here; delete this file once they use
:func:`tracing.open_writer`."""

from tracing.writer import ArrowTraceWriter as TraceWriter

__all__ = ["TraceWriter"]
