"""``shoal serve --huge-pages``: the broker's Python heaps on transparent huge pages.

Why: on a virtual machine whose page walks are dear (nested or shadow paging), a process that
wakes after a sleep pays for every page of its heap it touches again, and a broker at a light
load (each message a wake-up of three processes) spends much of its CPU there. Measured on
this project's 2-core VM (docs/performance.md, "Huge pages"): touching 1,500 scattered pages
after a 10 ms sleep costs 2.6 ms on 4 KiB pages and 0.38 ms on 2 MiB ones.

How: CPython's own small-object allocator (pymalloc) takes its memory in 1 MiB mappings of its
own, which the kernel cannot back with 2 MiB pages, and it offers no hook short of C. So the
option runs every broker process with ``PYTHONMALLOC=malloc`` (Python's objects from the C
library's heap) and glibc's ``glibc.malloc.hugetlb=1`` tunable (that heap advised for
transparent huge pages, ``MADV_HUGEPAGE``: enough where
``/sys/kernel/mm/transparent_hugepage/enabled`` says ``madvise`` or ``always``). Both are read
when a process starts, so ``serve`` starts itself again with them (``os.execve``: the same
PID, the same arguments); the workers and the other children inherit them.

The trade: glibc's allocator is slower than pymalloc for Python's small objects, so unpaced
throughput falls a little (docs/performance.md has the figures); hence off by default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MALLOC = "malloc"
TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to start again with, or None when ``environ`` already has it.

    Raises ValueError when ``PYTHONMALLOC`` is set to another allocator (a debug one, say):
    the two cannot both hold."""
    current = environ.get("PYTHONMALLOC", "")
    tunables = [t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t]
    if current == MALLOC and TUNABLE in tunables:
        return None
    if current not in ("", MALLOC):
        raise ValueError(f"PYTHONMALLOC is {current!r}; --huge-pages needs it to be "
                         f"{MALLOC!r} (unset it, or drop --huge-pages)")
    tunables = [t for t in tunables if not t.startswith("glibc.malloc.hugetlb=")] + [TUNABLE]
    return {**environ, "PYTHONMALLOC": MALLOC, "GLIBC_TUNABLES": ":".join(tunables)}


def start_again_with_huge_pages() -> None:
    """Replace this process with itself under :func:`huge_pages_env`, unless it already is."""
    env = huge_pages_env(os.environ)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def thp_setting(path: str = THP_SETTING) -> str:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or ``""``."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""
