"""A process's whole run under cProfile, when ``SHOAL_PROFILE=DIR`` is set (a developer's tool).

py-spy samples without slowing a process but is not always installable; cProfile is in the
standard library. With ``SHOAL_PROFILE=DIR`` the supervisor and every worker run under it and
write ``DIR/<role>-<pid>.prof`` when they end (a clean stop: SIGTERM or Ctrl-C), to read with
``python -m pstats``. cProfile roughly doubles the cost of each
Python call, so rates measured meanwhile mean nothing; the split between functions does.

Shared by the supervisor (``broker.supervisor``) and the workers (``workers.main``): the one
place both may import from without crossing the layer rules is ``ipc``.
"""

from __future__ import annotations

import cProfile
import os
from collections.abc import Callable
from typing import Any

ENV = "SHOAL_PROFILE"


def run_profiled(role: str, run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)``, under cProfile when ``$SHOAL_PROFILE`` names a directory."""
    directory = os.environ.get(ENV)
    if not directory:
        return run(*args)
    profile = cProfile.Profile()
    try:
        return profile.runcall(run, *args)
    finally:
        profile.dump_stats(os.path.join(directory, f"{role}-{os.getpid()}.prof"))
