"""The supervisor's control socket: what ``shoal list-connections`` asks a running broker.

Theory of operation
-------------------
The supervisor listens on a Unix socket (mode 0600, in a directory only this user can
enter), by default ``$XDG_RUNTIME_DIR/shoal-<port>.sock`` or
``/tmp/shoal-<uid>/shoal-<port>.sock``; the ready file names it. A client sends one JSON
line, ``{"command": "list_connections"}``, and reads one JSON line back:
``{"connections": [...]}`` or ``{"error": "..."}``. ``{"command": "credit_flow"}`` answers
``{"withheld": [{"worker", "conn", "grants"}, ...]}``: per connection, how many times the
supervisor held its publish credit back (broker.runtime.credit_flow), since the start.
``{"command": "snapshot"}`` answers the supervisor's topology and counters, compact, for the
management process (broker.runtime.snapshot). ``{"command": "close_connection", "name": N,
"reason": TEXT}`` closes the connection named N with 320 CONNECTION_FORCED (its worker sends
connection.close): ``{"closed": N}``, or ``{"error": ..., "missing": true}``.

Connections live in the workers, so listing them is a round trip on the rings: the
supervisor sends ``ListConnections(request)`` to every worker that is up and waits (at
most ANSWER_TIMEOUT) for each ``ConnectionsListed(request, rows)``; a worker that dies
meanwhile is not waited for. The later management API is meant to grow from here.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from broker.runtime.dispatch import Dispatcher
from broker.runtime.snapshot import build_snapshot
from ipc import records as r

log = logging.getLogger("shoal.control")

ANSWER_TIMEOUT = 2.0  # longest wait for the workers' answers
CLIENT_TIMEOUT = 5.0  # a control client has this long to send its line and read the answer
REQUEST_LIMIT = 64 << 10


def default_control_path(port: int) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(
        tempfile.gettempdir(), f"shoal-{os.getuid()}")
    return os.path.join(base, f"shoal-{port}.sock")


def sweep_stale_sockets(directory: str) -> list[str]:
    """Remove the control sockets of brokers that died without cleaning up (SIGKILL): a
    ``shoal-*.sock`` nobody listens on any more. Returns what was removed."""
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not (name.startswith("shoal-") and name.endswith(".sock")):
                continue
            path = os.path.join(directory, name)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(path)
                except ConnectionRefusedError:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        removed.append(path)
                except OSError:
                    pass
    return removed


class ControlServer:
    """Answers control requests; ``ready_workers`` names the workers that are up."""

    def __init__(self, dispatcher: Dispatcher, ready_workers: Callable[[], list[int]],
                 flush: Callable[[], None], address: str) -> None:
        self._dispatcher = dispatcher
        self._ready_workers = ready_workers
        self._flush = flush
        self._address = address  # the AMQP listener, for each connection's name
        self._ids = itertools.count(1)
        self._made_directory = ""  # removed again at close when we made it and it is empty

    def bind(self, path: str) -> socket.socket:
        """The listening socket at ``path`` (a stale one left by a dead broker is replaced)."""
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700)
            self._made_directory = directory
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sweep_stale_sockets(directory)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(16)
        sock.setblocking(False)
        return sock

    def close(self, sock: socket.socket, path: str) -> None:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if self._made_directory:
            with contextlib.suppress(OSError):  # another broker's socket may be in it
                os.rmdir(self._made_directory)

    async def serve(self, sock: socket.socket) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        await trio.serve_listeners(self._client, [listener])

    async def _client(self, stream: trio.SocketStream) -> None:
        async with stream:
            with trio.move_on_after(CLIENT_TIMEOUT):
                data = b""
                while b"\n" not in data and len(data) < REQUEST_LIMIT:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    data += chunk
                try:
                    request = json.loads(data.partition(b"\n")[0] or b"null")
                    reply = await self.answer(request)
                except ValueError:
                    reply = {"error": "expected one JSON object on one line"}
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    # msgspec: fast for a snapshot of 10,000 queues, and an argument of a type
                    # JSON lacks (a field table's timestamp, bytes) does not fail the answer
                    await stream.send_all(msgspec.json.encode(reply, enc_hook=str) + b"\n")

    async def answer(self, request: Any) -> dict[str, Any]:
        command = request.get("command") if isinstance(request, dict) else None
        if command == "list_connections":
            return {"connections": await self.list_connections()}
        if command == "credit_flow":  # grants of publish credit held back, per connection
            return {"withheld": [{"worker": worker, "conn": conn, "grants": n} for (worker, conn), n
                                 in sorted(self._dispatcher.credit_withheld().items())]}
        if command == "snapshot":  # the management process's statistics (broker.runtime.snapshot)
            return await build_snapshot(self._dispatcher, trio.lowlevel.checkpoint)
        if command == "close_connection":
            return await self.close_connection(str(request.get("name", "")),
                                               str(request.get("reason") or "Closed via management plugin"))
        return {"error": f"unknown command {command!r}"}

    async def close_connection(self, name: str, reason: str) -> dict[str, Any]:
        """The connection named ``name`` gets 320 CONNECTION_FORCED from its worker."""
        for row in await self.list_connections():
            if row["name"] == name:
                self._dispatcher.outbox[row["worker"]].append(r.CloseConnection(row["conn"], reason))
                self._flush()
                return {"closed": name}
        return {"error": f"no connection {name!r}", "missing": True}

    async def list_connections(self) -> list[dict[str, Any]]:
        request = next(self._ids)
        answered = trio.Event()
        listing = self._dispatcher.list_connections(request, self._ready_workers(), answered.set)
        self._flush()
        with trio.move_on_after(ANSWER_TIMEOUT):
            await answered.wait()
        self._dispatcher.listings.pop(request, None)
        rows = []
        for worker, info in sorted(listing.rows, key=lambda item: (item[0], item[1].conn)):
            row = msgspec.structs.asdict(info)
            row["worker"] = worker
            row["name"] = f"{info.peer} -> {self._address}"
            rows.append(row)
        return rows
