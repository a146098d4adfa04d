"""The C allocator in a worker process: freed heap memory kept for the next read.

A worker reads a busy client's socket up to a megabyte at a time (``workers.socket_reader._next_ask``),
and each read is a fresh ``bytes`` object, freed once its frames are parsed and its bodies
copied to their arena blocks. glibc hands a freed chunk at the top of the heap back to the
kernel when more than ``M_TRIM_THRESHOLD`` is free there (``brk``), so the next read's buffer
is fresh memory again, every page of it faulted in while the kernel copies the data (about a
page fault a message with 256 KiB bodies; perf/README.md has the figures). :func:`settle`
raises the trim threshold to ``TRIM_THRESHOLD`` and fixes the size from which allocations get
their own mapping at ``MMAP_THRESHOLD`` (above the largest read). A worker then keeps up to
16 MiB of freed heap for reuse.

Only where the C library is glibc (``mallopt`` found); ``SHOAL_MALLOC_DEFAULT=1`` leaves it as
glibc sets it (to measure against).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

TRIM_THRESHOLD = 16 << 20
MMAP_THRESHOLD = 4 << 20  # more than the largest read (1 MiB)
ENV = "SHOAL_MALLOC_DEFAULT"


def settle() -> bool:
    """Set the thresholds; True when the C library took them."""
    if os.environ.get(ENV):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
