"""The supervisor's queue index on disk, and bringing persistent messages back at start.

``DIR/index/<n>.idx`` holds the records of :mod:`broker.messages.message_journal` in ``ipc.logfile``
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

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from broker.messages.body_ref import pack_body_ref, paged_body_ref
from broker.messages.message import BlindCopied, FullMessage, Message
from broker.messages.message_journal import MessageJournal
from ipc.logfile import (
    INDEX_MAGIC,
    INDEX_MAGIC_V1,
    SYNC,
    AppendFiles,
    BodyReader,
    FrameSizes,
    index_frame,
    scan_index,
    segment_path,
    sync_files,
    write_all,
)

log = logging.getLogger("shoal.store")

INDEX_DIR = "index"


def index_files(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(directory / n for n in names if n.endswith(".idx") and n[:-4].isdigit())


@dataclass
class Damage:
    """Bytes of an index file that are not whole, intact records."""

    path: Path
    offset: int
    size: int
    records: int  # frames begun in it: records lost, as far as can be told (0: unknown)
    torn: bool  # the newest file's tail after an unclean stop: never confirmed, not damage
    # queues with messages whose D, R, P or X records may have been in it (marked redelivered)
    queues: set[str] = field(default_factory=set)

    def describe(self) -> str:
        lost = f"{self.records} record(s) lost" if self.records else "records lost: unknown"
        return f"{self.path}: {self.size} byte(s) at offset {self.offset} skipped ({lost})"


@dataclass
class IndexState:
    """What the index files say: per durable queue, ``id -> [E record, delivered, file]`` in
    enqueue order (``file``: the number of the index file holding the E record); the highest
    store id; files read and records found; what could not be read."""

    queues: dict[str, dict[int, list[Any]]] = field(default_factory=dict)
    max_id: int = 0
    files: list[Path] = field(default_factory=list)
    records: int = 0
    torn: list[str] = field(default_factory=list)  # torn tails: never confirmed (WARNING)
    damage: list[Damage] = field(default_factory=list)  # records skipped (ERROR)
    # A U record (written at the first start after an unclean stop) says every message enqueued
    # before it may have been delivered: entries whose E record is in a file numbered below
    # this come back redelivered (after an unclean stop of the last run: every entry).
    redeliver_below: int = 0
    # (queue, id) named by D/R records after damage but never enqueued: their E was in it
    orphans: set[tuple[str, int]] = field(default_factory=set)
    tail: tuple[Path, int] | None = None  # the newest file's torn tail: where its records end

    def delivered(self, entry: list[Any]) -> bool:
        return bool(entry[1]) or entry[2] < self.redeliver_below


UNCLEAN = 1 << 62  # redeliver_below after an unclean stop: every entry


def _format(data: bytes, path: Path, state: IndexState, newest: bool, clean: bool) -> bool | None:
    """Whether ``data`` holds INDEX_MAGIC's frames (True) or INDEX_MAGIC_V1's (False); a
    damaged magic is damage, and the frames tell the format. None: nothing to read."""
    if data.startswith(INDEX_MAGIC):
        return True
    if data.startswith(INDEX_MAGIC_V1):
        return False
    if newest and not clean and len(data) <= len(INDEX_MAGIC):  # a crash as it was begun
        state.torn.append(f"{path}: {len(data)} byte(s), the file's header cut short")
        return None
    state.damage.append(Damage(path, 0, min(len(data), len(INDEX_MAGIC)), 0, False))
    return data.find(SYNC, len(INDEX_MAGIC)) >= 0


def load_index(data_dir: str | os.PathLike[str], *, clean: bool,
               sizes: dict[str, int] | None = None) -> IndexState:
    """Read every index file, oldest first. ``clean``: the last run stopped cleanly (its index
    is whole, and its D records exact); otherwise the newest file may end in a torn tail, and
    every message comes back redelivered (a D record not yet written at the stop is lost).
    ``sizes``: each file's size at that clean stop; a file shorter now lost its end to damage.

    Damage -- bytes that are not whole, intact records anywhere but a torn tail -- is skipped,
    and the records after it kept; every message enqueued before it is marked delivered (its
    D or R record may have been there)."""
    state = IndexState()
    paths = index_files(Path(data_dir) / INDEX_DIR)
    for path in paths:
        state.files.append(path)
        data = path.read_bytes()
        newest = path == paths[-1]
        synced = _format(data, path, state, newest, clean)
        if synced is not None:
            _read_file(state, path, data, synced, newest and not clean)
        expected = (sizes or {}).get(path.name, 0)
        if len(data) < expected:  # cut short since the clean stop: how many records, unknown
            last = state.damage[-1] if state.damage else None
            if last is not None and last.path == path and last.offset + last.size == len(data):
                last.size, last.records = expected - last.offset, 0
            else:
                _damaged(state, path, data, len(data), expected, synced is not False)
                state.damage[-1].records = 0
    if not clean:
        state.redeliver_below = UNCLEAN
    return state


def _read_file(state: IndexState, path: Path, data: bytes, synced: bool, tail_may_tear: bool) -> None:
    decode = msgspec.msgpack.Decoder().decode
    queues = state.queues
    number = int(path.name[:-4])
    damaged = bool(state.damage)
    records, max_id = 0, state.max_id
    for offset, payload, end in scan_index(data, synced):
        rec = None
        if payload is not None:
            try:
                rec = decode(payload)
            except msgspec.DecodeError:
                pass
        if rec is None:
            if end == len(data) and (tail_may_tear or not synced):
                # A torn tail: the newest file after a crash. A previous-format file never had
                # its torn tail cut, so one may end any such file.
                state.torn.append(f"{path}: {end - offset} byte(s) after the last whole record")
                if synced:
                    state.tail = (path, offset)
                continue
            _damaged(state, path, data, offset, end, synced)
            damaged = True
            continue
        records += 1
        kind = rec[0]
        if kind == "E":
            queues.setdefault(rec[1], {})[rec[2]] = [rec, False, number]
            if rec[2] > max_id:
                max_id = rec[2]
        elif kind == "D":
            entry = queues.get(rec[1], {}).get(rec[2])
            if entry is not None:
                entry[1] = True
            elif damaged:
                state.orphans.add((rec[1], rec[2]))
        elif kind == "R":
            if queues.get(rec[1], {}).pop(rec[2], None) is None and damaged:
                state.orphans.add((rec[1], rec[2]))
        elif kind == "P":
            kept = set(rec[2])
            held = queues.get(rec[1])
            if held is not None:
                queues[rec[1]] = {k: v for k, v in held.items() if k in kept}
        elif kind == "X":
            queues.pop(rec[1], None)
        elif kind == "U":
            state.redeliver_below = max(state.redeliver_below, number)
    state.records += records
    state.max_id = max_id


def _damaged(state: IndexState, path: Path, data: bytes, offset: int, end: int, synced: bool) -> None:
    """Bytes ``offset:end`` of ``path`` are damage: every message enqueued so far may have
    had a record there, so each is marked delivered."""
    records = max(1, data.count(SYNC, offset, end)) if synced and end <= len(data) else 1
    damage = Damage(path, offset, end - offset, records, False)
    for name, entries in state.queues.items():
        if entries:
            damage.queues.add(name)
            for entry in entries.values():
                entry[1] = True
    state.damage.append(damage)


def cut_torn_tail(state: IndexState) -> None:
    """Cut the newest file's torn tail off (never confirmed), so that it is no gap in an older
    file at a later start, where it would be damage."""
    if state.tail is None:
        return
    path, end = state.tail
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, end)
        os.fsync(fd)
    finally:
        os.close(fd)


INDEX_FILE_BYTES = 16 << 20  # an index file is closed at this size and the next one begun


class IndexLog(AppendFiles):
    """The index files being appended to (the newest) and retired (older, still needed); the
    sync positions are journal marks."""

    def __init__(self, data_dir: str | os.PathLike[str], *, file_bytes: int = INDEX_FILE_BYTES) -> None:
        super().__init__(Path(data_dir) / INDEX_DIR)
        self.file_bytes = file_bytes
        self._encode = msgspec.msgpack.Encoder().encode
        existing = index_files(self.directory)
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
            self.bytes += write_all(self._fd, [b"".join(index_frame(encode(r)) for r in records)])
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
    lost: dict[str, int] = field(default_factory=dict)  # per queue: entries whose body is not there
    cut_short: dict[str, int] = field(default_factory=dict)  # of those, past the end of its segment
    dropped: list[Message] = field(default_factory=list)  # restored bodies no queue took
    gone: dict[str, int] = field(default_factory=dict)  # queues in the index that do not exist: entries
    per_arena: list[int] = field(default_factory=list)  # bytes placed in each arena


def restore(state: IndexState, journal: MessageJournal, data_dir: str | os.PathLike[str],
            arenas: list[Any], place: Any, *, lazy: bool = False) -> Restored:
    """Bring every live entry of ``state`` back into the durable queues ``place`` finds.

    ``arenas[k]`` is worker k's arena (``ipc.arena.Arena``); ``place(queue_name, message,
    redelivered, enqueued_at)`` enqueues one message on a queue and returns False when the queue
    does not exist any more (``Restored.gone``: the caller decides what becomes of its
    entries). ``lazy`` (paging on, ``broker.storage.paging``): every body stays on disk, paged out, and
    only its frame is checked for being whole; its CRC is checked when it is read, on delivery.
    Otherwise each body is read, checked and placed in an arena, and :class:`ArenasFull` is
    raised when they do not fit. An entry whose body is not there is recorded as removed."""
    result = Restored(per_arena=[0] * len(arenas))
    reader = BodyReader(data_dir)
    frames = FrameSizes(data_dir)
    by_id: dict[int, Message | None] = {}
    next_arena = 0
    segments: dict[tuple[int, int], int] = {}  # restored bodies per (worker, segment)
    files: dict[int, int] = {}  # restored messages per index file of their E record
    redeliver_below = state.redeliver_below
    gone = result.gone
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
                    result.lost[queue_name] = result.lost.get(queue_name, 0) + 1
                    if _cut_short(data_dir, rec):
                        result.cut_short[queue_name] = result.cut_short.get(queue_name, 0) + 1
                    continue
                if queue_name in gone:
                    gone[queue_name] += 1
                elif place(queue_name, message, delivered or file < redeliver_below, rec[13]):
                    result.messages += 1
                else:
                    gone[queue_name] = 1
    finally:
        journal.restored_bodies(max(by_id, default=0), segments, files)
        journal.replaying = False
        reader.close()
        frames.close()
    result.dropped = [m for m in by_id.values() if m is not None and m.refs == 0]
    return result


def _cut_short(data_dir: str | os.PathLike[str], rec: list[Any]) -> bool:
    """Whether the body of E record ``rec`` lies past the end of its segment (or the segment
    is not there): not yet synced at a crash, or damage; a body there but unreadable is damage."""
    try:
        size = os.stat(segment_path(data_dir, rec[3], rec[4])).st_size
    except FileNotFoundError:
        return True
    return bool(rec[5] + rec[6] > size)


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


QUARANTINE_DIR = "quarantine"


@dataclass
class SetAside:
    """What a start moved or copied into ``DIR/quarantine/<time>/`` instead of deleting it."""

    path: Path | None = None
    index_files: int = 0  # copied: they hold records of queues gone, or damage
    copied_segments: int = 0  # copied: they hold bodies of queues gone (and may hold live ones)
    moved_segments: int = 0  # moved: no message known needs them, but index records were lost


def set_aside(data_dir: str | os.PathLike[str], state: IndexState, gone: set[str],
              unneeded: list[tuple[int, int]]) -> SetAside:
    """Keep what recovery cannot account for: the index files holding records of the queues
    ``gone`` (the definitions do not know them) and of damage are copied, the body segments
    those queues' messages are in are copied, and the segments in ``unneeded`` (no message
    known needs them) are moved, all into one new ``DIR/quarantine/<UTC time>/`` with
    ``index/`` and ``bodies/w<k>/`` as in the data directory. Synced before it returns: the
    caller may then record the queues as deleted and forget the segments."""
    out = SetAside()
    damaged = {d.path for d in state.damage if d.size}
    index_files = [p for p in state.files if p in damaged and not _kept_already(data_dir, p)]
    if gone:
        index_files += [p for p in _files_naming(state.files, gone) if p not in index_files]
    segments = sorted({(rec[3], rec[4]) for name in gone
                       for rec, _, _ in state.queues.get(name, {}).values()})
    if not (index_files or segments or unneeded):
        return out
    target = _quarantine_dir(data_dir)
    out.path = target
    made: list[Path] = []
    for path in index_files:
        made.append(_copy(path, target / INDEX_DIR / path.name))
    for worker, segment in segments:
        source = segment_path(data_dir, worker, segment)
        if source.exists():
            made.append(_copy(source, target / "bodies" / f"w{worker}" / source.name))
            out.copied_segments += 1
    for worker, segment in unneeded:
        source = segment_path(data_dir, worker, segment)
        into = target / "bodies" / f"w{worker}" / source.name
        into.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.replace(source, into)
            out.moved_segments += 1
    out.index_files = len(index_files)
    for path in made:
        _fsync(path, os.O_RDONLY)
    for directory in {target, *(p.parent for p in target.rglob("*") if p.is_file()),
                      *(segment_path(data_dir, w, s).parent for w, s in unneeded)}:
        _fsync(directory, os.O_RDONLY | os.O_DIRECTORY)
    return out


def _quarantine_dir(data_dir: str | os.PathLike[str]) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = Path(data_dir) / QUARANTINE_DIR
    target, n = base / stamp, 1
    while target.exists():
        n += 1
        target = base / f"{stamp}-{n}"
    target.mkdir(mode=0o700, parents=True)
    return target


def _kept_already(data_dir: str | os.PathLike[str], path: Path) -> bool:
    """Whether an earlier start set aside this index file as it is now (same name and size)."""
    size = path.stat().st_size
    return any(copy.stat().st_size == size
               for copy in (Path(data_dir) / QUARANTINE_DIR).glob(f"*/{INDEX_DIR}/{path.name}"))


def _files_naming(paths: list[Path], queues: set[str]) -> list[Path]:
    """The index files holding a record of one of ``queues`` (read again: a rare path)."""
    decode = msgspec.msgpack.Decoder().decode
    found = []
    for path in paths:
        data = path.read_bytes()
        for _, payload, _ in scan_index(data, not data.startswith(INDEX_MAGIC_V1)):
            try:
                rec = payload is not None and decode(payload)
            except msgspec.DecodeError:
                continue
            if rec and len(rec) > 1 and rec[1] in queues:
                found.append(path)
                break
    return found


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
