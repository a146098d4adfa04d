"""psutil samples of processes, the ``proc`` table: the CPU and memory charts of ``shoal report``.

The traced broker's supervisor samples itself and its workers (``shoal serve --trace``); the perf
scripts sample the broker and their clients (``perf.quick --trace``). Built on
:class:`tracing.streams.ArrowWriter`; imports pyarrow, and psutil when it samples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tracing import schema as ts
from tracing.streams import ArrowWriter

SAMPLE_INTERVAL_S = 1.0  # the report's CPU and memory charts have one point a second


class ProcSampleWriter(ArrowWriter):
    """psutil samples of the broker's (and the clients') processes, ``proc`` table."""

    def __init__(self, directory: str | os.PathLike[str], process_name: str = "sampler",
                 **options: Any) -> None:
        options.setdefault("flush_rows", 256)
        options.setdefault("flush_ms", 1000)
        super().__init__(directory, process_name, **options)
        (self._s,) = (b.appends for b in self._kinds(ts.PROCS, None, {
            "sample": (ts.PROC_SCHEMA.names, {"process": None, "pid": None})}))
        self._last_cpu: dict[int, tuple[int, float]] = {}  # pid -> (ts_ns, CPU seconds)
        self._known: dict[int, Any] = {}  # pid -> psutil.Process, for sample_pids

    def sample(self, ts_ns: int, pid: int, name: str, cpu_percent: float | None, rss_bytes: int,
               cpu_user_s: float, cpu_system_s: float, ctx_voluntary: int,
               ctx_involuntary: int) -> None:
        """One sample of one process, values as psutil gives them (``ts_ns`` from the monotonic
        clock: ``int(time.monotonic() * 1e9)`` is fine). ``cpu_percent`` may be None: the report
        then derives it from the cumulative CPU times of consecutive samples."""
        for append, value in zip(self._s, (ts_ns, pid, name, cpu_percent, rss_bytes, cpu_user_s,
                                           cpu_system_s, ctx_voluntary, ctx_involuntary),
                                 strict=True):
            append(value)

    def sample_processes(self, processes: Mapping[str, Any], ts_ns: int | None = None) -> int:
        """Sample every ``name -> psutil.Process``; processes that are gone are skipped.

        ``cpu_percent`` is derived here from the process's CPU times since this writer's previous
        sample of the same pid, over the wall time between them (None for the first): not psutil's
        ``cpu_percent``, whose state is per Process object and which another caller sampling the
        same objects (perf.quick) resets -- that gave 0 % or 473 % on a 2-core host. Returns
        samples taken."""
        import psutil

        now = time.monotonic_ns() if ts_ns is None else ts_ns
        taken = 0
        last = self._last_cpu
        for name, proc in processes.items():
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    ctx = proc.num_ctx_switches()
                    rss = proc.memory_info().rss
            except psutil.Error:
                continue
            used = times.user + times.system
            previous = last.get(proc.pid)
            cpu = None
            if previous is not None and now > previous[0]:
                cpu = round(max(0.0, used - previous[1]) / ((now - previous[0]) / 1e9) * 100, 1)
            last[proc.pid] = (now, used)
            self.sample(now, proc.pid, name, cpu, rss, times.user, times.system, ctx.voluntary,
                        ctx.involuntary)
            taken += 1
        self.maybe_flush(now)
        return taken

    def sample_pids(self, pids: Mapping[str, int], ts_ns: int | None = None) -> int:
        """:meth:`sample_processes` of ``name -> pid`` (the supervisor knows its workers by pid:
        a replaced worker keeps its name under a new pid). Returns samples taken."""
        import psutil

        known = self._known
        for pid in set(known) - set(pids.values()):
            del known[pid]  # gone or replaced: a recycled pid gets a fresh Process
        processes = {}
        for name, pid in pids.items():
            if pid not in known:
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            processes[name] = known[pid]
        return self.sample_processes(processes, ts_ns)
