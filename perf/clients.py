"""The load generator's processes of one run (perf.loadgen, multiprocessing 'spawn'): started
with their go/stop events and result pipes, watched while they run, always reaped."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

SPAWN_WAIT = 60.0  # for every client to connect and be ready


def progress(line: str, enabled: bool) -> None:
    if enabled:
        print(line, file=sys.stderr, flush=True)


def spawn_context() -> Any:
    return mp.get_context("spawn")


class Clients:
    """The generator processes of one run: started, watched, always reaped."""

    def __init__(self) -> None:
        self.ctx = spawn_context()
        self.entries: list[dict[str, Any]] = []
        self.go = self.ctx.Event()
        self.stop = self.ctx.Event()

    def spawn(self, target: Callable[..., None], job: dict[str, Any], extra: dict[str, Any], name: str) -> dict:
        reader, writer = self.ctx.Pipe(duplex=False)
        ready = self.ctx.Event()
        shared = {"go": self.go, "stop": self.stop, "ready": ready, **extra}
        process = self.ctx.Process(target=target, args=(job, shared, writer), name=name, daemon=True)
        process.start()
        writer.close()
        entry = {"name": name, "process": process, "pipe": reader, "ready": ready, "result": None, "shared": shared}
        with contextlib.suppress(psutil.Error):
            entry["ps"] = psutil.Process(process.pid)
            entry["ps"].cpu_percent(None)
        self.entries.append(entry)
        return entry

    def wait_ready(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        for entry in self.entries:
            while not entry["ready"].wait(0.1):
                if not entry["process"].is_alive():
                    self._collect(entry, 1.0)
                    raise RuntimeError(f"{entry['name']} exited before it was ready: {entry['result']}")
                if time.monotonic() > limit:
                    raise RuntimeError(f"{entry['name']} not ready after {timeout:g} s")

    def dead(self) -> list[str]:
        return [e["name"] for e in self.entries if not e["process"].is_alive() and e["result"] is None]

    def cpu_percent_max(self) -> float:
        peak = 0.0
        for entry in self.entries:
            with contextlib.suppress(psutil.Error, KeyError):
                peak = max(peak, entry["ps"].cpu_percent(None))
        return peak

    def _collect(self, entry: dict[str, Any], timeout: float) -> None:
        if entry["result"] is not None:
            return
        with contextlib.suppress(EOFError, OSError):
            if entry["pipe"].poll(timeout):
                entry["result"] = entry["pipe"].recv()

    def finish(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Set stop, collect every result (bounded), join, kill what is left (by PID)."""
        self.stop.set()
        limit = time.monotonic() + timeout
        for entry in self.entries:
            self._collect(entry, max(0.1, limit - time.monotonic()))
        for entry in self.entries:
            entry["process"].join(max(0.1, limit - time.monotonic()))
            if entry["process"].is_alive():
                entry["process"].kill()
                entry["process"].join(5.0)
            if entry["result"] is None:
                entry["result"] = {"name": entry["name"], "error": f"no result (exit code {entry['process'].exitcode})"}
            entry["pipe"].close()
        return [e["result"] for e in self.entries]
