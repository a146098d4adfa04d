"""The management process as the supervisor's child: bound, started, restarted, ended.

The supervisor binds the HTTP listener at setup (a port in use fails the start, as the AMQP
port does) and starts ``python -m management.process`` as it starts a worker: the listener, the
read end of the ``alive`` pipe and a pipe with the users' stored passwords are inherited file
descriptors, the rest is a JSON argument without secrets (with --management-tls-port, the
HTTPS listener is inherited too, and the certificate and key go by path: the process reads
them). A management process that dies is started again (after RESTART_BACKOFF when it dies
within it: it must not spin, ``broker.runtime.child_process``); SIGTERM at shutdown ends it with
the workers. Nothing here imports ``management/``: the supervisor knows it by its module name only.

Users changed at runtime (broker.runtime.users) reach the running process as JSON lines on its
stdin, a pipe of ours: ``{"users": {name: stored password}, "removed": [name], "tags": {name:
[tag]}}``; the users' limits (broker.runtime.limits) as the whole table after each change,
``{"user_limits": {name: {limit: value}}}`` (GET /api/users shows them). A process started later
gets all of it through its users pipe, as ``[users, tags, user_limits]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import msgspec
import trio

from broker.runtime.child_process import SupervisedChild, start_module

log = logging.getLogger("shoal.supervisor")

USERS_PIPE_MAX = 60_000  # what a pipe takes without a reader
MODULE = "management.process"


def shoal_version() -> str:
    try:
        return version("shoal")
    except PackageNotFoundError:
        return "0.0.0"


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); OSError when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class ManagementChild(SupervisedChild):
    """The management process of one broker: its listener and its current process."""

    what = "management process"

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        sock = self.sock = listen(host, port)
        self.port: int = sock.getsockname()[1]
        self.prometheus: socket.socket | None = None  # --prometheus-port, served by the process too
        self.prometheus_port = 0
        self.tls: socket.socket | None = None  # --management-tls-port: HTTPS, same app
        self.tls_port = 0
        self.tls_files: tuple[str, str, str] = ("", "", "")  # cert, key, CA: paths only
        self._limits_bell = trio.Event()  # the users' limits changed since the last push

    def listen_tls(self, host: str, port: int, cert: str, key: str, ca: str) -> None:
        """Bind the HTTPS listener; the process loads the files from these paths."""
        self.tls = listen(host, port)
        self.tls_port = self.tls.getsockname()[1]
        self.tls_files = (cert, key, ca)

    def listen_prometheus(self, host: str, port: int, required: bool) -> None:
        """Bind the Prometheus listener (``/metrics``) the management process serves too: a port
        in use fails the start when it was asked for (``required``), else it is left out."""
        try:
            self.prometheus = listen(host, port)
        except OSError as exc:
            if required:
                raise
            log.warning("Prometheus metrics not served: port %d: %s (--prometheus-port chooses "
                        "another)", port, exc.strerror or exc)
            return
        self.prometheus_port = self.prometheus.getsockname()[1]

    def close(self) -> None:
        self.sock.close()
        if self.prometheus is not None:
            self.prometheus.close()
        if self.tls is not None:
            self.tls.close()

    async def supervise(self, settings: Callable[[], dict[str, Any]],
                        stopping: Callable[[], bool]) -> None:
        """Start the management process, and again whenever it dies, until the broker stops."""
        await self._supervise(settings, stopping)

    async def tell_users(self, change: dict[str, Any]) -> None:
        """A users change, to the running management process (none running: its next start
        reads the whole table)."""
        await self.tell(change)

    def user_limits_changed(self) -> None:
        """The users' limits changed (broker.runtime.limits): :meth:`push_user_limits` sends them."""
        self._limits_bell.set()

    async def push_user_limits(self, table: Callable[[], dict[str, dict[str, int]]]) -> None:
        """The whole table after each change, from this one task: an older table never arrives
        after a newer one, and changes made while one is sent go out together."""
        while True:
            await self._limits_bell.wait()
            self._limits_bell = trio.Event()
            await self.tell({"user_limits": table()})

    async def _spawn(self, settings: dict[str, Any]) -> trio.Process:
        users = settings.pop("users")
        tags = settings.pop("user_tags", {})
        limits = settings.pop("user_limits", {})
        alive_fd = settings["alive_fd"]
        users_r, users_w = os.pipe()
        try:
            payload = msgspec.json.encode([users, tags, limits])  # stored passwords, never the passwords
            if len(payload) > USERS_PIPE_MAX:
                raise ValueError(f"{len(users)} users: {len(payload)} bytes, over {USERS_PIPE_MAX}")
            os.write(users_w, payload)
            os.close(users_w)
            users_w = -1
            config = dict(settings, listen_fd=self.sock.fileno(), users_fd=users_r,
                          http_port=self.port, version=shoal_version())
            fds = [self.sock.fileno(), users_r, alive_fd]
            if self.prometheus is not None:
                config["prometheus_fd"] = self.prometheus.fileno()
                fds.append(self.prometheus.fileno())
            if self.tls is not None:
                cert, key, ca = self.tls_files
                config.update(tls_fd=self.tls.fileno(), tls_cert=cert, tls_key=key, tls_ca=ca,
                              https_port=self.tls_port)
                fds.append(self.tls.fileno())
            return await start_module(MODULE, config, fds)
        finally:
            os.close(users_r)
            if users_w >= 0:
                with contextlib.suppress(OSError):
                    os.close(users_w)
