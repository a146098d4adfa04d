"""The supervisor's queue index on disk, and bringing persistent messages back at start.

``DIR/index/<n>.idx`` holds the records of :mod:`broker.message_journal` in ``ipc.logfile``
frames (msgpack payloads). The supervisor appends each batch's records in one write before the
batch's replies go out, and syncs off the event loop (:meth:`IndexLog.sync_plan`,
``ipc.logfile.sync_files`` in a thread, :meth:`IndexLog.synced_to`); a held publisher confirm
goes out once the sync covers its records. A torn tail is where a file's records end.

At start (:func:`load_index`), the files are read in order into what each durable queue holds:
its live messages in enqueue order, each with whether it had been delivered. :func:`restore`
reads every live body back (``ipc.logfile.BodyReader``, the checksum checked), places it in a
worker's arena -- once, at start: on the hot path the supervisor never copies body bytes -- and
enqueues it again, redelivered if it had been delivered. The index files stay as they are:
the journal, attached meanwhile, is *replaying* (``MessageJournal.replaying``) and records only
what changes -- messages expired or dropped at start, copies dead-lettered, entries whose body
is lost, queues gone -- in the new file :meth:`IndexLog.start` begins. Each restored message
counts in the file its E record is in, so an old file goes as soon as no live message has its
E record there (:meth:`IndexLog.remove_unneeded`): the index on disk follows what is queued,
not what was ever published. (Rewriting the restored state instead cost a fifth of a restore:
perf/README.md, R1.)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from broker.body_ref import pack_body_ref, paged_body_ref
from broker.message import BlindCopied, FullMessage, Message
from broker.message_journal import MessageJournal
from ipc.logfile import (
    INDEX_MAGIC,
    AppendFiles,
    BodyReader,
    FrameSizes,
    frame,
    iter_frames,
    sync_files,
    write_all,
)

log = logging.getLogger("shoal.store")

INDEX_DIR = "index"


def _index_files(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(directory / n for n in names if n.endswith(".idx") and n[:-4].isdigit())


@dataclass
class IndexState:
    """What the index files say: per durable queue, ``id -> [E record, delivered, file]`` in
    enqueue order (``file``: the number of the index file holding the E record); the highest
    store id; files read and records found."""

    queues: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    max_id: int = 0
    files: list[Path] = field(default_factory=list)
    records: int = 0
    torn: list[str] = field(default_factory=list)  # files whose tail was cut short or damaged


def load_index(data_dir: str | os.PathLike[str]) -> IndexState:
    state = IndexState()
    decode = msgspec.msgpack.Decoder().decode
    queues = state.queues
    for path in _index_files(Path(data_dir) / INDEX_DIR):
        state.files.append(path)
        number = int(path.name[:-4])
        data = path.read_bytes()
        if not data.startswith(INDEX_MAGIC):
            state.torn.append(f"{path}: not an index file")
            continue
        end = len(INDEX_MAGIC)
        for offset, payload in iter_frames(data, len(INDEX_MAGIC)):
            end = offset + 8 + len(payload)
            try:
                rec = decode(payload)
            except msgspec.DecodeError:
                state.torn.append(f"{path}: undecodable record at {offset}")
                break
            state.records += 1
            kind = rec[0]
            if kind == "E":
                queues.setdefault(rec[1], {})[rec[2]] = [rec, False, number]
                state.max_id = max(state.max_id, rec[2])
            elif kind == "D":
                entry = queues.get(rec[1], {}).get(rec[2])
                if entry is not None:
                    entry[1] = True
            elif kind == "R":
                queues.get(rec[1], {}).pop(rec[2], None)
            elif kind == "P":
                kept = set(rec[2])
                held = queues.get(rec[1])
                if held is not None:
                    queues[rec[1]] = {k: v for k, v in held.items() if k in kept}
            elif kind == "X":
                queues.pop(rec[1], None)
        if end < len(data):
            state.torn.append(f"{path}: {len(data) - end} byte(s) after the last whole record")
    return state


INDEX_FILE_BYTES = 16 << 20  # an index file is closed at this size and the next one begun


class IndexLog(AppendFiles):
    """The index files being appended to (the newest) and retired (older, still needed); the
    sync positions are journal marks."""

    def __init__(self, data_dir: str | os.PathLike[str], *, file_bytes: int = INDEX_FILE_BYTES) -> None:
        super().__init__(Path(data_dir) / INDEX_DIR)
        self.file_bytes = file_bytes
        self._encode = msgspec.msgpack.Encoder().encode
        existing = _index_files(self.directory)
        self.number = int(existing[-1].name[:-4]) + 1 if existing else 0  # the file written now
        self.bytes = 0  # of the newest file
        self.files: list[int] = []  # the numbers of this broker's index files, oldest first
        self._wrote = False  # bytes written since the last sync_plan

    @property
    def unsynced(self) -> bool:
        """Also when only files changed: a retired file to sync, a removal to make durable."""
        return self.synced < self.written or bool(self._retired) or self._dir_dirty

    def _path(self, number: int) -> Path:
        return self.directory / f"{number:010d}.idx"

    def start(self, records: list[tuple[Any, ...]], mark: int, old: list[Path]) -> None:
        """Begin file ``number`` holding ``records`` (what changed while restoring) and sync it.
        The ``old`` files stay, read again at the next start, until no live message has its E
        records there (:meth:`remove_unneeded`, oldest first)."""
        self.bytes = self._begin(self._path(self.number), INDEX_MAGIC)
        self.files = [int(p.name[:-4]) for p in old] + [self.number]
        self.append(records, mark)
        _, fds = self.sync_plan()
        sync_files(fds)
        self.synced_to(mark, fds)
        sync_files([self._dir_fd])

    def append(self, records: list[tuple[Any, ...]], mark: int) -> None:
        """Write a batch's records (one write); not on disk until a sync covers ``mark``."""
        if records:
            encode = self._encode
            self.bytes += write_all(self._fd, [b"".join(frame(encode(r)) for r in records)])
            self._wrote = True
        self.written = mark

    def sync_plan(self) -> tuple[int, list[int]]:
        """As AppendFiles', but no file to sync when every record since the last sync cancelled
        out (nothing was written): the marks move on without an fsync."""
        if not (self._wrote or self._retired or self._dir_dirty):
            return self.written, []
        self._wrote = False
        return super().sync_plan()

    def rotate(self) -> bool:
        """Begin the next file if the newest is full (between batches); True if it did."""
        if self.bytes < self.file_bytes:
            return False
        self.number += 1
        self.bytes = self._begin(self._path(self.number), INDEX_MAGIC)
        self.files.append(self.number)
        return True

    def remove_unneeded(self, needed: Any) -> int:
        """Remove the older files, oldest first, while ``needed(number)`` says no message alive
        has its E records there; returns how many went."""
        removed = 0
        files = self.files
        while len(files) > 1 and not needed(files[0]):
            self._path(files.pop(0)).unlink(missing_ok=True)
            self._dir_dirty = True
            removed += 1
        return removed


class ArenasFull(Exception):
    """The persistent messages to restore do not fit the workers' arenas."""


@dataclass
class Restored:
    messages: int = 0  # queue entries restored
    bodies: int = 0  # distinct bodies placed in arenas
    paged: int = 0  # distinct bodies left on disk, paged out (a lazy restore)
    bytes: int = 0
    lost: int = 0  # entries whose body was missing or damaged on disk (never confirmed)
    dropped: list[Message] = field(default_factory=list)  # restored bodies no queue took
    gone: set[str] = field(default_factory=set)  # queues in the index that no longer exist
    per_arena: list[int] = field(default_factory=list)  # bytes placed in each arena


def restore(state: IndexState, journal: MessageJournal, data_dir: str | os.PathLike[str],
            arenas: list[Any], place: Any, *, lazy: bool = False) -> Restored:
    """Bring every live entry of ``state`` back into the durable queues ``place`` finds.

    ``arenas[k]`` is worker k's arena (``ipc.arena.Arena``); ``place(queue_name, message,
    redelivered, enqueued_at)`` enqueues one message on a queue and returns False when the queue
    does not exist any more. ``lazy`` (paging on, ``broker.paging``): every body stays on disk,
    paged out, and only its frame is checked for being whole (a torn tail is lost); its CRC is
    checked when it is read, on delivery. Otherwise each body is read, checked and placed in an
    arena, and :class:`ArenasFull` is raised when they do not fit."""
    result = Restored(per_arena=[0] * len(arenas))
    reader = BodyReader(data_dir)
    frames = FrameSizes(data_dir)
    by_id: dict[int, Message | None] = {}
    next_arena = 0
    segments: dict[tuple[int, int], int] = {}  # restored bodies per (worker, segment)
    files: dict[int, int] = {}  # restored messages per index file of their E record
    journal.replaying = True
    try:
        for queue_name, entries in state.queues.items():
            for store_id, (rec, delivered, file) in entries.items():
                if store_id in by_id:
                    message = by_id[store_id]
                else:
                    if lazy:
                        message = _paged(rec, frames, result, file)
                    else:
                        loaded = _load(rec, reader, arenas, next_arena, result, file)
                        message = None
                        if loaded is not None:
                            message, k = loaded
                            next_arena = (k + 1) % len(arenas)  # spread the bodies over them
                    if message is not None:  # counted for the journal (restored_bodies)
                        segment = (rec[3], rec[4])
                        segments[segment] = segments.get(segment, 0) + 1
                        files[file] = files.get(file, 0) + 1
                    by_id[store_id] = message
                if message is None:  # on record as gone, so that no later start looks again
                    journal.lost(queue_name, store_id)
                    result.lost += 1
                    continue
                if place(queue_name, message, delivered, rec[13]):
                    result.messages += 1
                elif queue_name not in result.gone:  # on record: no later queue of that name
                    journal.deleted(queue_name)  # gets these messages
                    result.gone.add(queue_name)
    finally:
        journal.restored_bodies(max(by_id, default=0), segments, files)
        journal.replaying = False
        reader.close()
        frames.close()
    result.dropped = [m for m in by_id.values() if m is not None and m.refs == 0]
    return result


def _message(rec: list[Any], body_ref: int, body_len: int, index_file: int) -> Message:
    (_, _, store_id, worker, segment, offset, length, exchange, routing_key, headers, expiration,
     priority, reheadered, _enqueued_at) = rec
    cls = BlindCopied if reheadered else FullMessage
    message = cls(0, exchange, routing_key, body_ref, body_len, headers, expiration=expiration,
                  priority=priority)
    message.stored = (store_id, worker, segment, offset, length, index_file)
    return message


def _paged(rec: list[Any], frames: FrameSizes, result: Restored, file: int) -> Message | None:
    """The message of an ``E`` record with its body left on disk, or None when its frame is
    missing or cut short."""
    worker, segment, offset, length = rec[3], rec[4], rec[5], rec[6]
    sizes = frames.sizes(worker, segment, offset, length)
    if sizes is None:
        return None
    header_len, body_len = sizes
    result.paged += 1
    return _message(rec, paged_body_ref(0, header_len, body_len, worker, segment, offset),
                    body_len, file)


def _load(rec: list[Any], reader: BodyReader, arenas: list[Any], first: int,
          result: Restored, file: int) -> tuple[Message, int] | None:
    """The message of an ``E`` record and the arena its body went to, or None when its body
    is missing or damaged."""
    read = reader.read(rec[3], rec[4], rec[5], rec[6])
    if read is None:
        return None
    header, body = read
    size = len(header) + len(body)
    for i in range(len(arenas)):
        k = (first + i) % len(arenas)
        at = arenas[k].alloc(size)
        if at is None:
            continue
        with arenas[k].view(at, size) as view:
            view[:len(header)] = header
            view[len(header):] = body
        message = _message(rec, pack_body_ref(k, at, len(header), len(body)), len(body), file)
        result.bodies += 1
        result.bytes += size
        result.per_arena[k] += size
        return message, k
    raise ArenasFull(f"{result.bytes + size} bytes of persistent messages do not fit the arenas")
