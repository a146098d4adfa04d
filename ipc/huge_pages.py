"""A broker process's Python heap on transparent huge pages.

Why: where page walks are dear -- a virtual machine, above all one with nested paging -- a
process that wakes after a sleep pays for each page of its heap it touches again, and a broker
at a light load wakes three processes a message. Measured on this project's 2-core VM
(docs/performance.md, "Huge pages"): 1,500 scattered pages touched after a 10 ms sleep cost
2.6 ms of CPU on 4 KiB pages and 0.38 ms on 2 MiB ones. With the heap on 2 MiB pages the
broker spent 5.5 % less CPU a message at 1,000 msg/s (an A/B run of six rounds), unpaced
throughput and memory level.

How, in two parts, both needing only the kernel's THP mode ``madvise`` or ``always``:

- **pymalloc's arenas** (Python's objects up to 512 bytes, most of the heap): CPython takes
  each 1 MiB arena with an mmap of its own, which the kernel cannot back with a 2 MiB page.
  :func:`install` hands CPython an arena allocator (``PyObject_SetArenaAllocator``) written in
  C (``ipc/huge_arenas.c``, built by ``make`` into ``build/libhuge_arenas.so`` and loaded with
  ctypes) that carves the arenas from one 2 MiB-aligned region advised ``MADV_HUGEPAGE``. It is
  installed first thing in a broker process, before its imports, so the modules' objects (the
  code every wake-up runs) live there too. Where the library is not built (no C compiler) the
  process runs as before and the supervisor's log says why.
- **the C library's heap** (larger objects, buffers): glibc's ``glibc.malloc.hugetlb=1``
  tunable, read when a process starts, so ``shoal serve`` starts itself again with it
  (:func:`start_again_with_tunable`: ``os.execve``, the same PID and arguments); the workers
  and the other children inherit it.

``SHOAL_SMALL_PAGES=1`` leaves both out (to measure against).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from pathlib import Path

LIBRARY = Path(__file__).resolve().parent.parent / "build" / "libhuge_arenas.so"
RESERVE = 4 << 30  # address space for arenas: PROT_NONE until used, so it costs nothing
ENV = "SHOAL_SMALL_PAGES"
TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"

_status = "not installed"  # what install() did: "on", or "off (why)"
_library: ctypes.CDLL | None = None  # loaded for good once installed: CPython calls into it


class _ArenaAllocator(ctypes.Structure):
    """CPython's PyObjectArenaAllocator: ctx, alloc(ctx, size), free(ctx, ptr, size)."""

    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                ("free", ctypes.c_void_p)]


def install(reserve: int = RESERVE, library: Path = LIBRARY) -> str:
    """Put this process's new pymalloc arenas on huge pages; say how it went (``"on"``, or why
    not). Once per process: a second call says what the first did."""
    global _library
    if _status != "not installed":
        return _status
    if os.environ.get(ENV):
        return _said(f"off ({ENV} is set)")
    try:
        lib = ctypes.CDLL(str(library))
    except OSError:
        return _said(f"off ({library.name} is not built: `make` builds it with a C compiler)")
    lib.huge_arenas_reserve.argtypes = (ctypes.c_size_t,)
    lib.huge_arenas_reserve.restype = ctypes.c_int
    for name in ("huge_arenas_used", "huge_arenas_free_count"):
        getattr(lib, name).restype = ctypes.c_size_t
    code = lib.huge_arenas_reserve(reserve)
    if code != 0:
        return _said("off (the kernel has no transparent huge pages)" if code == -2
                     else f"off (no {reserve >> 20} MiB of address space)")
    allocator = _ArenaAllocator(
        None, ctypes.cast(lib.huge_arenas_alloc, ctypes.c_void_p).value,
        ctypes.cast(lib.huge_arenas_free, ctypes.c_void_p).value)
    ctypes.pythonapi.PyObject_SetArenaAllocator(ctypes.byref(allocator))  # CPython copies it
    _library = lib
    return _said("on")


def _said(what: str) -> str:
    global _status
    _status = what
    return what


def arenas_used() -> int:
    """Bytes of arenas handed out from the huge-page region so far (0 when not installed)."""
    return int(_library.huge_arenas_used()) if _library is not None else 0


def tunable_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """``environ`` with glibc's huge-page tunable added, or None when it has it (or is off)."""
    if environ.get(ENV):
        return None
    tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    if TUNABLE in tunables:
        return None
    tunables = [t for t in tunables if not t.startswith("glibc.malloc.hugetlb=")] + [TUNABLE]
    return {**environ, "GLIBC_TUNABLES": ":".join(tunables)}


def start_again_with_tunable() -> None:
    """Replace this process with itself under :func:`tunable_env`, unless it already is."""
    env = tunable_env(os.environ)
    if env is not None and sys.executable:
        try:
            os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
        except OSError:  # this process goes on as it is: glibc's heap on small pages
            return


def thp_setting(path: str = THP_SETTING) -> str:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or ``""``."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""


def describe() -> str:
    """The supervisor's start-up line."""
    tunable = TUNABLE in os.environ.get("GLIBC_TUNABLES", "").split(":")
    return (f"heap on huge pages: pymalloc's arenas {_status}; glibc's heap "
            f"{'on' if tunable else 'off'}; the kernel's THP mode: {thp_setting() or 'unknown'}")
