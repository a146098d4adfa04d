"""Entry point of a worker process: ``python -m workers.main '<WorkerConfig JSON>'``."""

from __future__ import annotations

import ctypes
import logging
import signal
import sys

import msgspec
import trio

from ipc.records import WorkerConfig
from workers.server import serve

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Belt and braces beside the alive pipe: the kernel SIGKILLs us when the
    supervisor dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    config = msgspec.json.decode(argv[1], type=WorkerConfig)
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(name)s[%(process)d] w{config.index} %(levelname)s %(message)s",
    )
    # Ctrl-C reaches the whole process group; only the supervisor decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    trio.run(serve, config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
