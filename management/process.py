"""The management process: ``python -m management.process CONFIG_JSON`` (the supervisor starts it).

The supervisor binds the HTTP listener (so a port in use fails ``shoal serve`` at start, as
the AMQP port does) and passes it, with the read end of its ``alive`` pipe and a pipe holding
the users' stored passwords, as inherited file descriptors; the JSON config on argv holds no
secret. The process runs trio: hypercorn serves the API (management.app), the sampler polls
the control socket (management.stats), and EOF on the ``alive`` pipe (the supervisor died)
ends it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import trio

from management import prometheus
from management.app import Context, make_app, node_name
from management.auth import Users
from management.shapes import Node
from management.stats import Sampler

log = logging.getLogger("shoal.management")


@dataclass
class ManagementConfig:
    """What the supervisor tells the management process (argv: no secrets here)."""

    listen_fd: int
    users_fd: int
    alive_fd: int
    control_path: str
    amqp_host: str
    amqp_port: int
    http_port: int
    version: str
    interval: float = 5.0  # collect_statistics_interval, seconds
    fresh: float = 1.0  # a read older than this asks the supervisor for a new sample
    heartbeat: int = 60
    frame_max: int = 131072
    channel_max: int = 2047
    data_dir: str = ""
    log_level: str = "info"
    prometheus_fd: int = -1  # the Prometheus listener (--prometheus-port), -1: none
    # The HTTPS listener (--management-tls-port), -1: none; the PEM files by path (hypercorn
    # loads them here: the key never travels on argv, the environment or a pipe).
    tls_fd: int = -1
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    https_port: int = 0


def read_users(fd: int) -> tuple[dict[str, str], dict[str, list[str]], dict[str, dict[str, int]]]:
    """The users pipe: ``[users, tags, user_limits]`` (an older supervisor wrote fewer)."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    loaded = json.loads(data) if data else {}
    if isinstance(loaded, list):
        return dict(loaded[0]), dict(loaded[1]), dict(loaded[2]) if len(loaded) > 2 else {}
    return dict(loaded), {}, {}


async def watch_user_changes(users: Users, fd: int = 0) -> None:
    """Users changed at runtime: one JSON line each on stdin (broker.runtime.users); EOF ends it."""
    stream = trio.lowlevel.FdStream(os.dup(fd))
    buffer = b""
    async with stream:
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                try:
                    change = json.loads(line)
                except ValueError:
                    log.warning("ignored a users change that is not JSON")
                    continue
                if isinstance(change, dict):
                    users.apply(change)


async def watch_alive(fd: int, cancel: trio.CancelScope) -> None:
    """EOF on the supervisor's alive pipe: it died; so does this process."""
    while True:
        await trio.lowlevel.wait_readable(fd)
        if not os.read(fd, 1):
            log.warning("the supervisor is gone; management exits")
            cancel.cancel()
            return


def add_reason_phrases() -> None:
    """hypercorn's HTTP/1.1 status line has no reason phrase (``HTTP/1.1 401 ``); RabbitMQ's
    (cowboy) has one, and clients show it: requests' ``401 Client Error: Unauthorized``, which
    amqpstorm's tests match. So each h11 response without one gets the standard phrase."""
    import h11
    from hypercorn.protocol.h11 import H11Protocol

    send = H11Protocol._send_h11_event

    async def send_with_reason(self: H11Protocol, event: Any) -> None:
        if isinstance(event, h11.Response) and not event.reason:
            try:
                object.__setattr__(event, "reason", HTTPStatus(event.status_code).phrase.encode())
            except ValueError:  # a status code without a standard phrase
                pass
        await send(self, event)

    H11Protocol._send_h11_event = send_with_reason  # type: ignore[method-assign]


async def serve(config: ManagementConfig, users: dict[str, str],
                tags: dict[str, list[str]] | None = None,
                limits: dict[str, dict[str, int]] | None = None) -> None:
    from hypercorn.config import Config as HyperConfig
    from hypercorn.trio import serve as hyper_serve

    sampler = Sampler(config.control_path, config.interval, config.fresh)
    node = Node(node_name(), config.amqp_host, config.amqp_port, config.http_port, config.version,
                config.heartbeat, config.frame_max, config.channel_max)
    amqp_host = "127.0.0.1" if config.amqp_host in ("0.0.0.0", "") else (
        "::1" if config.amqp_host == "::" else config.amqp_host)
    ctx = Context(sampler, node, Users(users, tags=tags, limits=limits), config.control_path, amqp_host,
                  config.amqp_port, config.data_dir)
    add_reason_phrases()
    hyper = HyperConfig()
    hyper.bind = [f"fd://{config.listen_fd}"]
    if config.tls_fd >= 0:  # hypercorn serves `bind` over TLS (1.2 minimum), `insecure_bind` plain
        hyper.bind = [f"fd://{config.tls_fd}"]
        hyper.insecure_bind = [f"fd://{config.listen_fd}"]
        hyper.certfile, hyper.keyfile = config.tls_cert, config.tls_key
        hyper.ca_certs = config.tls_ca or None
    hyper.accesslog = None
    hyper.errorlog = logging.getLogger("shoal.management.http")
    hyper.keep_alive_timeout = 30
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_alive, config.alive_fd, nursery.cancel_scope)
        nursery.start_soon(sampler.run)
        if config.prometheus_fd >= 0:
            nursery.start_soon(prometheus.serve, config.prometheus_fd, sampler, prometheus.Node(
                node.name, node.name, config.version, config.data_dir))
        if not os.isatty(0):
            nursery.start_soon(watch_user_changes, ctx.users)
        await hyper_serve(make_app(ctx), hyper, shutdown_trigger=trio.sleep_forever)  # type: ignore[arg-type]
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    raw: dict[str, Any] = json.loads(args[0])
    config = ManagementConfig(**raw)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s",
    )
    users, tags, limits = read_users(config.users_fd)
    log.info("management API on port %d", config.http_port)
    if config.tls_fd >= 0:
        log.info("management API over TLS on port %d", config.https_port)
    try:
        trio.run(serve, config, users, tags, limits)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
