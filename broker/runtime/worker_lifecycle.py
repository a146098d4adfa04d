"""A worker process's lifecycle as the supervisor sees it: its slot, its start, and when its
replacement is waited for (gunicorn's arbiter: start from a clean state, reap and restart, never
spin on a worker that cannot start)."""

from __future__ import annotations

import logging
import os
import sys
from typing import NamedTuple

import msgspec
import trio

from ipc.region import Region
from ipc.wakeup import EventFd
from ipc.worker_config import WorkerConfig

log = logging.getLogger("shoal.supervisor")

RESTART_BACKOFF = 1.0
USERS_ENV = "SHOAL_USERS"  # shoal serve reads --user values from it (cli.main); workers never see it
USERS_PIPE_MAX = 60_000  # bytes: what a pipe takes without a reader (Linux: 64 KiB)


class WorkerSlot:
    """What the supervisor keeps for worker index k across its incarnations."""

    def __init__(self, index: int, region: Region) -> None:
        self.index = index
        self.region = region
        self.request_efd = EventFd()  # worker → supervisor
        self.event_efd = EventFd()  # supervisor → worker
        self.process: trio.Process | None = None
        self.ready = False
        self.corrupt = False  # its request ring no longer adds up: not read until reset
        self.pending: list[bytes] = []  # encoded events that did not fit the ring
        # Requests taken from the ring that a step's STEP_WORK left for the next: they come
        # before whatever is still in the ring.
        self.unapplied: list[bytes] = []
        # The supervisor wrote into the arena (a free's state byte, a sweep) since its pages
        # were last dropped from its page tables (Supervisor._tick, Region.forget_arena_pages)
        self.arena_touched = False

    def kill(self) -> None:
        """A worker whose ring no longer adds up is killed; its replacement
        starts on reset rings (the failure model of a crashed worker)."""
        log.error("worker %d: ring corrupt; replacing the worker", self.index)
        if self.process is not None and self.process.returncode is None:
            self.process.kill()

    def close(self) -> None:
        self.region.close()
        self.region.unlink()
        self.request_efd.close()
        self.event_efd.close()


class Replacement(NamedTuple):
    awaited: bool  # the other workers leave new connections to it (a starting mark)
    back_off: bool  # it starts after RESTART_BACKOFF


class Restarts:
    """Whether a dead worker's replacement is waited for, and whether it backs off.

    While a worker starts, its region carries a starting mark, so the other workers
    leave new connections to it for up to ``start_grace`` (workers.balance)
    instead of keeping every connection opened meanwhile. A crash loop is not
    waited for: a worker that died before it said hello, or within
    RESTART_BACKOFF of its start for the second time running, is started
    again after RESTART_BACKOFF (it must not spin) with its region
    NOT_ACCEPTING until it accepts. A worker that had started and dies once
    is replaced at once.
    """

    def __init__(self) -> None:
        self.quick_deaths = 0  # incarnations in a row that died within RESTART_BACKOFF of their start

    def died(self, lived: float, ready: bool) -> Replacement:
        """An incarnation that lived ``lived`` seconds died; ``ready``: it had said hello."""
        quick = lived < RESTART_BACKOFF
        self.quick_deaths = self.quick_deaths + 1 if quick else 0
        awaited = ready and self.quick_deaths < 2
        return Replacement(awaited, quick and not awaited)


async def start_worker(cfg: WorkerConfig, users: dict[str, str]) -> trio.Process:
    """Start ``workers.main`` with ``cfg``, passing it ``cfg``'s fds. Passwords (``users``:
    stored passwords, never the passwords) reach it through a pipe it reads at start: not argv
    (ps), not its environment (/proc/PID/environ), from which $SHOAL_USERS is left out as well."""
    users_r, users_w = os.pipe()
    try:
        payload = msgspec.json.encode(users)
        if len(payload) > USERS_PIPE_MAX:
            raise ValueError(f"{len(users)} users: {len(payload)} bytes, over {USERS_PIPE_MAX}")
        os.write(users_w, payload)
        os.close(users_w)
        users_w = -1
        cfg = msgspec.structs.replace(cfg, users_fd=users_r)
        fds: tuple[int, ...] = (cfg.listen_fd, cfg.request_fd, cfg.event_fd, cfg.alive_fd, users_r)
        if cfg.tls_listen_fd >= 0:  # --tls-port: the AMQPS listener, shared as the plain one
            fds += (cfg.tls_listen_fd,)
        argv = [sys.executable, "-m", "workers.main", msgspec.json.encode(cfg).decode()]
        env = {k: v for k, v in os.environ.items() if k != USERS_ENV}
        return await trio.lowlevel.open_process(argv, pass_fds=fds, env=env)
    finally:
        os.close(users_r)
        if users_w >= 0:
            os.close(users_w)
