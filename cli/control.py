"""``shoal list-connections`` (deprecated: ``shoal ctl list_connections``, cli.ctl) and the
control socket's client, ``ask``."""

from __future__ import annotations

import json
import socket
from typing import Any

import click

from broker.runtime.control import default_control_path

COLUMNS = ("name", "user", "vhost", "state", "channels", "worker", "client", "recv_oct", "send_oct")


def ask(path: str, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request line to the control socket at ``path``, one JSON answer back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer: dict[str, Any] = json.loads(data)
    return answer


def format_table(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    """Tab-separated, a header line first, as ``rabbitmqctl list_connections`` prints."""
    lines = ["\t".join(columns)]
    lines += ["\t".join(str(row.get(column, "")) for column in columns) for row in rows]
    return "\n".join(lines)


@click.command("list-connections")
@click.option("--port", default=5672, show_default=True, type=click.IntRange(1, 65535),
              help="The broker's AMQP port (names its default control socket).")
@click.option("--control", "control_path", default=None, type=click.Path(dir_okay=False),
              help="The broker's control socket (default: the one for --port; the ready "
                   "file of `shoal serve --ready-file` names it).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def list_connections(port: int, control_path: str | None, as_json: bool) -> None:
    """Deprecated: `shoal ctl list_connections`. Client connections with their state: running,
    flow (the broker stopped reading it: credit flow or unsent output), blocking / blocked
    (memory alarm), closing."""
    click.echo("shoal list-connections is deprecated: use `shoal ctl list_connections` "
               "(rabbitmqctl's columns and options)", err=True)
    path = control_path or default_control_path(port)
    try:
        answer = ask(path, {"command": "list_connections"})
    except OSError as exc:
        raise click.ClickException(f"no broker answers on {path}: {exc}") from exc
    if "error" in answer:
        raise click.ClickException(answer["error"])
    rows = answer["connections"]
    click.echo(json.dumps(rows, indent=2) if as_json else format_table(rows))
