"""``shoal serve``'s process: logging, the supervisor set up, served and cleaned up.

A start that cannot go on (a port in use, a damaged data directory, bad TLS files or
definitions) is one line at ERROR and exit status 1, as RabbitMQ's "could not start listener",
with nothing left behind: what :meth:`~broker.runtime.supervisor.Supervisor.setup` created so
far is removed.

Called from: ``cli.main`` (``shoal serve``).
"""

from __future__ import annotations

import logging

from broker.runtime import definitions_io
from broker.runtime.serve_config import ServeConfig
from broker.runtime.supervisor import Supervisor
from broker.storage.data_dir import DataDirDamaged, DataDirInUse
from broker.storage.definition_store import DefinitionStoreError
from broker.storage.message_store import ArenasFull
from ipc import huge_pages
from ipc.tls import TLSSettingsError

log = logging.getLogger("shoal.supervisor")


def run(config: ServeConfig) -> int:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    sup = Supervisor(config)
    try:
        sup.setup()
    except (TLSSettingsError, DataDirInUse, DataDirDamaged, DefinitionStoreError, ArenasFull,
            definitions_io.DefinitionsError) as exc:
        log.error("cannot start: %s%s", "TLS: " if isinstance(exc, TLSSettingsError) else "", exc)
        sup.cleanup()
        return 1
    except OSError as exc:
        # One line, as RabbitMQ's "could not start listener" (no traceback), and nothing left
        # behind: what setup created so far is removed.
        where = f"{config.host}:{config.port}" if sup._listener is None else (
            exc.filename or "setup")
        log.error("cannot start: %s: %s", where, (exc.strerror or str(exc)).lower())
        sup.cleanup()
        return 1
    log.info("Shoal %s listening on %s:%d with %d worker(s)",
             sup.instance, config.host, sup.port, config.workers)
    if sup._tls_listener is not None:
        log.info("AMQPS (TLS) listening on %s:%d", config.host, sup._tls_listener.getsockname()[1])
    # After the start succeeded: a refused start stays one line. Installed by cli.main.
    log.info("%s", huge_pages.describe())
    try:
        sup.serve()
    finally:
        sup.cleanup()
    return 0
