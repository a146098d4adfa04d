"""Append-only files of checksummed records: persistent bodies and the supervisor's queue index.

Both halves of a persistent message's storage use checksummed frames (``shoal serve --data-dir
DIR``)::

    file          MAGIC (8 bytes: the file's kind and version), then frames
    body frame    u32 payload length, u32 CRC-32 of the payload, payload
    index frame   SYNC (4 bytes), u32 payload length, u32 CRC-32 of the payload, payload

A body is found by where its index record says it is, so a body frame needs no more. Index
frames are read one after the other, and one damaged frame must not hide the ones after it:
:func:`scan_index` skips bytes that are not a whole, intact frame up to the next SYNC that
begins one (``SHOALI2``); files of the previous version (``SHOALI1``, no SYNC) are read too,
resynchronising by trying every offset. What was skipped comes back as a gap; whether a gap
at a file's end is a torn tail (a crash mid-append: never confirmed, since a confirm waits
for the sync that covers its frames) or damage is the reader's call (``broker.storage.message_store``).
Nothing here raises on damaged input.

Bodies (:class:`BodyLog`, :class:`BodyReader`): each worker appends the header and body of every
persistent message it receives to ``DIR/bodies/w<k>/<segment>.seg``, from its arena, before the
``Publish`` record goes to the supervisor (queued as it is published, written in one batch per
scheduling round); a body's location is ``(worker, segment, offset, length)`` of its frame. A
segment is closed at ``segment_bytes`` and the next one begun; a failed write begins a new one
too, and a replacement worker begins a new one, never appending after a possibly torn tail. The supervisor
removes a segment once no queued message needs it, and reads bodies back only at start.

Syncing happens off the event loop: :meth:`BodyLog.sync_plan` (event loop) says which files to
``fdatasync`` and up to which append, :func:`sync_files` (any thread) does it, and
:meth:`BodyLog.synced_to` (event loop) records the result and closes retired files.

Group commit, paced under load: a sync begins as soon as the previous one is done; but after a
sync that covered ``BUSY_SYNC`` appends (index records, for the supervisor's index) or more,
while the host's CPUs are at least half busy (:class:`CpuSaturation`), the next one waits
``SYNC_GAP`` (:func:`sync_pause`). Each sync then covers more, and a pipeline's syncs cost
fewer system calls and thread hand-offs per message: an ``fdatasync`` handed to a thread costs
~150 µs of CPU on this project's 2-core host, and P1 (``perf.durable``) ran ~1,000 index syncs a
second before, ~290 after. A disk whose sync takes SYNC_GAP or more batches as much by itself
and never waits; a host with CPUs to spare never waits either, as the wait would only hold
confirms back (a publisher with a window of unconfirmed messages and no consumer, P2: 76k
confirmed msg/s in one check without the wait, 63-73k in six with it). RabbitMQ's queues sync
when idle, or every 25 ms while busy.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

BODY_MAGIC = b"SHOALB1\n"
INDEX_MAGIC = b"SHOALI2\n"  # index frames begin with SYNC
INDEX_MAGIC_V1 = b"SHOALI1\n"  # the previous index format: frames without SYNC, still read
# 0xc1 is the one byte msgpack never uses, so SYNC rarely appears inside a record.
SYNC = b"\xc1SQ\xc1"
FRAME = struct.Struct("<II")  # payload length, CRC-32 of the payload
_BODY = struct.Struct("<II")  # a body frame's payload starts with header_len, body_len
BODY_OVERHEAD = FRAME.size + _BODY.size  # a body frame's bytes besides header and body
_BODY_FRAME = struct.Struct("<IIII")  # FRAME then _BODY: what FrameSizes reads of a body frame
SEGMENT_BYTES = 64 << 20
IOV_MAX = 1024  # the most buffers one writev takes (Linux)
BUSY_SYNC = 32  # a sync that covered this many appends (or index records) or more ...
SYNC_GAP = 0.002  # ... is followed by this many seconds without one (module docstring)
SATURATED_IDLE = 0.5  # the host's CPUs count as busy below this idle fraction ...
SATURATION_LOOK = 0.05  # ... measured over this many seconds (at most one /proc/stat read each)


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def iter_frames(data: bytes | memoryview, start: int = len(BODY_MAGIC)) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` of each whole, intact frame from ``start``; stops at a torn tail."""
    view = memoryview(data)
    pos = start
    end = len(view)
    while pos + FRAME.size <= end:
        length, crc = FRAME.unpack_from(view, pos)
        payload_end = pos + FRAME.size + length
        if payload_end > end:
            return
        payload = bytes(view[pos + FRAME.size:payload_end])
        if zlib.crc32(payload) != crc:
            return
        yield pos, payload
        pos = payload_end


def index_frame(payload: bytes) -> bytes:
    return SYNC + FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _frame_at(view: memoryview, pos: int, end: int) -> bytes | None:
    """The payload of an intact, non-empty frame header at ``pos``, or None (an index record is
    never empty: zeroed bytes are not a run of empty frames)."""
    if pos + FRAME.size > end:
        return None
    length, crc = FRAME.unpack_from(view, pos)
    if length == 0 or pos + FRAME.size + length > end:
        return None
    payload = bytes(view[pos + FRAME.size:pos + FRAME.size + length])
    return payload if zlib.crc32(payload) == crc else None


def scan_index(data: bytes, synced: bool = True) -> Iterator[tuple[int, memoryview | None, int]]:
    """Every intact frame of an index file's bytes after its magic, as ``(offset, payload,
    end)``, and every run of bytes skipped between them (and after the last) as ``(offset,
    None, end)``. ``synced``: frames begin with SYNC (INDEX_MAGIC); otherwise INDEX_MAGIC_V1's.
    A payload is a view of ``data`` (not copied).

    A restart reads every record through here (a million queued messages: a million frames),
    so an intact frame is checked inline, as :func:`_frame_at` would."""
    view = memoryview(data)
    end = len(data)
    head = (len(SYNC) if synced else 0) + FRAME.size
    unpack, crc32, startswith = FRAME.unpack_from, zlib.crc32, data.startswith
    pos = len(INDEX_MAGIC)
    while pos < end:
        at = pos + head
        if at <= end and (not synced or startswith(SYNC, pos)):
            length, crc = unpack(data, at - FRAME.size)
            after = at + length
            if length and after <= end:
                payload = view[at:after]
                if crc32(payload) == crc:
                    yield pos, payload, after
                    pos = after
                    continue
        resume = _resync(data, view, pos + 1, synced)
        yield pos, None, resume
        pos = resume


def _resync(data: bytes, view: memoryview, pos: int, synced: bool) -> int:
    """Where the next intact frame begins at or after ``pos`` (the end if none does)."""
    end = len(data)
    if not synced:  # no SYNC to look for: each offset in turn
        while pos < end and _frame_at(view, pos, end) is None:
            pos += 1
        return min(pos, end)
    while True:
        pos = data.find(SYNC, pos)
        if pos < 0:
            return end
        if _frame_at(view, pos + len(SYNC), end) is not None:
            return pos
        pos += 1


def write_all(fd: int, parts: list[bytes | memoryview]) -> int:
    """``os.writev`` until every byte is written; returns how many."""
    total = sum(len(p) for p in parts)
    written = os.writev(fd, parts)
    if written < total:  # a partial write (a big body): write the rest
        rest = memoryview(b"".join(parts))
        while written < total:
            written += os.write(fd, rest[written:])
    return total


def sync_files(fds: list[int]) -> None:
    """fdatasync each file, or directory (a new file's name). Runs in a thread: touches
    nothing shared."""
    for fd in fds:
        os.fdatasync(fd)


def body_dir(data_dir: str | os.PathLike[str], worker: int) -> Path:
    return Path(data_dir) / "bodies" / f"w{worker}"


def segment_path(data_dir: str | os.PathLike[str], worker: int, segment: int) -> Path:
    return body_dir(data_dir, worker) / f"{segment:010d}.seg"


def segments(data_dir: str | os.PathLike[str], worker: int) -> list[int]:
    """The segment numbers on disk for ``worker``, ascending."""
    try:
        names = os.listdir(body_dir(data_dir, worker))
    except FileNotFoundError:
        return []
    return sorted(int(n[:-4]) for n in names if n.endswith(".seg") and n[:-4].isdigit())


def sync_pause(covered: int, took: float, busy: Callable[[], bool]) -> float:
    """Seconds to wait before the next sync, after one that covered ``covered`` appends (or
    index records) in ``took`` seconds (module docstring)."""
    if covered < BUSY_SYNC or took >= SYNC_GAP or not busy():
        return 0.0
    return SYNC_GAP


class CpuSaturation:
    """Whether the host's CPUs were busy -- idle (iowait counted as idle) below SATURATED_IDLE
    of their time -- over the last SATURATION_LOOK seconds, from ``/proc/stat`` (read at most
    once per look). Where it cannot be read, always True."""

    def __init__(self, path: str = "/proc/stat", clock: Callable[[], float] = time.monotonic) -> None:
        self._path = path
        self._clock = clock
        self._looked = -SATURATION_LOOK
        self._last: tuple[int, int] | None = None
        self._busy = True

    def _read(self) -> tuple[int, int] | None:
        """(total, idle) jiffies of all CPUs so far."""
        try:
            with open(self._path, "rb") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 5 or fields[0] != b"cpu":
            return None
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
        return sum(ticks), ticks[3] + ticks[4]

    def __call__(self) -> bool:
        now = self._clock()
        if now - self._looked < SATURATION_LOOK:
            return self._busy
        self._looked = now
        seen = self._read()
        if seen is None:
            self._busy = True
            return True
        last, self._last = self._last, seen
        if last is not None and seen[0] > last[0]:
            self._busy = seen[1] - last[1] < SATURATED_IDLE * (seen[0] - last[0])
        return self._busy


class AppendFiles:
    """A directory of append-only files, the newest open for writing, and what a sync must cover:
    files closed for writing since the last sync (then closed), the newest, and the directory
    when a file was made in it. ``written`` / ``synced``: positions (appends, journal marks)
    the owner counts; a sync of ``sync_plan``'s files makes ``written`` as of then durable."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self._dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._fd = -1
        self._retired: list[int] = []  # closed for writing, not yet synced
        self._dir_dirty = False  # a file was made (or removed) since the last sync
        self.written = 0
        self.synced = 0

    def _begin(self, path: Path, magic: bytes) -> int:
        """Begin ``path`` and retire the file being written, if any; returns its size so far.
        (Opened first: a failed open leaves the file being written as it was.)"""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._dir_dirty = True
        if self._fd >= 0:
            self._retired.append(self._fd)
        self._fd = fd
        return write_all(fd, [magic])

    @property
    def unsynced(self) -> bool:
        """Something written is not on disk yet (a new file's name goes with its first sync)."""
        return self.synced < self.written

    def sync_plan(self) -> tuple[int, list[int]]:
        """``(position covered, files to sync)`` for :func:`sync_files` in a thread."""
        fds = [*self._retired, self._fd]
        if self._dir_dirty:
            fds.append(self._dir_fd)
            self._dir_dirty = False
        return self.written, fds

    def synced_to(self, position: int, fds: list[int]) -> None:
        """A sync of ``sync_plan``'s files is done: everything up to ``position`` is on disk."""
        self.synced = max(self.synced, position)
        for fd in fds:
            if fd in self._retired:
                self._retired.remove(fd)
                os.close(fd)

    def close(self) -> None:
        for fd in [*self._retired, self._fd, self._dir_fd]:
            if fd >= 0:
                os.close(fd)
        self._retired = []
        self._fd = self._dir_fd = -1


class BodyLog(AppendFiles):
    """One worker's persistent bodies: appends on the event loop, written in batches, synced in
    a thread.

    :meth:`append` does no IO: it frames a body, says where it goes, and queues the frame's
    parts (the header and body may be views of the worker's arena, which stay valid until the
    ``Publish`` record naming them has gone to the supervisor). :meth:`write_pending` writes
    what is queued, one ``writev`` per IOV_MAX parts: the worker calls it before it puts
    records on its request ring (``Worker.flush_requests``) and before a sync; ``sync_plan``
    and ``close`` call it too. A segment is closed at ``segment_bytes`` (at a frame boundary)
    and the next one is begun when its first frame is written."""

    def __init__(self, data_dir: str | os.PathLike[str], worker: int, *,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        super().__init__(body_dir(data_dir, worker))
        self.data_dir = Path(data_dir)
        self.worker = worker
        self.segment_bytes = segment_bytes
        existing = segments(data_dir, worker)
        self.segment = existing[-1] + 1 if existing else 0  # where appends go now
        self._file_segment = self.segment  # the segment of the file open for writing
        self._offset = self._begin(segment_path(data_dir, worker, self.segment), BODY_MAGIC)
        self.pending: list[bytes | memoryview] = []  # parts queued for self.segment, in order
        self._pending_bytes = 0
        # (segment, parts, bytes) queued for earlier segments (a rollover since the last write)
        self._sealed: list[tuple[int, list[bytes | memoryview], int]] = []

    @property
    def appended(self) -> int:
        """Appends so far (written or queued): the position a sync reaches."""
        return self.written

    def append(self, header: bytes | memoryview, body: bytes | memoryview) -> tuple[int, int, int]:
        """Queue one body; returns ``(segment, offset, length)``. Written by the next
        :meth:`write_pending`, not on disk until synced."""
        header_len = len(header)
        body_len = len(body)
        length = BODY_OVERHEAD + header_len + body_len
        offset = self._offset
        if offset >= self.segment_bytes:  # the segment is full: the next one, at a frame boundary
            self._roll()
            offset = self._offset
        crc = zlib.crc32(body, zlib.crc32(header, zlib.crc32(_BODY.pack(header_len, body_len))))
        self.pending += (_BODY_FRAME.pack(length - FRAME.size, crc, header_len, body_len),
                         header, body)
        self._pending_bytes += length
        self._offset = offset + length
        self.written += 1
        return (self.segment, offset, length)

    def _roll(self) -> None:
        if self.pending:
            self._sealed.append((self.segment, self.pending, self._pending_bytes))
            self.pending = []
            self._pending_bytes = 0
        self.segment += 1
        self._offset = len(BODY_MAGIC)

    def write_pending(self) -> None:
        """Write every queued frame, in order. On a failure (ENOSPC, say) the queue is dropped
        and OSError raised: part of it may be in the file, so nothing more goes after it --
        later appends begin a new segment and every offset stays true. The caller treats
        every body queued since the last write as lost (none may be confirmed)."""
        if not self.pending:
            return
        try:
            if self._sealed:
                for segment, parts, size in self._sealed:
                    self._write(segment, parts, size)
            self._write(self.segment, self.pending, self._pending_bytes)
        except OSError:
            self._sealed, self.pending, self._pending_bytes = [], [], 0
            self._roll()
            raise
        if self._sealed:
            self._sealed = []
        self.pending = []
        self._pending_bytes = 0

    def _write(self, segment: int, parts: list[bytes | memoryview], size: int) -> None:
        if segment != self._file_segment:
            self._file_segment = segment
            self._begin(segment_path(self.data_dir, self.worker, segment), BODY_MAGIC)
        fd = self._fd
        if len(parts) > IOV_MAX:
            for start in range(0, len(parts), IOV_MAX):
                write_all(fd, parts[start:start + IOV_MAX])
            return
        written = os.writev(fd, parts)
        if written < size:  # a partial write (a big body): write the rest
            rest = memoryview(b"".join(parts))
            while written < size:
                written += os.write(fd, rest[written:])

    def sync_plan(self) -> tuple[int, list[int]]:
        """What is queued is written first (OSError as :meth:`write_pending`)."""
        self.write_pending()
        return super().sync_plan()

    def close(self) -> None:
        """Write what is queued (best effort) and close every file."""
        with contextlib.suppress(OSError):
            self.write_pending()
        super().close()


class BodyReader:
    """Reads bodies back at start (the supervisor), one open file per segment."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self._fds: dict[tuple[int, int], int] = {}

    def read(self, worker: int, segment: int, offset: int, length: int) -> tuple[bytes, bytes] | None:
        """``(header, body)`` of the frame there, or None if it is missing, short or damaged."""
        key = (worker, segment)
        fd = self._fds.get(key)
        if fd is None:
            try:
                fd = os.open(segment_path(self.data_dir, worker, segment), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            self._fds[key] = fd
        data = os.pread(fd, length, offset)
        if len(data) != length or length < FRAME.size + _BODY.size:
            return None
        size, crc = FRAME.unpack_from(data)
        if size != length - FRAME.size or zlib.crc32(memoryview(data)[FRAME.size:]) != crc:
            return None
        header_len, body_len = _BODY.unpack_from(data, FRAME.size)
        start = FRAME.size + _BODY.size
        if start + header_len + body_len != length:
            return None
        return data[start:start + header_len], data[start + header_len:]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class FrameSizes:
    """Checks that body frames are whole without reading them (a restart that leaves bodies on
    disk, ``broker.storage.paging``): each segment is mapped once, and a frame's length fields are read
    from the mapping. The CRC is checked when the body is read, on delivery."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = Path(data_dir)
        self._maps: dict[tuple[int, int], mmap.mmap | None] = {}
        # The segment asked about last: a restart asks about each segment's frames in a row.
        self._last: tuple[int, int, mmap.mmap | None] = (-1, -1, None)

    def sizes(self, worker: int, segment: int, offset: int, length: int) -> tuple[int, int] | None:
        """``(header_len, body_len)`` of the frame there, or None if it is missing or cut short."""
        last_worker, last_segment, data = self._last
        if worker != last_worker or segment != last_segment:
            key = (worker, segment)
            maps = self._maps
            data = maps.get(key)
            if data is None and key not in maps:
                data = maps[key] = _map(segment_path(self.data_dir, worker, segment))
            self._last = (worker, segment, data)
        if data is None or offset + length > len(data) or length < BODY_OVERHEAD:
            return None
        size, _, header_len, body_len = _BODY_FRAME.unpack_from(data, offset)
        if size != length - FRAME.size or header_len + body_len + BODY_OVERHEAD != length:
            return None
        return header_len, body_len

    def close(self) -> None:
        for data in self._maps.values():
            if data is not None:
                data.close()
        self._maps.clear()
        self._last = (-1, -1, None)


def _map(path: Path) -> mmap.mmap | None:
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (FileNotFoundError, ValueError):  # missing, or empty (ValueError)
        return None


def remove_segment(data_dir: str | os.PathLike[str], worker: int, segment: int) -> None:
    try:
        os.unlink(segment_path(data_dir, worker, segment))
    except FileNotFoundError:
        pass
