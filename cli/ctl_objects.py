"""``shoal ctl``'s verbs on objects and the node: purge_queue, delete_queue, close_connection,
close_all_connections, export_definitions, import_definitions, await_startup, status."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import click

from broker.limits import export_limits
from cli.control import ask
from cli.ctl_format import export_definitions
from cli.ctl_group import (
    EX_DATAERR,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    EX_USAGE,
    Options,
    error,
    fail,
    fetch_connections,
    fetch_snapshot,
    fetch_users,
    info,
    request,
    verb,
)

# ------------------------------------------------------------------ queues, connections


@verb("purge_queue")
@click.argument("queue")
def purge_queue(opts: Options, queue: str) -> None:
    """Remove the ready messages of a queue."""
    info(opts, f"Purging queue '{queue}' in vhost '{opts.vhost}' ...")
    answer = request(opts, {"command": "purge_queue", "name": queue, "vhost": opts.vhost})
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
    answer = request(opts, {"command": "delete_queue", "name": queue, "if_unused": if_unused,
                            "if_empty": if_empty, "vhost": opts.vhost})
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
    answer = request(opts, {"command": "close_all_connections", "reason": explanation,
                            "limit": limit, "vhost": None if global_ else opts.vhost})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    info(opts, f"Closed {answer['closed']} connections")


# ------------------------------------------------------------------ vhosts


def _vhost_answer(answer: dict[str, Any]) -> None:
    if "error" in answer:  # rabbitmqctl: a vhost that does not exist is exit 65
        error(str(answer["error"]), EX_DATAERR if answer.get("code") == "missing" else EX_SOFTWARE)


@verb("add_vhost")
@click.argument("name")
@click.option("--description", default="", help="What the vhost is for.")
@click.option("--tags", default=None, help="Comma-separated tags.")
@click.option("--default-queue-type", default="",
              help="Recorded and listed; every queue here is classic.")
def add_vhost(opts: Options, name: str, description: str, tags: str | None,
              default_queue_type: str) -> None:
    """Create a virtual host (nobody has permissions on it yet: see set_permissions -p)."""
    info(opts, f'Adding vhost "{name}" ...')
    command: dict[str, Any] = {"command": "add_vhost", "name": name, "description": description,
                               "default_queue_type": default_queue_type}
    if tags is not None:
        command["tags"] = tags
    _vhost_answer(request(opts, command))


@verb("delete_vhost")
@click.argument("name")
def delete_vhost(opts: Options, name: str) -> None:
    """Delete a virtual host and everything in it; its connections are closed (320)."""
    info(opts, f'Deleting vhost "{name}" ...')
    _vhost_answer(request(opts, {"command": "delete_vhost", "name": name}))


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
    perms = request(opts, {"command": "list_permissions"})
    topics = request(opts, {"command": "list_topic_permissions"})
    definitions = export_definitions(
        fetch_snapshot(opts, every_vhost=True), fetch_users(opts), _version(),
        perms.get("permissions") if "error" not in perms else None,
        topics.get("topic_permissions") if "error" not in topics else None)
    params = request(opts, {"command": "list_parameters"})  # shovels (broker.runtime.parameters)
    if "error" not in params:
        definitions["parameters"] = list(params.get("parameters") or [])
    vhost_limits = request(opts, {"command": "list_vhost_limits"})  # broker.runtime.limits
    user_limits = request(opts, {"command": "list_user_limits"})
    if "error" not in vhost_limits and "error" not in user_limits:
        export_limits(definitions, vhost_limits["limits"], user_limits["limits"])
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
    """Import RabbitMQ's definitions JSON from PATH (or stdin for - or none): users,
    permissions, topic permissions, policies, exchanges, queues and bindings of "/" (the
    supervisor's importer, broker.runtime.definitions_io); what it does not support or refuses
    is named on stderr."""
    from broker.runtime.definitions_io import DefinitionsError, parse

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
        body = parse(raw, "standard input" if path == "-" else path)
    except DefinitionsError as exc:
        error(str(exc), EX_DATAERR)
    answer = request(opts, {"command": "import_definitions", "definitions": body})
    if "error" in answer:
        error(str(answer["error"]), EX_DATAERR)
    for line in answer.get("unsupported", ()):
        click.echo(f"unsupported: {line}", err=True)
    for line in answer.get("skipped", ()):
        click.echo(f"skipped: {line}", err=True)
    n = answer["imported"]
    done = ", ".join(f"{count} {kind}" for kind, count in n.items())
    info(opts, f"Imported {done}; {sum(answer.get('unchanged', {}).values())} unchanged.")


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
    connections = len(fetch_connections(opts))
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
