"""Cheap columnar trace writing: Python lists per column in, Arrow IPC stream files out.

:class:`ArrowWriter` is the flushing machinery every trace writer shares: the broker's
(:class:`tracing.writer.ArrowTraceWriter`) and the perf scripts' (``perf.trace_writers``). The
schemas, the file naming and which process writes which row are in :mod:`tracing.schema`.

Cost model
----------
* A row is one method call and one ``list.append`` per column the row fills (3 to 17 of them,
  bound methods prepared once): no object per row, no dict, no tuple, no lock. Each row kind has
  its own stream file holding only its own columns; the writer's identity (process, pid, worker
  index) and the row kind are written once per file, as schema metadata, not per row.
* :meth:`ArrowWriter.maybe_flush` is what the runtime calls from its loop (say once per loop
  iteration or per drained ring batch): it costs a few ``len`` calls unless ``flush_rows`` rows
  are pending or ``flush_ms`` has passed since the last flush; then it converts the pending lists
  into one Arrow record batch per row kind and writes each as a complete IPC message to that
  kind's stream file, followed by a flush to the OS. About 30 ns per cell, so a 4096-row batch
  of a 7-column kind pauses the loop for about a millisecond. ``python -m perf.trace_cost``
  prints the cost per row of each method on this machine (0.25–1 µs, flushing included).
* No thread: the conversion walks Python objects and therefore holds the GIL, so a writer thread
  would take the same CPU from the same process, plus a hand-off, and make the pause harder to
  bound; the write itself goes to the page cache (no fsync), which is microseconds. Smaller
  ``flush_rows`` means shorter pauses.
* A crash loses at most the rows not yet flushed (one open batch per row kind): every flushed
  batch is a complete IPC message in the kernel's hands. A reader of a truncated file gets every
  complete batch (:func:`tracing.reader.read_stream_file`).
* Tracing off costs only the caller's ``if trace is not None`` check; import this module lazily
  (pyarrow takes ~0.3 s and ~50 MB to load): the runtime does, through
  :func:`tracing.writer.open_writer`.

A writer is not thread-safe and belongs to one process (fork a new one per process).
"""
from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pyarrow.ipc

from tracing import schema as ts

log = logging.getLogger("shoal.trace")

DEFAULT_FLUSH_ROWS = 4096
DEFAULT_FLUSH_MS = 200
DEFAULT_ROTATE_BYTES = 64 << 20
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")


# --------------------------------------------------------------------------- stream files


class _StreamFile:
    """One row kind's Arrow IPC stream for one process, rotated by size or batch count."""

    def __init__(self, directory: Path, table: str, kind: str, process: str, pid: int,
                 schema: pa.Schema, rotate_bytes: int, rotate_batches: int | None,
                 options: Any) -> None:
        self.directory, self.table, self.kind, self.process, self.pid = (
            directory, table, kind, process, pid)
        self.schema = schema
        self.rotate_bytes = rotate_bytes
        self.rotate_batches = rotate_batches
        self.options = options
        self.paths: list[Path] = []
        self._index = 0
        self._sink: Any = None
        self._writer: Any = None
        self._batches = 0

    def _open(self) -> None:
        while True:
            path = self.directory / ts.file_name(self.table, self.kind, self.process, self.pid,
                                                 self._index)
            self._index += 1
            if not path.exists():  # a recycled pid must not overwrite an older run's file
                break
        raw = pa.OSFile(str(path), "wb")
        self._sink = pa.BufferedOutputStream(raw, 1 << 20)
        self._writer = pa.ipc.new_stream(self._sink, self.schema, options=self.options)
        self._sink.flush()  # the schema message: a file with no batch yet is still readable
        self._batches = 0
        self.paths.append(path)

    def write(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._open()
        self._writer.write_batch(batch)
        self._sink.flush()  # the whole IPC message to the OS before we return
        self._batches += 1
        if self._sink.tell() >= self.rotate_bytes or (
            self.rotate_batches is not None and self._batches >= self.rotate_batches
        ):
            self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()  # end-of-stream marker
            self._sink.close()
            self._writer = self._sink = None


# --------------------------------------------------------------------------- column buffers


def _to_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array(values).cast(type_)  # e.g. bools into an int32 column


class _Buffer:
    """The pending rows of one row kind, one list per column it fills, and its stream file.

    The file's schema holds only these columns; the columns that are the same for every row of
    the kind (stage / kind, process, pid, worker index, ...) are written once, as schema
    metadata ``shoal.const.<column>``, and put back by :func:`conform` when read."""

    __slots__ = ("appends", "kind", "lists", "names", "schema", "stream")

    def __init__(self, kind: str, names: Sequence[str], stream: _StreamFile) -> None:
        self.kind = kind
        self.names = tuple(names)
        self.lists: tuple[list[Any], ...] = tuple([] for _ in self.names)
        self.appends = tuple(values.append for values in self.lists)
        self.stream = stream
        self.schema = stream.schema

    def __len__(self) -> int:
        return len(self.lists[0])

    def to_batch(self) -> pa.RecordBatch:
        arrays = [_to_array(values, field.type)
                  for values, field in zip(self.lists, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def clear(self) -> None:
        for values in self.lists:
            values.clear()  # in place: the bound appends stay valid


class ArrowWriter:
    """The flushing machinery shared by every writer: a subclass declares its row kinds with
    :meth:`_kinds` and appends to the lists it gets back."""

    def __init__(self, directory: str | os.PathLike[str], process_name: str, *,
                 flush_rows: int = DEFAULT_FLUSH_ROWS, flush_ms: float = DEFAULT_FLUSH_MS,
                 rotate_bytes: int = DEFAULT_ROTATE_BYTES, rotate_batches: int | None = None,
                 compression: str | None = None, pid: int | None = None) -> None:
        if not _NAME.match(process_name):
            raise ValueError(f"process name {process_name!r}: letters, digits, '_' and '.' only")
        if flush_rows < 1 or flush_ms < 0 or rotate_bytes < 1:
            raise ValueError("flush_rows and rotate_bytes must be positive, flush_ms not negative")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = process_name
        self.pid = os.getpid() if pid is None else pid
        self.flush_rows = flush_rows
        self.flush_interval_ns = int(flush_ms * 1e6)
        self._rotate = (rotate_bytes, rotate_batches)
        self._options = pa.ipc.IpcWriteOptions(compression=compression)
        self._buffers: list[_Buffer] = []
        self._firsts: list[list[Any]] = []  # each buffer's first column, to count pending rows
        self._last_flush_ns = time.monotonic_ns()
        self.rows_written = 0
        self.batches_written = 0
        self.rows_dropped = 0
        self.flush_seconds = 0.0  # cumulative time spent in flush(): the writer's own cost
        self.closed = False

    def _kinds(self, table: str, kind_column: str | None,
               kinds: Mapping[str, tuple[Sequence[str], Mapping[str, Any]]]) -> tuple[_Buffer, ...]:
        """One buffer (and stream) per row kind: ``kind -> (columns, constant columns)``."""
        full = ts.SCHEMAS[table]
        buffers = []
        for kind, (names, consts) in kinds.items():
            unknown = (set(names) | {c for c, v in consts.items() if v is not None}) - set(full.names)
            if unknown:
                raise ValueError(f"{table}/{kind}: columns {sorted(unknown)} not in the schema")
            constants = {"process": self.process, "pid": self.pid, **consts}
            if kind_column:
                constants[kind_column] = kind
            metadata = {"shoal.table": table, "shoal.kind": kind, "shoal.format": ts.FORMAT_VERSION}
            metadata.update({ts.CONST_PREFIX + col: str(value) for col, value in constants.items()
                             if col in full.names and value is not None})
            schema = pa.schema([full.field(n) for n in names], metadata=metadata)
            stream = _StreamFile(self.directory, table, kind, self.process, self.pid, schema,
                                 *self._rotate, self._options)
            buf = _Buffer(kind, names, stream)
            buf.to_batch()  # warm pyarrow up now (its first conversion imports numpy)
            buffers.append(buf)
        self._buffers.extend(buffers)
        self._firsts.extend(buf.lists[0] for buf in buffers)
        return tuple(buffers)

    # ----------------------------------------------------------------------- flushing

    @property
    def pending(self) -> int:
        """Rows buffered and not yet written."""
        return sum(map(len, self._firsts))

    @property
    def paths(self) -> list[Path]:
        """Every file this writer has opened, in order per row kind."""
        return [p for buf in self._buffers for p in buf.stream.paths]

    def maybe_flush(self, now_ns: int | None = None) -> bool:
        """Flush if ``flush_rows`` rows are pending or ``flush_ms`` passed since the last flush.

        Call it from the process's loop; ``now_ns`` is ``time.monotonic_ns()`` (pass the one you
        already have). Returns whether it flushed."""
        if now_ns is None:
            now_ns = time.monotonic_ns()
        n = sum(map(len, self._firsts))
        if n == 0:
            self._last_flush_ns = now_ns
            return False
        if n >= self.flush_rows or now_ns - self._last_flush_ns >= self.flush_interval_ns:
            self.flush(now_ns)
            return True
        return False

    def flush(self, now_ns: int | None = None) -> None:
        """Write every pending row now: one record batch per row kind that has rows."""
        started = time.perf_counter()
        for buf in self._buffers:
            n = len(buf)
            if not n:
                continue
            try:
                if self.closed:
                    raise ValueError("writer is closed")
                buf.stream.write(buf.to_batch())
            except Exception as exc:  # noqa: BLE001 - tracing must never take the broker down
                self.rows_dropped += n
                log.error("trace %s/%s: %d rows dropped: %s", buf.stream.table, buf.kind, n, exc)
            else:
                self.rows_written += n
                self.batches_written += 1
            buf.clear()
        self._last_flush_ns = time.monotonic_ns() if now_ns is None else now_ns
        self.flush_seconds += time.perf_counter() - started

    def close(self) -> None:
        """Flush what is pending and end every stream (idempotent)."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        for buf in self._buffers:
            try:
                buf.stream.close()
            except Exception as exc:  # noqa: BLE001
                log.error("trace %s/%s: close failed: %s", buf.stream.table, buf.kind, exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

