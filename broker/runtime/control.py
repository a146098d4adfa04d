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

``shoal ctl`` (cli.ctl) and the management API's user endpoints send the rest:

* users (broker.runtime.users): ``list_users`` -> ``{"users": [{name, tags, password_hash,
  hashing_algorithm}]}``; ``add_user`` / ``put_user`` ``{name, password | password_hash
  [, hashing_algorithm], tags}``, ``change_password {name, password}``, ``set_user_tags {name, tags}``,
  ``delete_user {name}`` -> the user, or ``{"error", "code": missing | exists | invalid}``;
* ``purge_queue {name}`` -> ``{"purged": n}``; ``delete_queue {name, if_unused, if_empty}`` ->
  ``{"deleted": n}`` (a missing queue: ``{"error", "code": "missing"}``), as queue.purge and
  queue.delete of the queue's own connection would (an exclusive queue too);
* ``close_all_connections {reason, limit}`` -> ``{"closed": n}``;
* ``import_definitions {definitions}``: RabbitMQ's export JSON, through
  broker.runtime.definitions_io (users, permissions, topic permissions, policies, parameters,
  exchanges, queues, bindings of ``/``) -> ``{"imported", "unchanged", "skipped",
  "unsupported"}``;
* parameters (broker.runtime.parameters, dynamic shovels): ``set_parameter {vhost, component,
  name, value}``, ``clear_parameter {vhost, component, name}``, ``list_parameters {vhost?,
  component?}`` -> ``{"parameters": [...]}``, ``shovel_status`` -> ``{"shovels": [...]}``,
  ``federation_status`` -> ``{"links": [...]}``; ``federation_targets`` -> the federated
  exchanges and queues (broker.runtime.parameters);
* vhosts (broker.runtime.vhost_admin): ``add_vhost {name, description?, tags?}``,
  ``delete_vhost {name}``, ``list_vhosts {}``;
* ``purge_queue`` and ``delete_queue`` take ``vhost`` too ("/" when absent);
* ``status`` -> the supervisor's pid, listener, uptime, workers and object counts.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
import trio

from broker.errors import AMQPError
from broker.passwords import SHA256
from broker.runtime.definitions_io import DefinitionsError, Importer
from broker.runtime.dispatch import Dispatcher
from broker.runtime.limits import LIMIT_COMMANDS
from broker.runtime.parameters import PARAMETER_COMMANDS, RuntimeParameters, federation_targets
from broker.runtime.permissions import RuntimePermissions
from broker.runtime.policies import POLICY_COMMANDS, RuntimePolicies
from broker.runtime.snapshot import build_snapshot
from broker.runtime.users import RuntimeUsers, UserError, parse_tags
from broker.runtime.vhost_admin import VHOST_COMMANDS, RuntimeVhosts
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

    policies: RuntimePolicies | None = None  # set_policy and friends (the supervisor sets it)
    parameters: RuntimeParameters | None = None  # set_parameter (shovels; the supervisor sets it)
    vhosts: RuntimeVhosts | None = None  # add_vhost and friends (the supervisor sets it)

    def __init__(self, dispatcher: Dispatcher, ready_workers: Callable[[], list[int]],
                 flush: Callable[[], None], address: str, users: RuntimeUsers | None = None,
                 permissions: RuntimePermissions | None = None) -> None:
        self._dispatcher = dispatcher
        self._users = users
        self._permissions = permissions
        self._started = time.time()
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
        if command == "close_all_connections":
            return await self.close_all_connections(str(request.get("reason") or "Closed via shoal ctl"),
                                                    int(request.get("limit") or 0),
                                                    request.get("vhost"))
        if command in _USER_COMMANDS:
            return await self.user_command(command, request)
        if command in _PERMISSION_COMMANDS:
            return await self.permission_command(command, request)
        if command in POLICY_COMMANDS:
            if self.policies is None:
                return {"error": "this broker keeps no policies at runtime", "code": "invalid"}
            return self.policies.command(command, request)
        if command in LIMIT_COMMANDS:  # broker.runtime.limits
            return self._dispatcher.limits.command(command, request)
        if command == "federation_targets":  # the links process: what to federate
            return federation_targets(self._dispatcher.vhost)
        if command in PARAMETER_COMMANDS:
            if self.parameters is None:
                return {"error": "this broker keeps no parameters at runtime", "code": "invalid"}
            return await self.parameters.command(command, request)
        if command in VHOST_COMMANDS:
            if self.vhosts is None:
                return {"error": "this broker keeps no vhosts at runtime", "code": "invalid"}
            return await self.vhosts.command(command, request)
        if command in ("purge_queue", "delete_queue"):
            return self.queue_command(command, request)
        if command == "import_definitions":
            return await self.import_definitions(request.get("definitions"))
        if command == "status":
            return self.status()
        return {"error": f"unknown command {command!r}"}

    def status(self) -> dict[str, Any]:
        vhosts = self._dispatcher.vhosts
        return {"pid": os.getpid(), "listener": self._address, "started": self._started,
                "uptime": time.time() - self._started, "workers": self._ready_workers(),
                "worker_pids": self._dispatcher.worker_pids, "vhosts": len(vhosts),
                "queues": sum(len(v.queues) for v in vhosts),
                "exchanges": sum(len(v.exchanges) for v in vhosts),
                "users": len(self._users.table) if self._users is not None else None,
                "queued_messages": self._dispatcher.queued_messages()}

    async def user_command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        users = self._users
        if users is None:
            return {"error": "this broker keeps no users at runtime", "code": "invalid"}
        if command == "list_users":
            return {"users": users.listing()}
        name = str(request.get("name") or "")
        password = request.get("password")
        password = None if password is None else str(password)
        stored = request.get("password_hash")
        stored = None if stored is None else str(stored)
        algorithm = str(request.get("hashing_algorithm") or SHA256)
        tags = parse_tags(request["tags"]) if request.get("tags") is not None else None
        try:
            if command == "add_user":
                return await users.add(name, password, stored, tags, algorithm)
            if command == "put_user":
                return await users.put(name, password, stored, tags, algorithm)
            if command == "change_password":
                return await users.change_password(name, password or "")
            if command == "set_user_tags":
                return await users.set_tags(name, tags or [])
            deleted = await users.delete(name)
            if self._permissions is not None:
                self._permissions.forget(name)
            self._dispatcher.limits.forget_user(name)
            return deleted
        except UserError as exc:
            return {"error": str(exc), "code": exc.code}

    async def permission_command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        """broker.runtime.permissions: set/clear/list of permissions and topic permissions."""
        perms = self._permissions
        if perms is None:
            return {"error": "this broker keeps no permissions at runtime", "code": "invalid"}

        def arg(key: str) -> str | None:
            value = request.get(key)
            return None if value is None else str(value)

        user, vhost = arg("user"), arg("vhost")
        try:
            if command == "list_permissions":
                return {"permissions": perms.listing(user, vhost)}
            if command == "list_topic_permissions":
                return {"topic_permissions": perms.topic_listing(user, vhost)}
            if user is None:
                raise UserError("invalid", "a user is needed")
            vhost = vhost or "/"
            if command == "set_permissions":
                return await perms.set(user, vhost, arg("configure") or "", arg("write") or "",
                                       arg("read") or "")
            if command == "clear_permissions":
                return await perms.clear(user, vhost)
            if command == "set_topic_permissions":
                return await perms.set_topic(user, vhost, arg("exchange") or "",
                                             arg("write") or "", arg("read") or "")
            return await perms.clear_topic(user, vhost, arg("exchange"))
        except UserError as exc:
            return {"error": str(exc), "code": exc.code}

    def queue_command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        """purge_queue / delete_queue as the queue's own connection would (its owner's, for an
        exclusive one), in a batch of the dispatcher's own."""
        d = self._dispatcher
        name = str(request.get("name") or "")
        vhost_name = str(request.get("vhost") or "/")
        vhost = d.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if vhost is None or queue is None or queue.deleted:
            return {"error": f"no queue '{name}' in vhost '{vhost_name}'", "code": "missing"}
        d.begin_batch(time.monotonic())
        try:
            owner = queue.exclusive_owner
            if command == "purge_queue":
                return {"purged": vhost.purge_queue(name, owner=owner)}
            count, consumers = vhost.delete_queue(
                name, owner=owner, if_unused=bool(request.get("if_unused")),
                if_empty=bool(request.get("if_empty")))
            d._teardown.cancel_all(consumers)
            return {"deleted": count}
        except AMQPError as exc:
            return {"error": exc.reply_text, "code": "refused"}
        finally:
            d.end_batch()
            self._flush()

    async def close_all_connections(self, reason: str, limit: int,
                                    vhost: Any = None) -> dict[str, Any]:
        """Every connection (of ``vhost`` only, when given) gets 320 with ``reason``."""
        rows = [row for row in await self.list_connections() if vhost in (None, row.get("vhost"))]
        if limit > 0:
            rows = rows[:limit]
        for row in rows:
            self._dispatcher.outbox[row["worker"]].append(r.CloseConnection(row["conn"], reason))
        self._flush()
        return {"closed": len(rows)}

    async def import_definitions(self, body: Any,
                                 source: str = "import_definitions") -> dict[str, Any]:
        """RabbitMQ's definitions JSON, through the importer every import path shares
        (broker.runtime.definitions_io) -> its report, or ``{"error"}`` for a malformed one."""
        if "/" not in self._dispatcher.vhosts:  # the importer's objects go to "/"
            return {"error": "Virtual host '/' does not exist: nothing to import into",
                    "code": "invalid"}
        importer = Importer(self._dispatcher, self._flush, self._users, self._permissions,
                            self.policies, self.parameters)
        if self.vhosts is not None:  # the file's vhosts that are not here (definitions_io)
            importer.add_vhost = partial(self.vhosts.command, "add_vhost")
        try:
            report = await importer.run(body, source)
        except DefinitionsError as exc:
            return {"error": str(exc), "code": "invalid"}
        return report.as_json()

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
            row["open_channels"] = [msgspec.structs.asdict(ch) for ch in info.open_channels]
            row["worker"] = worker
            row["name"] = f"{info.peer} -> {self._address}"
            rows.append(row)
        return rows


_USER_COMMANDS = frozenset({"list_users", "add_user", "put_user", "change_password", "set_user_tags",
                            "delete_user"})
_PERMISSION_COMMANDS = frozenset({"list_permissions", "list_topic_permissions", "set_permissions",
                                  "clear_permissions", "set_topic_permissions",
                                  "clear_topic_permissions"})
