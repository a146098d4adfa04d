"""``shoal ctl``: rabbitmqctl's verbs, arguments and output, against a running Shoal.

Theory of operation
-------------------
Every verb is one or two requests to the supervisor's control socket
(``broker.runtime.control``), chosen with ``--port`` (the default socket of the broker on that
AMQP port) or ``--control-socket``. What comes back is printed as rabbitmqctl 3.10 prints it:
an informational line (``Listing queues for vhost / ...``; left out with ``-q``), then for a
listing the column names (left out with ``-s`` or ``--no-table-headers``) and tab-separated
rows, booleans as ``true``/``false``, argument tables as Erlang-ish ``[{"x-max-length",10}]``
and tags as ``[administrator]``; ``--formatter json`` prints the rows as rabbitmqctl's JSON
formatter does (one object per line inside ``[`` ``]``). The general options (``-q``, ``-s``,
``-p``, ``--formatter``, ``-t``, ``-n``) are taken before or after the verb, as rabbitmqctl
takes them.

Exit codes are rabbitmqctl's (sysexits): 64 a usage error, 65 bad data (no password given),
67 no such user, 69 the broker is unavailable (no answer) or the verb is not supported by this
Shoal yet, 70 any other failure (a user that already exists).

The pure parts (``format_*``, ``table``, ``json_rows``, the row builders) are what
``tests/cli/test_ctl.py`` checks; the integration tests drive the verbs against a broker.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import click

from broker.runtime.control import default_control_path
from cli.control import ask

EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE = 64, 65, 67, 69, 70
VHOST = "/"
FULL = ".*"  # every user may configure, write and read everything in "/" (no permissions yet)

# ------------------------------------------------------------------ formatting (pure)


def _field_type(value: Any) -> str:
    """The AMQP field type rabbitmqctl's JSON shows for an argument's value."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(1 << 31) <= value < (1 << 31) else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, (bytes, bytearray)):
        return "binary"
    return "longstr"


def _erlang(value: Any) -> str:
    """A value inside an argument table as rabbitmqctl's table formatter writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, dict):
        return format_arguments(value)
    if isinstance(value, list):
        return "[" + ",".join(_erlang(v) for v in value) + "]"
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    return json.dumps(str(value), ensure_ascii=False)


def format_arguments(arguments: dict[str, Any] | None) -> str:
    """``{"x-max-length": 10}`` -> ``[{"x-max-length",10}]``, as rabbitmqctl prints a table."""
    if not arguments:
        return "[]"
    return "[" + ",".join(f"{{{json.dumps(k, ensure_ascii=False)},{_erlang(v)}}}"
                          for k, v in arguments.items()) + "]"


def format_tags(tags: Sequence[str]) -> str:
    return "[" + ", ".join(tags) + "]"


def format_value(column: str, value: Any) -> str:
    """One cell of a table row."""
    if value is None:
        return ""
    if column == "tags":
        return format_tags(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict) or column == "arguments":
        return format_arguments(value or {})
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def json_value(column: str, value: Any) -> Any:
    """One field of a row as rabbitmqctl's JSON formatter writes it: an argument table as
    ``[[key, type, value], ...]``."""
    if column == "arguments" and isinstance(value, dict):
        return [[k, _field_type(v), v] for k, v in value.items()]
    return value


def table(columns: Sequence[str], rows: Iterable[dict[str, Any]], headers: bool = True) -> list[str]:
    """The column names (unless not ``headers``), then one tab-separated line per row."""
    lines = ["\t".join(columns)] if headers else []
    lines += ["\t".join(format_value(c, row.get(c)) for c in columns) for row in rows]
    return lines


def json_rows(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """rabbitmqctl's ``--formatter json`` for a listing: ``[``, one object a line (the later
    ones after a comma), ``]``."""
    items = [json.dumps({c: json_value(c, row.get(c)) for c in columns}, separators=(",", ":"),
                        ensure_ascii=False, default=str) for row in rows]
    body = "".join(("\n" if i == 0 else "\n,") + item for i, item in enumerate(items))
    return "[" + body + "\n]"


# ------------------------------------------------------------------ rows (pure)

QUEUE_COLUMNS = ("name", "durable", "auto_delete", "arguments", "messages", "messages_ready",
                 "messages_unacknowledged", "consumers", "exclusive", "state", "type", "policy",
                 "vhost", "messages_enqueued")
EXCHANGE_COLUMNS = ("name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                    "vhost")
BINDING_COLUMNS = ("source_name", "source_kind", "destination_name", "destination_kind",
                   "routing_key", "arguments", "vhost")
CONNECTION_COLUMNS = ("name", "user", "vhost", "state", "channels", "peer_host", "peer_port",
                      "recv_oct", "send_oct", "client", "connected_at", "worker", "protocol")
CHANNEL_COLUMNS = ("pid", "connection", "name", "number", "user", "vhost", "consumer_count",
                   "messages_unacknowledged")
CONSUMER_COLUMNS = ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                    "active", "arguments", "exclusive")
USER_COLUMNS = ("user", "tags")
VHOST_COLUMNS = ("name", "tracing", "description")
DEFAULTS = {
    "queues": ("name", "messages"),
    "exchanges": ("name", "type"),
    "bindings": ("source_name", "source_kind", "destination_name", "destination_kind",
                 "routing_key", "arguments"),
    "connections": ("user", "peer_host", "peer_port", "state"),
    "channels": ("pid", "user", "consumer_count", "messages_unacknowledged"),
    "consumers": ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count",
                  "active", "arguments"),
}


def queue_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The snapshot's queues (``broker.runtime.snapshot``) as rabbitmqctl's list_queues keys."""
    rows = []
    for q in snapshot.get("queues", ()):
        name, durable, auto_delete, owner, arguments, ready, unacked, consumers = q[:8]
        rows.append({"name": name, "durable": durable, "auto_delete": auto_delete,
                     "arguments": arguments or {}, "messages": ready + unacked,
                     "messages_ready": ready, "messages_unacknowledged": unacked,
                     "consumers": consumers, "exclusive": owner is not None, "state": "running",
                     "type": "classic", "policy": "", "vhost": snapshot.get("vhost", VHOST),
                     "messages_enqueued": q[8] if len(q) > 8 else None})
    return rows


def exchange_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": x[0], "type": x[1], "durable": x[2], "auto_delete": x[3], "internal": x[4],
             "arguments": x[5] or {}, "policy": "", "vhost": snapshot.get("vhost", VHOST)}
            for x in snapshot.get("exchanges", ())]


def binding_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The default exchange's binding of every queue first (the snapshot leaves them out), then
    the others, as rabbitmqctl lists them."""
    vhost = snapshot.get("vhost", VHOST)
    rows = [{"source_name": "", "source_kind": "exchange", "destination_name": q[0],
             "destination_kind": "queue", "routing_key": q[0], "arguments": {}, "vhost": vhost}
            for q in snapshot.get("queues", ())]
    rows += [{"source_name": b[0], "source_kind": "exchange", "destination_name": b[1],
              "destination_kind": b[2], "routing_key": b[3], "arguments": b[4] or {},
              "vhost": vhost} for b in snapshot.get("bindings", ())]
    return rows


def connection_rows(connections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for c in connections:
        host, _, port = str(c.get("peer", "")).rpartition(":")
        rows.append({**c, "peer_host": host, "peer_port": int(port) if port.isdigit() else port,
                     "protocol": "{0,9,1}"})
    return rows


def channel_pid(worker: int, conn: int, ch: int) -> str:
    """A channel's identifier in place of RabbitMQ's Erlang pid: <worker.connection.channel>."""
    return f"<shoal.{worker}.{conn}.{ch}>"


def channel_rows(snapshot: dict[str, Any], connections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The channels the supervisor keeps books for: those with a consumer or an unsettled
    delivery (``broker.runtime.snapshot``)."""
    by_key = {(c["worker"], c["conn"]): c for c in connections}
    rows = []
    for worker, conn, ch, consumers, unacked in snapshot.get("channels", ()):
        c = by_key.get((worker, conn), {})
        rows.append({"pid": channel_pid(worker, conn, ch), "connection": c.get("name", ""),
                     "name": f"{c.get('name', '')} ({ch})", "number": ch, "user": c.get("user", ""),
                     "vhost": c.get("vhost", VHOST), "consumer_count": consumers,
                     "messages_unacknowledged": unacked})
    return rows


def consumer_rows(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for queue, tag, worker, conn, ch, exclusive, ack_required, priority, active in \
            snapshot.get("consumers", ()):
        rows.append({"queue_name": queue, "channel_pid": channel_pid(worker, conn, ch),
                     "consumer_tag": tag, "ack_required": ack_required, "prefetch_count": None,
                     "active": active, "exclusive": exclusive,
                     "arguments": {"x-priority": priority} if priority else {}})
    return rows


def user_rows(users: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"user": u["name"], "tags": u["tags"]} for u in users]


def export_definitions(snapshot: dict[str, Any], users: list[dict[str, Any]],
                       version: str) -> dict[str, Any]:
    """RabbitMQ's definitions export (``rabbitmqctl export_definitions``) from a snapshot and the
    users: exclusive queues and the bindings to them, the default exchange and ``amq.*`` are left
    out, as RabbitMQ leaves them out."""
    vhost = snapshot.get("vhost", VHOST)
    exclusive = {q[0] for q in snapshot.get("queues", ()) if q[3] is not None}
    return {
        "bindings": [{"arguments": b[4] or {}, "destination": b[1], "destination_type": b[2],
                      "routing_key": b[3], "source": b[0], "vhost": vhost}
                     for b in snapshot.get("bindings", ())
                     if b[0] and not (b[2] == "queue" and b[1] in exclusive)],
        "exchanges": [{"arguments": x[5] or {}, "auto_delete": x[3], "durable": x[2],
                       "internal": x[4], "name": x[0], "type": x[1], "vhost": vhost}
                      for x in snapshot.get("exchanges", ())
                      if x[0] and not str(x[0]).startswith("amq.")],
        "global_parameters": [],
        "parameters": [],
        "permissions": [{"configure": FULL, "read": FULL, "user": u["name"], "vhost": vhost,
                         "write": FULL} for u in users],
        "policies": list((snapshot.get("policies") or {}).get("policies", [])),
        "queues": [{"arguments": q[4] or {}, "auto_delete": q[2], "durable": q[1], "name": q[0],
                    "type": "classic", "vhost": vhost}
                   for q in snapshot.get("queues", ()) if q[3] is None],
        "rabbit_version": version,
        "rabbitmq_version": version,
        "topic_permissions": [],
        "users": [{"hashing_algorithm": u.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
                   "limits": {}, "name": u["name"], "password_hash": u["password_hash"],
                   "tags": u["tags"]} for u in users],
        "vhosts": [{"limits": [], "metadata": {"description": "Default virtual host", "tags": []},
                    "name": vhost}],
    }


def check_columns(columns: Sequence[str], known: Sequence[str], given: Sequence[str]) -> None:
    """rabbitmqctl's refusal of unknown info keys (exit 64)."""
    unknown = [c for c in given if c not in known]
    if unknown:
        fail(f"Error (argument validation): Info key(s) {','.join(unknown)} are not supported",
             EX_USAGE)


# ------------------------------------------------------------------ plumbing


def fail(message: str, code: int) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(code)


def not_supported(verb: str) -> NoReturn:
    fail(f"{verb}: not supported by this Shoal yet", EX_UNAVAILABLE)


class Options:
    """The general options, given before or after the verb."""

    def __init__(self) -> None:
        self.port = 5672
        self.control: str | None = None
        self.quiet = False
        self.silent = False
        self.no_headers = False
        self.formatter = "table"
        self.vhost = VHOST
        self.timeout = 60.0

    @property
    def path(self) -> str:
        return self.control or default_control_path(self.port)


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """The general options on a verb (None: as given before the verb, or the default)."""
    options = [
        click.option("--port", type=click.IntRange(1, 65535), default=None,
                     help="The broker's AMQP port (names its default control socket)."),
        click.option("--control-socket", "--control", "control", default=None,
                     type=click.Path(dir_okay=False), help="The broker's control socket."),
        click.option("-q", "--quiet", is_flag=True, default=None,
                     help="No informational lines."),
        click.option("-s", "--silent", is_flag=True, default=None,
                     help="No informational lines, no table headers."),
        click.option("--no-table-headers", "no_headers", is_flag=True, default=None,
                     help="No column names."),
        click.option("--formatter", type=click.Choice(["table", "json"]), default=None,
                     help="table (tab-separated, the default) or json."),
        click.option("-p", "--vhost", default=None, help='The virtual host (Shoal has "/").'),
        click.option("-t", "--timeout", type=float, default=None, help="Seconds to wait."),
        click.option("-n", "--node", default=None, hidden=True,
                     help="Accepted for rabbitmqctl's sake; --port or --control-socket choose."),
        click.option("-l", "--longnames", is_flag=True, default=None, hidden=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _options(ctx: click.Context, given: dict[str, Any]) -> Options:
    opts: Options = ctx.find_object(Options) or Options()
    for key in ("port", "control", "quiet", "silent", "no_headers", "formatter", "vhost", "timeout"):
        value = given.pop(key, None)
        if value is not None and value is not False:
            setattr(opts, key, value)
    given.pop("node", None)
    given.pop("longnames", None)
    if opts.silent:
        opts.quiet = opts.no_headers = True
    return opts


def request(opts: Options, command: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    """One control request; no answer is rabbitmqctl's 'unable to perform an operation' (69)."""
    try:
        answer = ask(opts.path, command, timeout=timeout or max(opts.timeout, 1.0))
    except (OSError, ValueError) as exc:
        fail(f"Error: unable to perform an operation on the broker: no Shoal answers on "
             f"{opts.path} ({exc}). Is it running? (--port or --control-socket name it)",
             EX_UNAVAILABLE)
    return answer


def info(opts: Options, line: str) -> None:
    if not opts.quiet and opts.formatter != "json":
        click.echo(line)


def error(message: str, code: int) -> NoReturn:
    fail(f"Error:\n{message}", code)


def emit(opts: Options, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    if opts.formatter == "json":
        click.echo(json_rows(columns, rows))
    else:
        for line in table(columns, rows, headers=not opts.no_headers):
            click.echo(line)


class CtlUsageError(click.UsageError):
    exit_code = EX_USAGE


class CtlCommand(click.Command):
    """A verb: a usage error exits 64, as rabbitmqctl's argument validation."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise CtlUsageError(exc.message, exc.ctx) from None


class CtlGroup(click.Group):
    """rabbitmqctl's answer to an unknown verb: ``Command 'X' not found.``, exit 64."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise CtlUsageError(exc.message, exc.ctx) from None

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        name = args[0] if args else ""
        if name and self.get_command(ctx, name) is None and not name.startswith("-"):
            fail(f"Command '{name}' not found. \nUse 'shoal ctl --help' to list the verbs", EX_USAGE)
        return super().resolve_command(ctx, args)


@click.group("ctl", cls=CtlGroup)
@_common
@click.pass_context
def ctl(ctx: click.Context, **given: Any) -> None:
    """rabbitmqctl's verbs against a running Shoal (over its control socket): the same
    arguments, and the same tab-separated or JSON output."""
    opts = Options()
    ctx.obj = opts
    _options(ctx, given)


def verb(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """A ``shoal ctl`` verb with the general options; the function gets ``opts`` first."""
    def wrap(f: Callable[..., Any]) -> click.Command:
        @click.pass_context
        def run(ctx: click.Context, **given: Any) -> Any:
            opts = _options(ctx, given)
            return f(opts, **given)
        run.__doc__ = f.__doc__
        run.__name__ = f.__name__
        run.__click_params__ = list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
        return ctl.command(name, cls=CtlCommand, **kwargs)(_common(run))
    return wrap


def _columns(opts: Options, kind: str, known: Sequence[str], given: tuple[str, ...]) -> list[str]:
    # rabbitmqctl takes columns as separate arguments or comma-separated
    columns = [c for arg in given for c in arg.split(",") if c] or list(DEFAULTS[kind])
    check_columns(columns, known, columns)
    return columns


def _snapshot(opts: Options) -> dict[str, Any]:
    answer = request(opts, {"command": "snapshot"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    if opts.vhost != answer.get("vhost", VHOST):  # a vhost Shoal does not have: nothing in it
        return {"vhost": opts.vhost}
    return answer


def _connections(opts: Options) -> list[dict[str, Any]]:
    answer = request(opts, {"command": "list_connections"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    rows: list[dict[str, Any]] = answer["connections"]
    return rows


def _users(opts: Options) -> list[dict[str, Any]]:
    answer = request(opts, {"command": "list_users"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    users: list[dict[str, Any]] = answer["users"]
    return users


# ------------------------------------------------------------------ listings


@verb("list_queues")
@click.argument("columns", nargs=-1)
@click.option("--online", is_flag=True, hidden=True)
@click.option("--offline", is_flag=True, hidden=True)
@click.option("--local", is_flag=True, hidden=True)
def list_queues(opts: Options, columns: tuple[str, ...], **_: Any) -> None:
    """Queues and their properties: name messages messages_ready messages_unacknowledged
    consumers durable auto_delete arguments exclusive state type policy vhost."""
    cols = _columns(opts, "queues", QUEUE_COLUMNS, columns)
    info(opts, f"Timeout: {opts.timeout:.1f} seconds ...")
    info(opts, f"Listing queues for vhost {opts.vhost} ...")
    emit(opts, cols, queue_rows(_snapshot(opts)))


@verb("list_exchanges")
@click.argument("columns", nargs=-1)
def list_exchanges(opts: Options, columns: tuple[str, ...]) -> None:
    """Exchanges: name type durable auto_delete internal arguments policy vhost."""
    cols = _columns(opts, "exchanges", EXCHANGE_COLUMNS, columns)
    info(opts, f"Listing exchanges for vhost {opts.vhost} ...")
    emit(opts, cols, exchange_rows(_snapshot(opts)))


@verb("list_bindings")
@click.argument("columns", nargs=-1)
def list_bindings(opts: Options, columns: tuple[str, ...]) -> None:
    """Bindings: source_name source_kind destination_name destination_kind routing_key arguments."""
    cols = _columns(opts, "bindings", BINDING_COLUMNS, columns)
    info(opts, f"Listing bindings for vhost {opts.vhost}...")
    emit(opts, cols, binding_rows(_snapshot(opts)))


@verb("list_connections")
@click.argument("columns", nargs=-1)
def list_connections(opts: Options, columns: tuple[str, ...]) -> None:
    """Client connections: name user vhost state channels peer_host peer_port recv_oct send_oct
    client connected_at worker protocol (state: running, flow, blocking, blocked, closing)."""
    cols = _columns(opts, "connections", CONNECTION_COLUMNS, columns)
    info(opts, "Listing connections ...")
    emit(opts, cols, connection_rows(_connections(opts)))


@verb("list_channels")
@click.argument("columns", nargs=-1)
def list_channels(opts: Options, columns: tuple[str, ...]) -> None:
    """Channels with a consumer or unacknowledged deliveries: pid connection name number user
    vhost consumer_count messages_unacknowledged."""
    cols = _columns(opts, "channels", CHANNEL_COLUMNS, columns)
    info(opts, "Listing channels ...")
    snapshot = _snapshot(opts)
    emit(opts, cols, channel_rows(snapshot, _connections(opts)) if snapshot.get("channels") else [])


@verb("list_consumers")
@click.argument("columns", nargs=-1)
def list_consumers(opts: Options, columns: tuple[str, ...]) -> None:
    """Consumers: queue_name channel_pid consumer_tag ack_required prefetch_count active
    arguments exclusive."""
    cols = _columns(opts, "consumers", CONSUMER_COLUMNS, columns)
    info(opts, f"Listing consumers in vhost {opts.vhost} ...")
    emit(opts, cols, consumer_rows(_snapshot(opts)))


@verb("list_users")
def list_users(opts: Options) -> None:
    """Users and their tags."""
    info(opts, "Listing users ...")
    emit(opts, USER_COLUMNS, user_rows(_users(opts)))


@verb("list_vhosts")
@click.argument("columns", nargs=-1)
def list_vhosts(opts: Options, columns: tuple[str, ...]) -> None:
    """Virtual hosts: Shoal has one, "/"."""
    cols = [c for arg in columns for c in arg.split(",") if c] or ["name"]
    check_columns(cols, VHOST_COLUMNS, cols)
    info(opts, "Listing vhosts ...")
    emit(opts, cols, [{"name": VHOST, "tracing": False, "description": "Default virtual host"}])


def _permissions_answer(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        code = {"missing": EX_NOUSER}.get(str(answer.get("code")), EX_SOFTWARE)
        error(str(answer["error"]), code)
    return answer


@verb("list_permissions")
def list_permissions(opts: Options) -> None:
    """The users' permissions on the vhost (-p, default "/")."""
    info(opts, f'Listing permissions for vhost "{opts.vhost}" ...')
    rows = _permissions_answer(request(opts, {"command": "list_permissions",
                                              "vhost": opts.vhost}))["permissions"]
    emit(opts, ("user", "configure", "write", "read"), rows)


@verb("list_user_permissions")
@click.argument("username")
def list_user_permissions(opts: Options, username: str) -> None:
    """The permissions of one user, per vhost."""
    info(opts, f'Listing permissions for user "{username}" ...')
    answer = request(opts, {"command": "list_permissions", "user": username})
    if "error" in answer and answer.get("code") == "missing":
        error(f'{{:no_such_user, "{username}"}}', EX_UNAVAILABLE)
    emit(opts, ("vhost", "configure", "write", "read"), _permissions_answer(answer)["permissions"])


@verb("set_permissions")
@click.argument("username")
@click.argument("conf")
@click.argument("write")
@click.argument("read")
def set_permissions(opts: Options, username: str, conf: str, write: str, read: str) -> None:
    """Set a user's configure, write and read regular expressions on the vhost (-p)."""
    info(opts, f'Setting permissions for user "{username}" in vhost "{opts.vhost}" ...')
    _permissions_answer(request(opts, {"command": "set_permissions", "user": username,
                                       "vhost": opts.vhost, "configure": conf, "write": write,
                                       "read": read}))


@verb("clear_permissions")
@click.argument("username")
def clear_permissions(opts: Options, username: str) -> None:
    """Remove a user's permissions on the vhost (-p): its connections there are refused."""
    info(opts, f'Clearing permissions for user "{username}" in vhost "{opts.vhost}" ...')
    _permissions_answer(request(opts, {"command": "clear_permissions", "user": username,
                                       "vhost": opts.vhost}))


@verb("set_topic_permissions")
@click.argument("username")
@click.argument("exchange")
@click.argument("write")
@click.argument("read")
def set_topic_permissions(opts: Options, username: str, exchange: str, write: str,
                          read: str) -> None:
    """Set a user's write and read regular expressions for the routing keys of a topic exchange."""
    info(opts, f'Setting topic permissions on "{exchange}" for user "{username}" in vhost '
               f'"{opts.vhost}" ...')
    _permissions_answer(request(opts, {"command": "set_topic_permissions", "user": username,
                                       "vhost": opts.vhost, "exchange": exchange, "write": write,
                                       "read": read}))


@verb("clear_topic_permissions")
@click.argument("username")
@click.argument("exchange", required=False)
def clear_topic_permissions(opts: Options, username: str, exchange: str | None) -> None:
    """Remove a user's topic permissions on one exchange, or on all of the vhost's."""
    info(opts, f'Clearing topic permissions for user "{username}" in vhost "{opts.vhost}" ...')
    _permissions_answer(request(opts, {"command": "clear_topic_permissions", "user": username,
                                       "vhost": opts.vhost, "exchange": exchange}))


@verb("list_topic_permissions")
def list_topic_permissions(opts: Options) -> None:
    """The users' topic permissions on the vhost (-p)."""
    info(opts, f'Listing topic permissions for vhost "{opts.vhost}" ...')
    rows = _permissions_answer(request(opts, {"command": "list_topic_permissions",
                                              "vhost": opts.vhost}))["topic_permissions"]
    emit(opts, ("user", "exchange", "write", "read"), rows)


@verb("list_user_topic_permissions")
@click.argument("username")
def list_user_topic_permissions(opts: Options, username: str) -> None:
    """The topic permissions of one user."""
    info(opts, f'Listing topic permissions for user "{username}" ...')
    rows = _permissions_answer(request(opts, {"command": "list_topic_permissions",
                                              "user": username}))["topic_permissions"]
    emit(opts, ("vhost", "exchange", "write", "read"), rows)


# ------------------------------------------------------------------ users


def _password(opts: Options, given: str | None) -> str:
    """The password argument, else one line of stdin (hidden at a terminal), as rabbitmqctl."""
    if given is not None:
        return given
    if sys.stdin.isatty():
        return str(click.prompt("Password", hide_input=True, default="", show_default=False))
    if not opts.quiet:
        click.echo("Password: ")
    line = sys.stdin.readline()
    if not line:
        error("Password is not provided via argument or stdin", EX_DATAERR)
    return line.rstrip("\r\n")


def _user_answer(answer: dict[str, Any]) -> None:
    if "error" in answer:
        code = {"missing": EX_NOUSER, "exists": EX_SOFTWARE}.get(str(answer.get("code")), EX_SOFTWARE)
        error(str(answer["error"]), code)


@verb("add_user")
@click.argument("username")
@click.argument("password", required=False)
@click.option("--pre-hashed-password", "pre_hashed", is_flag=True,
              help="PASSWORD is a stored password (rabbit_password_hashing_sha256).")
def add_user(opts: Options, username: str, password: str | None, pre_hashed: bool) -> None:
    """Add a user with no tags; the password is read from stdin when not given."""
    info(opts, f'Adding user "{username}" ...')
    secret = _password(opts, password)
    command: dict[str, Any] = {"command": "add_user", "name": username}
    command["password_hash" if pre_hashed else "password"] = secret
    _user_answer(request(opts, command))
    info(opts, "Done. Don't forget to grant the user permissions to some virtual hosts! See "
               "'rabbitmqctl help set_permissions' to learn more.")


@verb("delete_user")
@click.argument("username")
def delete_user(opts: Options, username: str) -> None:
    """Delete a user; its open connections are closed (320 CONNECTION_FORCED)."""
    info(opts, f'Deleting user "{username}" ...')
    _user_answer(request(opts, {"command": "delete_user", "name": username}))


@verb("change_password")
@click.argument("username")
@click.argument("password", required=False)
def change_password(opts: Options, username: str, password: str | None) -> None:
    """Give a user a new password (read from stdin when not given)."""
    info(opts, f'Changing password for user "{username}" ...')
    secret = _password(opts, password)
    _user_answer(request(opts, {"command": "change_password", "name": username, "password": secret}))


@verb("set_user_tags")
@click.argument("username")
@click.argument("tags", nargs=-1)
def set_user_tags(opts: Options, username: str, tags: tuple[str, ...]) -> None:
    """Set a user's tags (none: remove them all)."""
    info(opts, f'Setting tags for user "{username}" to {format_tags(tags)} ...')
    _user_answer(request(opts, {"command": "set_user_tags", "name": username, "tags": list(tags)}))


# ------------------------------------------------------------------ queues, connections


@verb("purge_queue")
@click.argument("queue")
def purge_queue(opts: Options, queue: str) -> None:
    """Remove the ready messages of a queue."""
    info(opts, f"Purging queue '{queue}' in vhost '{opts.vhost}' ...")
    if opts.vhost != VHOST:
        error("not_found", EX_UNAVAILABLE)
    answer = request(opts, {"command": "purge_queue", "name": queue})
    if "error" in answer:
        error("not_found" if answer.get("code") == "missing" else str(answer["error"]),
              EX_UNAVAILABLE)


@verb("delete_queue")
@click.argument("queue")
@click.option("-u", "--if-unused", is_flag=True, help="Only if the queue has no consumers.")
@click.option("-e", "--if-empty", is_flag=True, help="Only if the queue is empty.")
def delete_queue(opts: Options, queue: str, if_unused: bool, if_empty: bool) -> None:
    """Delete a queue."""
    info(opts, f"Deleting queue '{queue}' on vhost '{opts.vhost}' ...")
    if opts.vhost != VHOST:
        error("Queue not found", EX_USAGE)
    answer = request(opts, {"command": "delete_queue", "name": queue, "if_unused": if_unused,
                            "if_empty": if_empty})
    if "error" in answer:
        if answer.get("code") == "missing":
            error("Queue not found", EX_USAGE)
        error(str(answer["error"]), EX_SOFTWARE)
    info(opts, f"Queue was successfully deleted with {answer['deleted']} ready messages")


@verb("close_connection")
@click.argument("connection")
@click.argument("explanation")
def close_connection(opts: Options, connection: str, explanation: str) -> None:
    """Close a connection (its name in list_connections, in place of RabbitMQ's Erlang pid) with
    320 CONNECTION_FORCED and EXPLANATION."""
    info(opts, f"Closing connection {connection}, reason: {explanation}...")
    answer = request(opts, {"command": "close_connection", "name": connection,
                            "reason": explanation})
    if "error" in answer:
        error(str(answer["error"]), EX_UNAVAILABLE)


@verb("close_all_connections")
@click.argument("explanation")
@click.option("--limit", type=int, default=0, help="Close at most this many.")
@click.option("--global", "global_", is_flag=True, help="Every virtual host (Shoal has one).")
@click.option("--per-connection-delay", type=int, default=0, hidden=True)
def close_all_connections(opts: Options, explanation: str, limit: int, global_: bool,
                          per_connection_delay: int) -> None:
    """Close every client connection with 320 CONNECTION_FORCED and EXPLANATION."""
    where = "on node" if global_ else f"in vhost {opts.vhost}"
    info(opts, f"Closing all connections {where}, reason: {explanation}...")
    if opts.vhost != VHOST and not global_:
        info(opts, "Closed 0 connections")
        return
    answer = request(opts, {"command": "close_all_connections", "reason": explanation,
                            "limit": limit})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    info(opts, f"Closed {answer['closed']} connections")


# ------------------------------------------------------------------ definitions, node


def _version() -> str:
    from broker.runtime.management_child import shoal_version

    return shoal_version()


@verb("export_definitions")
@click.argument("path")
@click.option("--format", "format_", type=click.Choice(["json"]), default="json")
def export_definitions_cmd(opts: Options, path: str, format_: str) -> None:
    """Write the definitions (users, exchanges, queues, bindings, ...) as RabbitMQ's JSON to
    PATH, or to stdout for -."""
    definitions = export_definitions(_snapshot(opts), _users(opts), _version())
    text = json.dumps(definitions, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                      default=str)
    if path == "-":
        click.echo(text)
        return
    info(opts, f'Exporting definitions in JSON to a file at "{path}" ...')
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


@verb("import_definitions")
@click.argument("path", required=False, default="-")
@click.option("--format", "format_", type=click.Choice(["json"]), default="json")
@click.option("--skip-if-unchanged", is_flag=True, hidden=True)
def import_definitions_cmd(opts: Options, path: str, format_: str, skip_if_unchanged: bool) -> None:
    """Import RabbitMQ's definitions JSON from PATH (or stdin for - or none): users, exchanges,
    queues and bindings of "/"; what else it holds is named on stderr and skipped."""
    if path == "-":
        info(opts, "Importing definitions in JSON from standard input ...")
        raw = sys.stdin.read()
    else:
        info(opts, f'Importing definitions in JSON from a file at "{path}" ...')
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except OSError as exc:
            error(f"{path}: {exc.strerror}", EX_DATAERR)
    try:
        body = json.loads(raw)
    except ValueError as exc:
        error(f"not valid JSON: {exc}", EX_DATAERR)
    answer = request(opts, {"command": "import_definitions", "definitions": body})
    if "error" in answer:
        error(str(answer["error"]), EX_DATAERR)
    for line in answer.get("skipped", ()):
        click.echo(f"skipped: {line}", err=True)
    for kind in ("vhosts", "permissions", "topic_permissions", "policies", "parameters",
                 "global_parameters"):
        extra = [i for i in body.get(kind) or [] if kind not in ("vhosts",) or
                 (isinstance(i, dict) and i.get("name") != VHOST)]
        if extra and kind != "permissions":
            click.echo(f"skipped: {len(extra)} {kind}: not supported by this Shoal yet", err=True)
    n = answer["imported"]
    info(opts, f"Imported {n['users']} users, {n['exchanges']} exchanges, {n['queues']} queues, "
               f"{n['bindings']} bindings.")


@verb("await_startup")
def await_startup(opts: Options) -> None:
    """Wait (up to --timeout, default 300 s here as in rabbitmqctl) until the broker answers."""
    limit = time.monotonic() + (opts.timeout if opts.timeout != 60.0 else 300.0)
    while True:
        try:
            if "pid" in ask(opts.path, {"command": "status"}, timeout=2.0):
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() >= limit:
            fail(f"Error: the broker on {opts.path} did not start in time", EX_UNAVAILABLE)
        time.sleep(0.2)


def node_name() -> str:
    return f"shoal@{socket.gethostname().split('.')[0]}"


@verb("status")
def status(opts: Options) -> None:
    """The broker's process, listener, workers, alarms and totals."""
    answer = request(opts, {"command": "status"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    snapshot = request(opts, {"command": "snapshot"})
    alarms = snapshot.get("alarms", {})
    alarm_lines = ([f"Memory alarm on worker {k}" for k in alarms.get("memory", ())]
                   + (["Free disk space alarm"] if alarms.get("disk") else [])
                   + (["Queued messages alarm"] if alarms.get("queued") else []))
    connections = len(_connections(opts))
    data = {"pid": answer["pid"], "os": os.uname().sysname, "uptime": int(answer["uptime"]),
            "version": _version(), "node": node_name(), "listener": answer["listener"],
            "control_socket": opts.path, "worker_pids": answer["worker_pids"],
            "workers_up": answer["workers"], "alarms": alarm_lines,
            "totals": {"connections": connections, "queues": answer["queues"],
                       "exchanges": answer["exchanges"], "users": answer["users"],
                       "queued_messages": answer["queued_messages"]}}
    if opts.formatter == "json":
        click.echo(json.dumps(data, separators=(",", ":")))
        return
    info(opts, f"Status of node {data['node']} ...")
    lines = ["Runtime", "", f"OS PID: {data['pid']}", f"OS: {data['os']}",
             f"Uptime (seconds): {data['uptime']}", f"Shoal version: {data['version']}",
             f"Node name: {data['node']}", "", "Listeners", "",
             f"Interface: {answer['listener']}, protocol: amqp, purpose: AMQP 0-9-1",
             f"Control socket: {opts.path}", "", "Workers", "",
             *[f"worker {k}: pid {pid}{'' if k in answer['workers'] else ' (starting)'}"
               for k, pid in enumerate(answer["worker_pids"])],
             "", "Alarms", "", *(alarm_lines or ["(none)"]), "", "Totals", "",
             *[f"{k.replace('_', ' ').capitalize()}: {v}" for k, v in data["totals"].items()]]
    for line in lines:
        click.echo(line)


# ------------------------------------------------------------------ policies

POLICY_COLUMNS = ("vhost", "name", "pattern", "apply-to", "definition", "priority")


def _policy_answer(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        error(str(answer["error"]).rstrip("\n"), EX_SOFTWARE)
    return answer


def _set_policy(opts: Options, operator: bool, name: str, pattern: str, definition: str,
                priority: int, apply_to: str) -> None:
    kind = "operator policy" if operator else "policy"
    info(opts, f'Setting {kind} "{name}" for pattern "{pattern}" to "{definition}" with priority '
               f'"{priority}" for vhost "{opts.vhost}" ...')
    try:
        parsed = json.loads(definition)
    except ValueError as exc:
        error(f"Could not parse JSON document: {exc}", EX_DATAERR)
    _policy_answer(request(opts, {
        "command": "set_operator_policy" if operator else "set_policy", "vhost": opts.vhost,
        "name": name, "pattern": pattern, "definition": parsed, "priority": priority,
        "apply-to": apply_to}))


@verb("set_policy")
@click.option("--priority", type=int, default=0, help="Higher wins among matching policies.")
@click.option("--apply-to", "apply_to", default="all", help="queues, exchanges or all.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_policy(opts: Options, priority: int, apply_to: str, name: str, pattern: str,
               definition: str) -> None:
    """Set a policy: DEFINITION (JSON) for the queues and exchanges whose name PATTERN matches."""
    _set_policy(opts, False, name, pattern, definition, priority, apply_to)


@verb("set_operator_policy")
@click.option("--priority", type=int, default=0, help="Higher wins among matching policies.")
@click.option("--apply-to", "apply_to", default="all", help="queues, exchanges or all.")
@click.argument("name")
@click.argument("pattern")
@click.argument("definition")
def set_operator_policy(opts: Options, priority: int, apply_to: str, name: str, pattern: str,
                        definition: str) -> None:
    """Set an operator policy: caps on the numeric limits (the smaller value wins)."""
    _set_policy(opts, True, name, pattern, definition, priority, apply_to)


@verb("clear_policy")
@click.argument("name")
def clear_policy(opts: Options, name: str) -> None:
    """Remove a policy: its queues and exchanges go back to their own arguments."""
    info(opts, f'Clearing policy "{name}" on vhost "{opts.vhost}" ...')
    _policy_answer(request(opts, {"command": "clear_policy", "vhost": opts.vhost, "name": name}))


@verb("clear_operator_policy")
@click.argument("name")
def clear_operator_policy(opts: Options, name: str) -> None:
    """Remove an operator policy."""
    info(opts, f'Clearing operator policy "{name}" on vhost "{opts.vhost}" ...')
    _policy_answer(request(opts, {"command": "clear_operator_policy", "vhost": opts.vhost,
                                  "name": name}))


def _list_policies(opts: Options, operator: bool) -> None:
    info(opts, f'Listing {"operator policy overrides" if operator else "policies"} for vhost '
               f'"{opts.vhost}" ...')
    answer = _policy_answer(request(opts, {
        "command": "list_operator_policies" if operator else "list_policies", "vhost": opts.vhost}))
    emit(opts, POLICY_COLUMNS, list(answer.get("policies", [])))


@verb("list_policies")
def list_policies(opts: Options) -> None:
    """The policies: vhost name pattern apply-to definition priority."""
    _list_policies(opts, False)


@verb("list_operator_policies")
def list_operator_policies(opts: Options) -> None:
    """The operator policies: vhost name pattern apply-to definition priority."""
    _list_policies(opts, True)


# ------------------------------------------------------------------ not yet

UNSUPPORTED = ("add_vhost", "delete_vhost", "set_vhost_limits", "clear_vhost_limits",
               "list_vhost_limits", "set_vhost_tags", "restart_vhost", "set_policy",
               "clear_policy", "list_policies", "set_operator_policy", "clear_operator_policy",
               "list_operator_policies", "set_parameter", "clear_parameter", "list_parameters",
               "set_global_parameter", "clear_global_parameter", "list_global_parameters",
               "set_user_limits", "clear_user_limits", "list_user_limits", "clear_password",
               "trace_on", "trace_off")


def _unsupported(name: str) -> click.Command:
    @click.command(name, context_settings={"ignore_unknown_options": True},
                   help="Not supported by this Shoal yet.", add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        not_supported(name)
    return command


for _name in UNSUPPORTED:
    if _name not in ctl.commands:  # a verb served since (the policies) keeps its command
        ctl.add_command(_unsupported(_name))
