"""Group commit of a worker's body log: the sync task's loop (``--data-dir``).

Persistent bodies are appended to the worker's body log as they are published
(``ipc.logfile.BodyLog``); their publisher confirms wait until a sync covers them. One sync
runs at a time, in a thread; whatever was appended meanwhile is covered by the next one
(docs/design.md, Glossary: "Group commit").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn

import trio

from ipc.logfile import BodyLog, CpuSaturation, sync_files, sync_pause
from workers.socket_writer import Doorbell

log = logging.getLogger("shoal.worker")


def _nothing() -> None:
    pass


async def sync_bodies(body_log: BodyLog, bell: Doorbell, synced: Callable[[], object],
                      write: Callable[[], object] = _nothing,
                      saturated: Callable[[], bool] | None = None) -> NoReturn:
    """Sync ``body_log`` whenever it has unsynced appends (``bell`` rings after each), calling
    ``write`` before each sync (Worker.write_bodies: the queued frames written, a failure dealt
    with) and ``synced`` after it. Group commit: appends made while a sync runs in its thread
    are covered by the next one, which starts as soon as that one is done; with nothing
    unsynced it sleeps on the bell. A failed sync ends the worker: the confirms waiting for
    it are never sent, and the supervisor sees the worker go. Under load the next sync waits a
    little (ipc.logfile.sync_pause; ``saturated`` says whether the host's CPUs are busy)."""
    if saturated is None:
        saturated = CpuSaturation()
    while True:
        if not body_log.unsynced:
            await bell.wait()
            continue
        write()
        began = trio.current_time()
        appended, fds = body_log.sync_plan()
        try:
            await trio.to_thread.run_sync(sync_files, fds)
        except OSError:
            log.critical("worker %d: syncing its body log in %s failed", body_log.worker,
                         body_log.data_dir)
            raise
        covered = appended - body_log.synced
        body_log.synced_to(appended, fds)
        synced()
        pause = sync_pause(covered, trio.current_time() - began, saturated)
        if pause:  # under load: let the next sync cover more
            await trio.sleep(pause)
