"""Reading trace files back: whole or cut short, conformed to their table's full schema.

Used by the Spark report (on its executors) and by tests; imports pyarrow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from tracing import schema as ts


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

