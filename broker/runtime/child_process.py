"""A helper process the supervisor starts by module name, restarts, and tells JSON lines.

The management process (``broker.runtime.management_child``) and the links process
(``broker.runtime.shovel_child``) are each a :class:`SupervisedChild`: started as
``python -m MODULE '<JSON settings>'`` with the file descriptors it inherits (never with
$SHOAL_USERS in its environment), started again whenever it dies -- after RESTART_BACKOFF when
it died within it, so that one that cannot start does not spin -- until the broker stops; and
told changes as JSON lines on its stdin, a pipe of ours (none running: its next start reads the
whole table). Nothing here imports what it starts: the supervisor knows each by its module name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import msgspec
import trio

from broker.runtime.worker_lifecycle import RESTART_BACKOFF

log = logging.getLogger("shoal.supervisor")


async def start_module(module: str, settings: dict[str, Any], pass_fds: Sequence[int],
                       stdout: bool = False) -> trio.Process:
    """``python -m module '<settings as JSON>'``, its stdin (and with ``stdout``, its stdout)
    a pipe of ours."""
    argv = [sys.executable, "-m", module, msgspec.json.encode(settings).decode()]
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_USERS"}
    return await trio.lowlevel.open_process(
        argv, pass_fds=list(pass_fds), env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE if stdout else None)


class SupervisedChild:
    """One helper process of the broker: its current process, its restart loop, its stdin."""

    # How the log names it: "cannot start the {what}{why}", "{what} (pid N) exited with ...".
    what: ClassVar[str] = "child process"
    why: ClassVar[str] = ""

    def __init__(self) -> None:
        self.process: trio.Process | None = None

    async def _spawn(self, settings: dict[str, Any]) -> trio.Process:
        """Start the process with ``settings`` (OSError, ValueError: it cannot be started)."""
        raise NotImplementedError

    async def _lifetime(self, process: trio.Process) -> int:
        """From a start to the process's exit: its exit code."""
        return await process.wait()

    def _restarting(self) -> None:
        """The process died and is about to be started again."""

    async def _supervise(self, settings: Callable[[], dict[str, Any]],
                         stopping: Callable[[], bool]) -> None:
        """Start the process, and again whenever it dies, until the broker stops."""
        while not stopping():
            started = trio.current_time()
            try:
                process = self.process = await self._spawn(settings())
            except (OSError, ValueError) as exc:
                log.error("cannot start the %s%s: %s", self.what, self.why, exc)
                await trio.sleep(RESTART_BACKOFF)
                continue
            code = await self._lifetime(process)
            if stopping():
                return
            self._restarting()
            log.warning("%s (pid %d) exited with %s; restarting it", self.what, process.pid, code)
            if trio.current_time() - started < RESTART_BACKOFF:
                await trio.sleep(RESTART_BACKOFF)

    async def tell(self, change: dict[str, Any]) -> None:
        """``change``, one JSON line on the running process's stdin (none running: its next
        start reads the whole table)."""
        process = self.process
        if process is None or process.returncode is not None or process.stdin is None:
            return
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await process.stdin.send_all(msgspec.json.encode(change) + b"\n")
