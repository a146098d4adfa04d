"""The broker's data directory (``shoal serve --data-dir``): where it is, and who holds it.

One broker per data directory, as RabbitMQ has one node per Mnesia directory: the supervisor
holds an exclusive ``flock`` on ``DIR/lock`` for as long as it runs (the kernel drops it when
the process dies, even by SIGKILL, so a crash never leaves a stale lock), and writes its PID
there so that a second broker can say who holds it. Layout::

    DIR/lock             the lock, and the PID of the broker holding it
    DIR/node.json        the marker: this directory's node id, written once its first start is done
    DIR/definitions.db   durable exchanges, queues and bindings, and users (broker.storage.definition_store)
    DIR/definitions.gen  the number of the latest change batch committed there

A directory that was ever initialised is never taken for a new one: the marker says it was,
and ``definitions.db`` holds the same node id, so a database that lost its content (or one
copied from another node) is recognised. The marker is checksummed: a damaged one is an error
naming it, never "no marker".
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import zlib
from pathlib import Path

LOCK = "lock"
MARKER = "node.json"
DEFINITIONS = "definitions.db"
GENERATION = "definitions.gen"
FORMAT = 1  # the layout's version, in the marker: a newer one is refused
# What holds queue data: files there mean the directory was in use (broker.storage.message_store).
QUEUE_DATA = ("index", "bodies", "quarantine")
_NODE = re.compile(r"[0-9a-f]{32}")


def default_data_dir(port: int) -> Path:
    """``$XDG_STATE_HOME/shoal/node-<port>`` (``~/.local/state`` when unset): per user, kept
    between runs, one per port so that brokers on two ports never share one."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "shoal" / f"node-{port}"


class DataDirInUse(OSError):
    """Another broker holds the data directory."""


class DataDirDamaged(Exception):
    """A file of the data directory cannot be trusted; the text is one line naming it and what
    to do. Starting anyway would take an initialised directory for a new one."""


def new_node_id() -> str:
    return secrets.token_hex(16)


def _marker_crc(node: str, version: int) -> int:
    return zlib.crc32(f"shoal-node {version} {node}".encode())


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

    @property
    def generation(self) -> Path:
        return self.path / GENERATION

    @property
    def marker(self) -> Path:
        return self.path / MARKER

    def read_marker(self) -> str | None:
        """This directory's node id; None when it has no marker (never initialised, or from a
        Shoal that wrote none). Raises DataDirDamaged when the marker cannot be read."""
        try:
            raw = self.marker.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.damaged(self.marker, exc.strerror or str(exc)) from None
        try:
            data = json.loads(raw)
            node, version, crc = data["node"], data["format"], data["crc32"]
        except (ValueError, TypeError, KeyError):
            raise self.damaged(self.marker, "damaged (not the marker Shoal writes)") from None
        if not (isinstance(node, str) and _NODE.fullmatch(node) and isinstance(version, int)
                and crc == _marker_crc(node, version)):
            raise self.damaged(self.marker, "damaged (its checksum does not match)")
        if version > FORMAT:
            raise DataDirDamaged(f"{self.marker}: written by a newer Shoal (format {version}, "
                                 f"this one reads {FORMAT})")
        return node

    def write_marker(self, node: str) -> None:
        """Write the marker atomically: a crash leaves the old one or the new one, on disk
        (file and directory fsynced) when this returns."""
        text = json.dumps({"node": node, "format": FORMAT, "crc32": _marker_crc(node, FORMAT)})
        tmp = self.path / f"{MARKER}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, text.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.marker)
        self.sync_directory()

    def sync_directory(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def holds_queue_data(self) -> bool:
        """Whether any index, body or quarantined file is here: the directory was in use."""
        for name in QUEUE_DATA:
            folder = self.path / name
            if folder.is_dir() and any(p.is_file() for p in folder.rglob("*")):
                return True
        return False

    def damaged(self, file: Path, what: str) -> DataDirDamaged:
        """The one line for a file that cannot be trusted: which, what is wrong, what to do."""
        return DataDirDamaged(
            f"{file}: {what}: restore it from a backup, or move the data directory {self.path} "
            "aside to start from nothing")

    def close(self) -> None:
        """Give the lock up (the lock file stays: removing it could race a starting broker)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
