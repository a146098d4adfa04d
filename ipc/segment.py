"""One POSIX shared-memory segment per large body (see ipc.arena, "Large bodies").

A body too big to sit comfortably in its worker's arena gets a segment of its
own, named after the arena block that stands for it
(``/shoal.<instance>.w<k>.b<offset>``). The publishing worker creates it and
reserves its pages up front (``posix_fallocate``: a full /dev/shm is an error
here, never a SIGBUS when the body is written); whoever reads it maps it for
as long as its view lives; whoever frees the block unlinks it, and tmpfs gives
the pages back once the last mapping or descriptor goes. Giving back 128 MiB of
pages takes the kernel about 12 ms, so :func:`unlink` keeps a descriptor and
closes it on a helper thread: the freeing process (the supervisor, usually)
spends microseconds on its event loop. Nothing here knows about AMQP.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading

import posix_ipc

__all__ = ["NoSpace", "create", "open_view", "unlink", "unlink_prefixed"]

SHM_DIR = "/dev/shm"


class NoSpace(Exception):
    """/dev/shm cannot hold the segment now."""


def create(name: str, size: int) -> None:
    """Create segment ``name`` (mode 0600) with ``size`` bytes reserved. A segment
    left under that name is stale (its block was ours to give), so it is replaced.
    Raises NoSpace when /dev/shm cannot hold it."""
    try:
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
    except posix_ipc.ExistentialError:
        unlink(name)
        shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
    try:
        if size:
            os.posix_fallocate(shm.fd, 0, size)
    except OSError as exc:
        shm.unlink()
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise NoSpace(f"{name}: /dev/shm has no room for {size} bytes") from exc
        raise
    finally:
        shm.close_fd()


def open_view(name: str, size: int) -> memoryview:
    """A writable view of the first ``size`` bytes of segment ``name``. The mapping
    lives as long as the view (and its slices): drop or release them when done."""
    shm = posix_ipc.SharedMemory(name)
    try:
        mapped = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    finally:
        shm.close_fd()
    return memoryview(mapped)


def unlink(name: str) -> None:
    """Remove the name (idempotent) at once; its pages go with the last mapping, or
    with the descriptor kept here, which a helper thread closes."""
    try:
        shm = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError:
        return
    with contextlib.suppress(posix_ipc.ExistentialError):
        shm.unlink()
    _closer().put(shm.fd)


_closing: queue.SimpleQueue[int] | None = None
_closing_lock = threading.Lock()


def _closer() -> queue.SimpleQueue[int]:
    """The queue of descriptors the helper thread closes (started on first use)."""
    global _closing
    with _closing_lock:
        if _closing is None:
            _closing = queue.SimpleQueue()
            threading.Thread(target=_close_forever, args=(_closing,), name="shm-closer",
                             daemon=True).start()
        return _closing


def _close_forever(fds: queue.SimpleQueue[int]) -> None:
    while True:
        os.close(fds.get())  # the kernel frees the pages here, off the caller's loop


def unlink_prefixed(prefix: str, *, shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (``/shoal.…``); return them."""
    start = prefix.lstrip("/")
    removed = []
    for entry in sorted(os.listdir(shm_dir)):
        if entry.startswith(start):
            unlink("/" + entry)
            removed.append("/" + entry)
    return removed
