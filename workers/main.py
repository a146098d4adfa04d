"""Entry point of a worker process: ``python -m workers.main '<WorkerConfig JSON>'``."""

from __future__ import annotations

from ipc import huge_pages

huge_pages.install()  # before the imports: their objects go on huge pages too (ipc/huge_pages.py)

import logging
import os
import signal
import sys

import msgspec
import trio

from ipc import allocator
from ipc.compiled import compiled_modules
from ipc.profiling import run_profiled, trio_instruments
from ipc.worker_config import WorkerConfig
from workers.server import serve


def main(argv: list[str]) -> int:
    config = msgspec.json.decode(argv[1], type=WorkerConfig)
    if config.users_fd >= 0:  # the supervisor wrote the users and closed its end
        with os.fdopen(config.users_fd, "rb") as pipe:
            users = msgspec.json.decode(pipe.read(), type=dict[str, str])
        config = msgspec.structs.replace(config, users=users, users_fd=-1)
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(name)s[%(process)d] w{config.index} %(levelname)s %(message)s",
    )
    # Ctrl-C reaches the whole process group; only the supervisor decides.
    # No PR_SET_PDEATHSIG: it fires when the *thread* that spawned us exits, and
    # trio spawns from a cached thread that retires when idle. The alive pipe
    # (server._watch_supervisor) is how a worker learns the supervisor died.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    allocator.settle()  # freed read buffers stay in the heap (ipc/allocator.py)
    if config.index == 0:  # every worker runs the same modules: one line says it
        compiled = compiled_modules()
        logging.getLogger("shoal.worker").info(
            "hot path: %s", f"{len(compiled)} module(s) compiled with mypyc" if compiled
            else "pure Python (`make compiled` builds the compiled modules)")
    run_profiled(f"worker{config.index}", trio.run, serve, config,
                 instruments=trio_instruments(f"worker{config.index}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
