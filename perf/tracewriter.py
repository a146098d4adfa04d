"""Cheap columnar trace writers: Python lists per column in, Arrow IPC stream files out.

The broker's processes call :class:`TraceWriter`; the perf scripts call :class:`ProcSampleWriter`
(psutil samples) and the load generator :class:`ClientTraceWriter`. The schemas, the file naming
and which process writes which row are in :mod:`perf.trace_schema`.

Cost model
----------
* A row is one method call and one ``list.append`` per column the row fills (3 to 17 of them,
  bound methods prepared once): no object per row, no dict, no tuple, no lock. Each row kind has
  its own stream file holding only its own columns; the writer's identity (process, pid, worker
  index) and the row kind are written once per file, as schema metadata, not per row.
* :meth:`TraceWriter.maybe_flush` is what the runtime calls from its loop (say once per loop
  iteration or per drained ring batch): it costs a few ``len`` calls unless ``flush_rows`` rows
  are pending or ``flush_ms`` has passed since the last flush; then it converts the pending lists
  into one Arrow record batch per row kind and writes each as a complete IPC message to that
  kind's stream file, followed by a flush to the OS. About 30 ns per cell, so a 4096-row batch
  of a 7-column kind pauses the loop for about a millisecond. ``python -m perf.tracewriter``
  prints the cost per row of each method on this machine (0.25–1 µs, flushing included).
* No thread: the conversion walks Python objects and therefore holds the GIL, so a writer thread
  would take the same CPU from the same process, plus a hand-off, and make the pause harder to
  bound; the write itself goes to the page cache (no fsync), which is microseconds. Smaller
  ``flush_rows`` means shorter pauses.
* A crash loses at most the rows not yet flushed (one open batch per row kind): every flushed
  batch is a complete IPC message in the kernel's hands. A reader of a truncated file gets every
  complete batch (:func:`read_stream_file`).
* Tracing off costs only the caller's ``if trace is not None`` check; import this module lazily
  (pyarrow takes ~0.3 s and ~50 MB to load).

A writer is not thread-safe and belongs to one process (fork a new one per process).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pyarrow.ipc

from perf import trace_schema as ts

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
        arrays = [_to_array(values, field.type) for values, field in zip(self.lists, self.schema, strict=True)]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def clear(self) -> None:
        for values in self.lists:
            values.clear()  # in place: the bound appends stay valid


class _ArrowWriter:
    """The flushing machinery shared by every writer."""

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


# --------------------------------------------------------------------------- the broker's writer


class TraceWriter(_ArrowWriter):
    """The broker's trace: message stage rows (``msg`` table) and event rows (``event`` table).

    ``process_name``: ``"supervisor"`` or ``"worker<k>"``; ``worker``: the worker index ``k``
    (None in the supervisor) — it fills ``pub_worker`` of publish rows and ``consumer_worker`` of
    deliver / ack rows. All timestamps are ``time.monotonic_ns()``.

    Which process calls what, and when (see :mod:`perf.trace_schema` for the columns):

    * worker, a complete publish put on the request ring: :meth:`published` (returns pub_seq);
    * supervisor, per entry created: :meth:`enqueued` (or stamp the entry, see :meth:`settled`);
      per notifyWork: :meth:`notify_event` (and :meth:`notified` for the entry whose enqueue did
      it); per Pull answered: :meth:`pull_event` (and :meth:`pulled` per entry acquired);
    * worker, Basic.Deliver / Get-Ok written: :meth:`delivered`; a client's ack / nack / reject
      read: :meth:`acked` (or :meth:`acked_many` for one ``multiple`` frame);
    * supervisor, an entry's final settlement (ack, reject, expiry, dead-letter, drop):
      :meth:`settled`; an entry put back: :meth:`requeue_event`; consumers coming and going:
      :meth:`consume_event`, :meth:`cancel_event`.
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
        """Worker: a publish is complete and its Publish record goes to the supervisor.

        Call it exactly once per Publish record, in ring order; returns that record's pub_seq."""
        self.pub_seq = seq = self.pub_seq + 1
        a0, a1, a2, a3, a4, a5, a6 = self._pub
        a0(ts_ns); a1(seq); a2(conn); a3(channel); a4(exchange); a5(routing_key); a6(body_size)
        return seq

    def enqueued(self, ts_ns: int, msg_id: int, entry_id: int, queue: str, pub_worker: int,
                 pub_pid: int, pub_seq: int, exchange: str, routing_key: str,
                 body_size: int) -> None:
        """Supervisor (optional partial row): entry ``entry_id`` of message ``msg_id`` was added
        to ``queue``; the publish key names the worker's Publish record it came from."""
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = self._enq
        a0(ts_ns); a1(msg_id); a2(entry_id); a3(queue); a4(pub_worker); a5(pub_pid)
        a6(pub_seq); a7(exchange); a8(routing_key); a9(body_size)

    def notified(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor (optional partial row): enqueuing ``entry_id`` notified this consumer."""
        a0, a1, a2, a3 = self._ntf
        a0(ts_ns); a1(entry_id); a2(consumer_worker); a3(consumer_id)

    def pulled(self, ts_ns: int, entry_id: int, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor (optional partial row): a Pull acquired ``entry_id`` for this consumer."""
        a0, a1, a2, a3 = self._pul
        a0(ts_ns); a1(entry_id); a2(consumer_worker); a3(consumer_id)

    def delivered(self, ts_ns: int, entry_id: int, queue: str, consumer_id: int | None,
                  consumer_tag: str, redelivered: bool) -> None:
        """Worker: Basic.Deliver (or Get-Ok, ``consumer_id`` None) for ``entry_id`` went into the
        socket's send buffer; one row per delivery attempt."""
        a0, a1, a2, a3, a4, a5 = self._dlv
        a0(ts_ns); a1(entry_id); a2(queue); a3(consumer_id); a4(consumer_tag)
        a5(1 if redelivered else 0)

    def acked(self, ts_ns: int, entry_id: int, outcome: str = ts.ACKED) -> None:
        """Worker: the client settled ``entry_id``: ``acked``, ``rejected`` or ``requeued``."""
        a0, a1, a2 = self._ack
        a0(ts_ns); a1(entry_id); a2(outcome)

    def acked_many(self, ts_ns: int, entry_ids: Sequence[int], outcome: str = ts.ACKED) -> None:
        """Worker: one frame (``multiple=True``) settled every entry of ``entry_ids``."""
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
        """Supervisor: the wide row, once per entry at its final settlement.

        ``outcome``: acked, rejected, expired, dead-lettered or dropped (a requeue is not final:
        :meth:`requeue_event`). ``consumer_*``: who held it last (None if nobody); ``redelivered``
        how often it was redelivered; the three timestamps if they were stamped on the entry;
        exchange / routing key / size, if given, are checked against the publish row."""
        (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16) = self._stl
        a0(ts_ns); a1(outcome); a2(msg_id); a3(entry_id); a4(queue); a5(pub_worker)
        a6(pub_pid); a7(pub_seq); a8(consumer_worker); a9(consumer_id); a10(redelivered)
        a11(enqueued_ns); a12(notified_ns); a13(pulled_ns); a14(exchange); a15(routing_key)
        a16(body_size)

    # ------------------------------------------------------------------- event rows

    def notify_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        """Supervisor: notifyWork for this consumer (its notify slot set)."""
        a0, a1, a2, a3 = self._e_ntf
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id)

    def pull_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int, n: int,
                   found_work: bool | None) -> None:
        """Supervisor: a Pull answered with ``n`` entries. ``found_work`` = ``n > 0`` for the
        first pull of this consumer after a notify (the pull the wake-up caused), else None."""
        a0, a1, a2, a3, a4, a5 = self._e_pul
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id); a4(n); a5(found_work)

    def requeue_event(self, ts_ns: int, queue: str, entry_id: int, consumer_worker: int | None,
                      consumer_id: int | None) -> None:
        """Supervisor: ``entry_id`` went back to its queue (client requeue, channel or worker gone)."""
        a0, a1, a2, a3, a4 = self._e_rq
        a0(ts_ns); a1(queue); a2(entry_id); a3(consumer_worker); a4(consumer_id)

    def consume_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int,
                      consumer_tag: str, priority: int = 0, browser: bool = False) -> None:
        """A consumer subscribed (lets the report count consumers that received nothing)."""
        a0, a1, a2, a3, a4, a5, a6 = self._e_con
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id); a4(consumer_tag)
        a5(priority); a6(browser)

    def cancel_event(self, ts_ns: int, queue: str, consumer_worker: int, consumer_id: int) -> None:
        """A consumer left its queue."""
        a0, a1, a2, a3 = self._e_can
        a0(ts_ns); a1(queue); a2(consumer_worker); a3(consumer_id)


# --------------------------------------------------------------------------- perf-side writers


class ProcSampleWriter(_ArrowWriter):
    """psutil samples of the broker's (and the clients') processes, ``proc`` table."""

    def __init__(self, directory: str | os.PathLike[str], process_name: str = "sampler",
                 **options: Any) -> None:
        options.setdefault("flush_rows", 256)
        options.setdefault("flush_ms", 1000)
        super().__init__(directory, process_name, **options)
        (self._s,) = (b.appends for b in self._kinds(ts.PROCS, None, {
            "sample": (ts.PROC_SCHEMA.names, {"process": None, "pid": None})}))
        self._last_cpu: dict[int, tuple[int, float]] = {}  # pid -> (ts_ns, CPU seconds)

    def sample(self, ts_ns: int, pid: int, name: str, cpu_percent: float | None, rss_bytes: int,
               cpu_user_s: float, cpu_system_s: float, ctx_voluntary: int,
               ctx_involuntary: int) -> None:
        """One sample of one process, values as psutil gives them (``ts_ns`` from the monotonic
        clock: ``int(time.monotonic() * 1e9)`` is fine). ``cpu_percent`` may be None: the report
        then derives it from the cumulative CPU times of consecutive samples."""
        for append, value in zip(self._s, (ts_ns, pid, name, cpu_percent, rss_bytes, cpu_user_s,
                                           cpu_system_s, ctx_voluntary, ctx_involuntary),
                                 strict=True):
            append(value)

    def sample_processes(self, processes: Mapping[str, Any], ts_ns: int | None = None) -> int:
        """Sample every ``name -> psutil.Process``; processes that are gone are skipped.

        ``cpu_percent`` is derived here from the process's CPU times since this writer's previous
        sample of the same pid, over the wall time between them (None for the first): not psutil's
        ``cpu_percent``, whose state is per Process object and which another caller sampling the
        same objects (perf.quick) resets -- that gave 0 % or 473 % on a 2-core host. Returns
        samples taken."""
        import psutil

        now = time.monotonic_ns() if ts_ns is None else ts_ns
        taken = 0
        last = self._last_cpu
        for name, proc in processes.items():
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    ctx = proc.num_ctx_switches()
                    rss = proc.memory_info().rss
            except psutil.Error:
                continue
            used = times.user + times.system
            previous = last.get(proc.pid)
            cpu = None
            if previous is not None and now > previous[0]:
                cpu = round(max(0.0, used - previous[1]) / ((now - previous[0]) / 1e9) * 100, 1)
            last[proc.pid] = (now, used)
            self.sample(now, proc.pid, name, cpu, rss, times.user, times.system, ctx.voluntary,
                        ctx.involuntary)
            taken += 1
        self.maybe_flush(now)
        return taken


class ClientTraceWriter(_ArrowWriter):
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


# --------------------------------------------------------------------------- reading


def read_stream_file(source: Any) -> tuple[list[pa.RecordBatch], bool]:
    """Every complete record batch of one Arrow IPC stream file, and whether the file was whole.

    ``source``: a path or a readable file. A file cut short (a crash mid-write) yields the batches
    before the cut and ``False``; so does a file whose schema message itself is cut (no batches)."""
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError, EOFError):
        return [], False
    batches: list[pa.RecordBatch] = []
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:
            return batches, True
        except (pa.ArrowInvalid, OSError, EOFError):
            return batches, False


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``'s columns and types.

    A column the batch lacks is filled from its schema's ``shoal.const.<column>`` metadata (the
    row kind's constant columns) or else null; extra columns are dropped, so files written by an
    older or newer writer still read."""
    if batch.schema.equals(schema, check_metadata=False):
        return batch
    n = batch.num_rows
    metadata = batch.schema.metadata or {}
    arrays = []
    for field in schema:
        idx = batch.schema.get_field_index(field.name)
        if idx >= 0:
            col = batch.column(idx)
            arrays.append(col if col.type == field.type else col.cast(field.type))
            continue
        const = metadata.get((ts.CONST_PREFIX + field.name).encode())
        if const is None:
            arrays.append(pa.nulls(n, field.type))
        else:
            arrays.append(pa.repeat(pa.scalar(const.decode()).cast(field.type), n))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def trace_files(directory: str | os.PathLike[str], table: str) -> list[Path]:
    """The files of ``table`` in a local trace directory, sorted by name."""
    return sorted(p for p in Path(directory).iterdir()
                  if p.is_file() and ts.table_of(p.name) == table)


def read_table(directory: str | os.PathLike[str], table: str) -> pa.Table:
    """One table of a local trace directory, read with pyarrow alone (small traces, tests)."""
    schema = ts.SCHEMAS[table]
    batches: list[pa.RecordBatch] = []
    for path in trace_files(directory, table):
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            batches.extend(conform(b, schema) for b in pq.read_table(path).to_batches())
        else:
            batches.extend(conform(b, schema) for b in read_stream_file(str(path))[0])
    return pa.Table.from_batches(batches, schema=schema)


def iter_batches(paths: Iterable[str], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Batches of many files (local paths or any URI pyarrow.fs understands), conformed."""
    from pyarrow import fs

    for path in paths:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            for batch in pq.read_table(path).to_batches():
                yield conform(batch, schema)
            continue
        filesystem, inner = fs.FileSystem.from_uri(path) if "://" in path else (fs.LocalFileSystem(), path)
        with filesystem.open_input_stream(inner) as stream:
            batches, _ = read_stream_file(stream)
        for batch in batches:
            yield conform(batch, schema)


# --------------------------------------------------------------------------- micro-benchmark


# Names as a real run has them (perf.quick's queue through the default exchange, pika's consumer
# tag): the strings are most of a row, so the bytes per message depend on them.
_BENCH_QUEUE = "perf.quick.3239"
_BENCH_TAG = "ctag1.0c7092bd635d49cca9636015dc555be8"


def bench(rows: int = 200_000, directory: str | None = None) -> dict[str, float]:
    """Cost per traced row of each hot method, flushing included (ns/row), in this process; and
    ``bytes_per_message``: the disk taken by one message's rows (publish, deliver, ack, settle)."""
    import tempfile

    results: dict[str, float] = {}
    q, tag = _BENCH_QUEUE, _BENCH_TAG
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        w = TraceWriter(tmp, "bench", worker=0)
        calls = {
            "published": lambda i: w.published(i, 1, 1, "", q, 128),
            "delivered": lambda i: w.delivered(i, i, q, 7, tag, False),
            "acked": lambda i: w.acked(i, i),
            "settled": lambda i: w.settled(i, ACKED_, i, i, q, 0, 1, i, 0, 7, 0, i, None, i),
            "notify_event": lambda i: w.notify_event(i, q, 0, 7),
        }
        loop = time.perf_counter()
        for i in range(rows):
            pass
        empty = time.perf_counter() - loop
        for name, call in calls.items():
            w.flush_seconds = 0.0
            started = time.perf_counter()
            maybe_flush = w.maybe_flush
            for i in range(rows):
                call(i)
                if not i & 63:  # the runtime calls maybe_flush once per loop pass, not per row
                    maybe_flush(i * 1000)
            w.flush()
            total = time.perf_counter() - started - empty
            results[name] = total / rows * 1e9
            results[name + ".flush_share"] = w.flush_seconds / total
        w.close()
        per_message = sum(p.stat().st_size for p in w.paths if p.name.startswith(ts.MESSAGES + "-"))
        results["bytes_per_message"] = per_message / rows
    return results


ACKED_ = ts.ACKED

if __name__ == "__main__":
    for key, value in bench().items():
        unit = {"share": "", "message": " bytes"}.get(key.rpartition("_")[2], " ns/row")
        print(f"{key:28s} {value:8.3f}{unit}")
