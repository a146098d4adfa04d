"""The definitions' WAL checkpointed off the event loop.

Each committed batch of definition changes is copied from the WAL into the main file and the
WAL emptied (``wal_checkpoint(TRUNCATE)``, with its fsyncs), so that a damaged WAL costs at most
the latest batch (``broker.storage.definition_store``). That costs about what the commit does,
and the supervisor's loop does not wait for it: :class:`Checkpoints` runs it on a thread,
through a connection of its own, while the loop goes on (the batch's replies go out
meanwhile). The next commit first waits for what is left of it (:meth:`Checkpoints.settle`),
so the WAL never holds two batches.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("shoal.definitions")

# How a checkpoint is run: ``start(fn, deliver)`` calls ``deliver(outcome)`` with fn's
# ``outcome.Outcome``, on a thread (``trio.lowlevel.start_thread_soon``).
StartThread = Callable[[Callable[[], object], Callable[[Any], object]], object]


def checkpoint(db: sqlite3.Connection, path: Path) -> None:
    """Copy the WAL into the main file and empty it: from here a damaged WAL costs nothing
    committed. A failure is logged (the batch stays committed, in the WAL)."""
    try:
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        log.warning("%s: checkpoint failed (%s): the latest definitions are in its WAL only",
                    path, exc)
        return
    if busy:
        log.warning("%s: checkpoint incomplete: the latest definitions are in its WAL only", path)


class Checkpoints:
    """Checkpoints of the database at ``path``, each begun once a batch is committed and run on a
    thread by ``start``; at most one at a time, and none while a batch is being committed."""

    def __init__(self, path: Path, start: StartThread) -> None:
        self.path = path
        self._start = start
        # Its own connection: the store's stays the loop's. Used by one checkpoint at a time.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._idle = threading.Event()
        self._idle.set()

    def begin(self) -> None:
        """A batch was committed: checkpoint it on a thread."""
        self._idle.clear()
        self._start(self._run, self._done)

    def settle(self) -> None:
        """Before the next commit: wait for the checkpoint under way, if any (the loop waits
        only when batches come faster than checkpoints)."""
        self._idle.wait()

    def close(self) -> None:
        self.settle()
        self._db.close()

    def _run(self) -> None:
        checkpoint(self._db, self.path)

    def _done(self, result: Any) -> None:
        """On the checkpoint's thread, once it ran."""
        try:
            result.unwrap()
        except Exception:  # a bug: the batch stays committed, in the WAL
            log.exception("%s: checkpoint failed", self.path)
        finally:
            self._idle.set()
