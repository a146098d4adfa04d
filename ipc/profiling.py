"""A process's whole run under cProfile, when ``SHOAL_PROFILE=DIR`` is set (a developer's tool).

py-spy samples without slowing a process but is not always installable; cProfile is in the
standard library. With ``SHOAL_PROFILE=DIR`` the supervisor and every worker run under it and
write ``DIR/<role>-<pid>.prof`` when they end (a clean stop: SIGTERM or Ctrl-C), to read with
``python -m pstats``. cProfile roughly doubles the cost of each
Python call, so rates measured meanwhile mean nothing; the split between functions does.

Shared by the supervisor (``broker.runtime.supervisor``) and the workers (``workers.main``): the one
place both may import from without crossing the layer rules is ``ipc``.
"""

from __future__ import annotations

import cProfile
import os
from collections.abc import Callable
from typing import Any

ENV = "SHOAL_PROFILE"


def run_profiled(role: str, run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``run(*args, **kwargs)``, under cProfile when ``$SHOAL_PROFILE`` names a directory."""
    directory = os.environ.get(ENV)
    if not directory:
        return run(*args, **kwargs)
    profile = cProfile.Profile()
    try:
        return profile.runcall(run, *args, **kwargs)
    finally:
        profile.dump_stats(os.path.join(directory, f"{role}-{os.getpid()}.prof"))


STATS_ENV = "SHOAL_TRIO_STATS"


class TrioStats:
    """A trio instrument counting, per task name, the steps run and the CPU they took, and the
    loop's sleeps (``before_io_wait``): written as JSON to ``DIR/<role>-<pid>.json`` at the end of
    the run when ``$SHOAL_TRIO_STATS`` names a directory. Cheap enough to leave the rates meaningful:
    a ``process_time`` pair per step. A developer's tool, as ``SHOAL_PROFILE``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.steps: dict[str, list[float]] = {}
        self.waits = 0
        self.zero_waits = 0
        self._started = 0.0
        self._clock = __import__("time").process_time

    def before_task_step(self, task: Any) -> None:
        self._started = self._clock()

    def after_task_step(self, task: Any) -> None:
        spent = self._clock() - self._started
        entry = self.steps.get(task.name)
        if entry is None:
            self.steps[task.name] = [1, spent]
        else:
            entry[0] += 1
            entry[1] += spent

    def before_io_wait(self, timeout: float) -> None:
        self.waits += 1
        if timeout <= 0:
            self.zero_waits += 1

    def after_run(self) -> None:
        import json

        with open(self.path, "w") as out:
            json.dump({"steps": self.steps, "waits": self.waits, "zero_waits": self.zero_waits,
                       "cpu": self._clock()}, out)


def trio_instruments(role: str) -> list[Any]:
    directory = os.environ.get(STATS_ENV)
    if not directory:
        return []
    return [TrioStats(os.path.join(directory, f"{role}-{os.getpid()}.json"))]
