"""The broker's data directory (``shoal serve --data-dir``): where it is, and who holds it.

One broker per data directory, as RabbitMQ has one node per Mnesia directory: the supervisor
holds an exclusive ``flock`` on ``DIR/lock`` for as long as it runs (the kernel drops it when
the process dies, even by SIGKILL, so a crash never leaves a stale lock), and writes its PID
there so that a second broker can say who holds it. Layout::

    DIR/lock             the lock, and the PID of the broker holding it
    DIR/definitions.db   durable exchanges, queues and bindings, and users (broker.definition_store)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK = "lock"
DEFINITIONS = "definitions.db"


def default_data_dir(port: int) -> Path:
    """``$XDG_STATE_HOME/shoal/node-<port>`` (``~/.local/state`` when unset): per user, kept
    between runs, one per port so that brokers on two ports never share one."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "shoal" / f"node-{port}"


class DataDirInUse(OSError):
    """Another broker holds the data directory."""


class DataDir:
    """An open data directory, locked for this process until :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_path = self.path / LOCK
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirInUse(
                f"data directory {self.path} is in use by another broker (pid {holder})"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd: int | None = fd

    @property
    def definitions(self) -> Path:
        return self.path / DEFINITIONS

    def close(self) -> None:
        """Give the lock up (the lock file stays: removing it could race a starting broker)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
