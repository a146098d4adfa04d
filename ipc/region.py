"""One shared-memory region per worker: control block, two rings, notify slots, arena.

Theory of operation
-------------------
The supervisor creates one POSIX shared-memory segment per worker
(``/dev/shm/shoal.<supervisor pid>-<hex>.w<k>``, mode 0600) and maps it; the
worker, and any replacement of it, attaches by name. Layout, each section
page-aligned::

    0          control block (4096 bytes, below)
    4096       request ring  worker -> supervisor   (ring_bytes)
    +ring      event ring    supervisor -> worker   (ring_bytes)
    +ring      notify slots  one byte per consumer slot of the worker
    +slots     body arena    bodies published through this worker

Control block::

    0    magic "SHOALIPC"        8    layout version u32
    16   ring_bytes u64          24   slot count u64       32  arena_bytes u64
    40   supervisor pid u64      48   worker pid u64
    64   supervisor_sleeping (own cache line)  -- request ring's consumer
    128  worker_sleeping     (own cache line)  -- event ring's consumer
    192  open connections i64 (own cache line) -- one aligned 8-byte store:
         >= 0           the worker accepts and holds this many connections (the
                        worker writes it);
         NOT_ACCEPTING  no worker takes connections for this region, and none
                        is worth waiting for (created, stopping, crash loop);
         < 0            starting: the supervisor started (or is about to
                        restart) this region's worker and expects it to accept
                        before CLOCK_MONOTONIC reads -value ns (the supervisor
                        writes it; :meth:`Region.mark_starting`)

The magic is written last on creation, so an attacher that sees it sees a
complete layout. The segment is sized with ftruncate and never zero-filled:
tmpfs pages cost memory only once touched.

A notify slot is one byte set to 1 by the supervisor ("this consumer has
work") and cleared by the worker when it takes it. Setting a slot that is
already set writes nothing: however many messages arrive, the consumer sees
one pending notification. :meth:`Region.take_set_slots` clears each slot
*before* reporting it, so a set that lands after the clear is seen next time
rather than lost.

Segments are unlinked at shutdown, with the arena's large-body segments
(``<region name>.b<offset>``, ipc.arena); :func:`sweep_stale` removes those
whose supervisor pid is gone, which the pid in the name makes possible without
opening them.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import struct
import time
from dataclasses import dataclass

import posix_ipc

from ipc import segment
from ipc.arena import Arena
from ipc.ring import Ring
from ipc.wakeup import SleepFlag

__all__ = [
    "CONTROL_BYTES",
    "NOT_ACCEPTING",
    "Layout",
    "Region",
    "RegionError",
    "new_instance_id",
    "region_name",
    "starting_deadline",
    "sweep_stale",
]

CONTROL_BYTES = 4096
PAGE = 4096
MAGIC = b"SHOALIPC"
VERSION = 1
SHM_DIR = "/dev/shm"

_LAYOUT = struct.Struct("<QQQ")  # ring_bytes, slot count, arena_bytes
_MAGIC_VERSION = struct.Struct("<8sI")
_U64 = struct.Struct("<Q")
_LAYOUT_OFFSET = 16
_SUPERVISOR_PID_OFFSET = 40
_WORKER_PID_OFFSET = 48
_SUPERVISOR_SLEEPING_OFFSET = 64
_WORKER_SLEEPING_OFFSET = 128
_CONNECTIONS_OFFSET = 192
NOT_ACCEPTING = (1 << 63) - 1  # a connection count below 0 is a starting mark


def starting_deadline(count: int) -> int | None:
    """For a ``Region.connections`` value: the CLOCK_MONOTONIC time (ns,
    ``time.monotonic_ns()``) by which a starting worker is expected to accept,
    or None if the value is not a starting mark."""
    return -count if count < 0 else None


_INSTANCE = re.compile(r"[0-9]+-[0-9a-f]+")


class RegionError(Exception):
    """A segment that is not a region of this layout version."""


def _page_align(n: int) -> int:
    return (n + PAGE - 1) & -PAGE


def new_instance_id() -> str:
    """``<this pid>-<random hex>``: unique per broker run, and tells a sweep
    which process owns the segments."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def region_name(instance: str, worker_index: int) -> str:
    """The segment name of worker ``worker_index``, e.g. ``/shoal.4242-9f3a01bc.w0``."""
    if not _INSTANCE.fullmatch(instance):
        raise ValueError(f"instance {instance!r} is not '<pid>-<hex>'")
    if worker_index < 0:
        raise ValueError(f"negative worker index {worker_index}")
    return f"/shoal.{instance}.w{worker_index}"


@dataclass(frozen=True)
class Layout:
    """Section sizes; every offset follows from them."""

    ring_bytes: int
    slot_count: int
    arena_bytes: int

    @classmethod
    def for_sizes(cls, ring_bytes: int, slots: int, arena_bytes: int) -> Layout:
        if ring_bytes < PAGE or slots < 0 or arena_bytes < PAGE:
            raise ValueError(f"bad region sizes {ring_bytes=} {slots=} {arena_bytes=}")
        return cls(_page_align(ring_bytes), slots, _page_align(arena_bytes))

    @property
    def request_ring(self) -> slice:
        return slice(CONTROL_BYTES, CONTROL_BYTES + self.ring_bytes)

    @property
    def event_ring(self) -> slice:
        start = CONTROL_BYTES + self.ring_bytes
        return slice(start, start + self.ring_bytes)

    @property
    def slots(self) -> slice:
        start = CONTROL_BYTES + 2 * self.ring_bytes
        return slice(start, start + self.slot_count)

    @property
    def arena(self) -> slice:
        start = CONTROL_BYTES + 2 * self.ring_bytes + _page_align(self.slot_count)
        return slice(start, start + self.arena_bytes)

    @property
    def total(self) -> int:
        stop: int = self.arena.stop
        return stop


class Region:
    """A mapped region. Use :meth:`create` (supervisor) or :meth:`attach` (worker)."""

    def __init__(self, name: str, shm_map: mmap.mmap, layout: Layout, *, init: bool) -> None:
        self.name = name
        self.layout = layout
        self._map = shm_map
        self._view = memoryview(shm_map)
        self.control = self._view[:CONTROL_BYTES]
        self.supervisor_sleeping = SleepFlag(self.control, _SUPERVISOR_SLEEPING_OFFSET)
        self.worker_sleeping = SleepFlag(self.control, _WORKER_SLEEPING_OFFSET)
        # One aligned 8-byte store or load (struct.pack_into memsets first, so a
        # reader in another process could see a transient 0).
        self._connections = self.control[_CONNECTIONS_OFFSET : _CONNECTIONS_OFFSET + 8].cast("q")
        self._request_view = self._view[layout.request_ring]
        self._event_view = self._view[layout.event_ring]
        self._arena_view = self._view[layout.arena]
        self.slots = self._view[layout.slots]
        self.request_ring = Ring(self._request_view, init=init)
        self.event_ring = Ring(self._event_view, init=init)
        self.arena = Arena(self._arena_view, init=init, name=name)
        self._closed = False

    # ---------------------------------------------------------- lifecycle

    @classmethod
    def create(
        cls,
        name: str,
        *,
        ring_bytes: int = 4 << 20,
        slots: int = 8192,
        arena_bytes: int = 256 << 20,
    ) -> Region:
        """Create and initialise a new segment; fails if ``name`` exists."""
        layout = Layout.for_sizes(ring_bytes, slots, arena_bytes)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=layout.total)
        try:
            shm_map = _map(shm, layout.total)
            region = cls(name, shm_map, layout, init=True)
        except BaseException:
            shm.unlink()
            raise
        region._write_control()
        return region

    @classmethod
    def attach(cls, name: str) -> Region:
        """Map an existing region, reading its layout from the control block."""
        shm = posix_ipc.SharedMemory(name)
        size = shm.size
        if size < CONTROL_BYTES:
            shm.close_fd()
            raise RegionError(f"{name}: {size} bytes is too small for a region")
        shm_map = _map(shm, size)
        try:
            layout = _read_layout(name, shm_map)
        except BaseException:
            shm_map.close()
            raise
        return cls(name, shm_map, layout, init=False)

    def _write_control(self) -> None:
        lay = self.layout
        _LAYOUT.pack_into(
            self.control, _LAYOUT_OFFSET, lay.ring_bytes, lay.slot_count, lay.arena_bytes
        )
        _U64.pack_into(self.control, _SUPERVISOR_PID_OFFSET, os.getpid())
        _U64.pack_into(self.control, _WORKER_PID_OFFSET, 0)
        self.supervisor_sleeping.clear()
        self.worker_sleeping.clear()
        self.connections = NOT_ACCEPTING
        _MAGIC_VERSION.pack_into(self.control, 0, MAGIC, VERSION)

    def forget_arena_pages(self) -> None:
        """Drop this process's page-table entries for the arena (``MADV_DONTNEED`` on a
        shared mapping). The pages stay in the segment, content and all, for every process
        that maps it; the next touch here maps the page again. A process that only frees
        blocks in another's arena (the supervisor) otherwise keeps every page it ever wrote
        a state byte into resident in its own RSS."""
        if not self._closed:
            span = self.layout.arena
            self._map.madvise(mmap.MADV_DONTNEED, span.start, span.stop - span.start)

    def release_arena_pages(self, offset: int, length: int) -> None:
        """Punch whole pages of the arena (``offset`` from its start, both page multiples) out
        of the segment (``MADV_REMOVE``): their memory goes back to the system for every
        process, and they read as zeros after. Only for what no process reads: the inside of
        a FREE run (ipc.arena.Arena.trim)."""
        start = self.layout.arena.start + offset
        self._map.madvise(mmap.MADV_REMOVE, start, length)

    def close(self) -> None:
        """Unmap (idempotent). A body view still held elsewhere defers the
        unmapping until it is released; rings and arena are unusable at once."""
        if self._closed:
            return
        self._closed = True
        self.request_ring.release()
        self.event_ring.release()
        self.arena.release()
        self._connections.release()
        for view in (
            self.slots,
            self._arena_view,
            self._event_view,
            self._request_view,
            self.control,
            self._view,
        ):
            view.release()
        with contextlib.suppress(BufferError):  # an Arena.view() is still alive somewhere
            self._map.close()

    def unlink(self) -> None:
        """Remove the name and its arena's large-body segments (idempotent; at
        shutdown, once no worker allocates); mappings stay valid until closed."""
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(self.name)
        segment.unlink_prefixed(self.name + ".b")

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Region({self.name!r}, {self.layout})"

    # ------------------------------------------------------------ control

    @property
    def supervisor_pid(self) -> int:
        pid: int = _U64.unpack_from(self.control, _SUPERVISOR_PID_OFFSET)[0]
        return pid

    @property
    def worker_pid(self) -> int:
        """The pid of the worker attached now (0 before the first attaches)."""
        pid: int = _U64.unpack_from(self.control, _WORKER_PID_OFFSET)[0]
        return pid

    @worker_pid.setter
    def worker_pid(self, pid: int) -> None:
        _U64.pack_into(self.control, _WORKER_PID_OFFSET, pid)

    @property
    def connections(self) -> int:
        """Client connections the worker holds open now; NOT_ACCEPTING (set at
        creation, by a stopping worker, and by the supervisor for a worker it
        will not wait for); or a starting mark (negative, see
        :func:`starting_deadline`). Workers read each other's to balance
        accept() on the shared listening socket (workers.balance)."""
        count: int = self._connections[0]
        return count

    @connections.setter
    def connections(self, count: int) -> None:
        self._connections[0] = count

    def mark_starting(self, grace: float) -> None:
        """Supervisor: this region's worker is starting; its peers may leave new
        connections to it for ``grace`` seconds from now. Its own first count
        replaces the mark. A grace of 0 or less writes NOT_ACCEPTING."""
        if grace <= 0:
            self.connections = NOT_ACCEPTING
            return
        self.connections = -(time.monotonic_ns() + max(1, int(grace * 1e9)))

    # ------------------------------------------------------- notify slots

    def set_slot(self, i: int) -> bool:
        """Supervisor: mark consumer slot ``i`` as having work. Returns False,
        having written nothing, if it was already set (coalesced)."""
        slots = self.slots
        if not 0 <= i < len(slots):
            raise IndexError(f"notify slot {i} outside 0..{len(slots) - 1}")
        if slots[i]:
            return False
        slots[i] = 1
        return True

    def take_set_slots(self) -> list[int]:
        """Worker: the set slots in index order, each cleared before it is returned."""
        slots = self.slots
        base = self.layout.slots.start
        stop = base + len(slots)
        taken: list[int] = []
        at = self._map.find(b"\x01", base, stop)  # a C scan, no copy
        while at >= 0:
            slots[at - base] = 0
            taken.append(at - base)
            at = self._map.find(b"\x01", at + 1, stop)
        return taken

    def any_slot_set(self) -> bool:
        start = self.layout.slots.start
        return self._map.find(b"\x01", start, start + len(self.slots)) >= 0

    def clear_slots(self) -> None:
        """Drop every pending notification (a replaced worker starts afresh)."""
        self.slots[:] = bytes(len(self.slots))


def _map(shm: posix_ipc.SharedMemory, size: int) -> mmap.mmap:
    """Map the whole segment and close its fd (the mapping keeps it alive)."""
    try:
        return mmap.mmap(shm.fd, size)
    finally:
        shm.close_fd()


def _read_layout(name: str, shm_map: mmap.mmap) -> Layout:
    magic, version = _MAGIC_VERSION.unpack_from(shm_map, 0)
    if magic != MAGIC or version != VERSION:
        raise RegionError(f"{name}: magic {magic!r} version {version}, want {MAGIC!r} {VERSION}")
    layout = Layout(*_LAYOUT.unpack_from(shm_map, _LAYOUT_OFFSET))
    if layout.total > len(shm_map):
        raise RegionError(f"{name}: layout needs {layout.total} bytes, segment has {len(shm_map)}")
    return layout


# ------------------------------------------------------------------ sweeping


def _owner_pid(entry: str, prefix: str) -> int | None:
    """The supervisor pid in a /dev/shm entry named ``<prefix><pid>-<hex>.w<k>``, or
    ``….w<k>.b<offset>`` (a large body's segment, ipc.arena)."""
    match = re.fullmatch(re.escape(prefix) + r"([0-9]+)-[0-9a-f]+\.w[0-9]+(?:\.b[0-9]+)?", entry)
    return int(match.group(1)) if match else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def sweep_stale(prefix: str = "shoal.", *, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the segments of broker instances whose supervisor is dead; return
    their names. A live instance's segments are never touched (a reused pid
    only makes a dead instance's segments wait for a later sweep)."""
    removed: list[str] = []
    for entry in sorted(os.listdir(shm_dir)):
        pid = _owner_pid(entry, prefix)
        if pid is None or pid <= 0 or _pid_alive(pid):
            continue
        try:
            posix_ipc.unlink_shared_memory("/" + entry)
        except posix_ipc.ExistentialError:  # another sweeper got there first
            continue
        removed.append("/" + entry)
    return removed
