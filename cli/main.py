"""The ``shoal`` command line."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable

import click
from click.core import ParameterSource

from broker.runtime.supervisor import ServeConfig, run
from broker.storage.data_dir import default_data_dir
from cli.control import list_connections
from cli.report import report
from cli.users import delete_user, list_users


def _parse_users(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    users: dict[str, str] = {}
    for value in values:
        name, sep, password = value.partition(":")
        if not sep or not name:
            raise click.BadParameter("expected NAME:PASSWORD (a non-empty name, then ':')")
        users[name] = password
    return users


# RabbitMQ's information units (rabbit_resource_monitor_misc:parse_information_unit, as its
# rabbitmq.conf takes them for disk_free_limit, vm_memory_high_watermark.absolute and
# max_message_size): kB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB and the bare letters
# k, M, G, T are powers of 1024; no unit is bytes. Case does not matter.
_UNITS = {"": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_SIZE = re.compile(r"([0-9]+)([a-z]*)")
_SIZE_HELP = "bytes, or a number with kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB, k, M, G, T"


def parse_size(text: str) -> int:
    """A size in RabbitMQ's information units: 50MB is 50,000,000 bytes, 50MiB and 50M 52,428,800.

    Raises ValueError for anything else (a fraction, a sign, an unknown unit)."""
    match = _SIZE.fullmatch(str(text).strip().lower().replace(" ", ""))
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"expected {_SIZE_HELP}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _parse_bytes(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """Click's callback for a size option without bounds (--disk-free-limit)."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _size_in(low: int, high: int | None = None) -> Callable[[click.Context, click.Parameter, str], int]:
    """Click's callback for a size option that must lie within [low, high] bytes."""
    def callback(ctx: click.Context, param: click.Parameter, value: str) -> int:
        size = _parse_bytes(ctx, param, value)
        if size < low or (high is not None and size > high):
            bounds = f"{low} to {high}" if high is not None else f"at least {low}"
            raise click.BadParameter(f"{value} is {size} bytes; expected {bounds} bytes")
        return size
    return callback


def _read_users_file(path: str) -> dict[str, str]:
    """NAME:PASSWORD per line; blank lines and # comments skipped. Warns when others may read it."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        click.echo(f"warning: {path} is readable by other users (chmod 600 it)", err=True)
    users: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, password = line.partition(":")
            if not sep or not name:
                raise click.BadParameter(f"line {number}: expected NAME:PASSWORD",
                                         param_hint="--users-file")
            users[name] = password
    return users


@click.group()
@click.version_option(package_name="shoal")
def main() -> None:
    """Shoal: an AMQP 0-9-1 message broker that uses every core of one host."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address the AMQP listener binds to.")
@click.option("--port", default=5672, show_default=True, type=click.IntRange(0, 65535),
              help="AMQP port shared by all workers (0 picks a free one).")
@click.option("--workers", default=os.cpu_count() or 1, show_default="CPU count",
              type=click.IntRange(1, 256), help="Number of IO worker processes.")
@click.option("--start-grace", default=2.0, show_default=True, type=click.FloatRange(0, 60),
              help="Longest time, in seconds, the other workers leave new connections to a "
              "worker that is starting or being replaced, instead of taking them all (0: never).")
@click.option("--arena-mb", default=256, show_default=True, type=click.IntRange(4, 1 << 16),
              help="Shared-memory body arena per worker, in MiB (sparse: only used pages count).")
@click.option("--ring-kb", default=4096, show_default=True, type=click.IntRange(64, 1 << 20),
              help="Size of each request/event ring per worker, in KiB.")
@click.option("--heartbeat", default=60, show_default=True, type=click.IntRange(0, 65535),
              help="Heartbeat interval offered to clients, in seconds (0 disables).")
@click.option("--frame-max", default=131072, show_default=True,
              type=click.IntRange(4096, 1 << 24), help="Largest frame offered to clients, in bytes.")
@click.option("--channel-max", default=2047, show_default=True, type=click.IntRange(1, 65535),
              help="Most channels per connection offered to clients.")
@click.option("--max-message-size", default=str(128 << 20), show_default="128MiB",
              callback=_size_in(1, 512 << 20), metavar="SIZE",
              help="Largest message body accepted (RabbitMQ's max_message_size, at most 512MiB "
              "as there): bytes or RabbitMQ's units as for --disk-free-limit; a body over a "
              "sixteenth of --arena-mb gets a shared-memory segment of its own.")
@click.option("--memory-high-watermark", default="0", show_default="80% of --arena-mb",
              callback=_size_in(0), metavar="SIZE",
              help="Messages held in one worker's arena (bytes or RabbitMQ's units, as for "
              "--disk-free-limit) at which that worker's publishers get connection.blocked and "
              "are paused (0: the default).")
@click.option("--memory-low-watermark", default="0", show_default="90% of the high watermark",
              callback=_size_in(0), metavar="SIZE",
              help="Messages held in a blocked worker's arena (bytes or RabbitMQ's units) below "
              "which its publishers are unblocked (0: the default).")
@click.option("--queued-high-watermark", default=0, type=click.IntRange(-1),
              show_default="40% of the machine's memory at 200 bytes a message",
              help="Messages queued in all queues (a fanout's copies each count) at which every "
              "publisher gets connection.blocked: the supervisor's own memory, which the arenas' "
              "watermarks do not bound (unblocked below 90% of it; -1: never).")
@click.option("--memory-paging-ratio", default=0.5, show_default=True,
              type=click.FloatRange(0, 1), help="Message bodies (persistent and transient) are "
              "paged out to the data directory from an arena holding more than this fraction of "
              "the high watermark, and read back when delivered (RabbitMQ's "
              "vm_memory_high_watermark_paging_ratio; 0 turns paging off).")
@click.option("--trace", default=None, type=click.Path(file_okay=False),
              help="Write trace files (Arrow IPC) of every message's stages into this "
              "directory; analyse them with `shoal report DIR`.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              show_default="$XDG_STATE_HOME/shoal/node-PORT, or ~/.local/state/shoal/node-PORT",
              help="Where durable exchanges, queues and bindings are kept between runs. One "
              "broker per directory: a second one refuses to start.")
@click.option("--disk-free-limit", default="50MB", show_default=True, callback=_parse_bytes,
              metavar="SIZE",
              help="Block publishers (connection.blocked, reason 'low on disk') while the data "
              "directory's file system has less free space than this: bytes, or with kB, MB, GB, "
              "TB (powers of 1000) or KiB, MiB, GiB, TiB, k, M, G, T (powers of 1024), as "
              "RabbitMQ's disk_free_limit; 0 turns the alarm off.")
@click.option("--user", "users", multiple=True, metavar="NAME:PASSWORD", envvar="SHOAL_USERS",
              callback=_parse_users,
              help="A user who may log in (PLAIN or AMQPLAIN), repeatable: kept in the data "
              "directory, added or given this password. On a new data directory, given users "
              "replace the default guest/guest, as RabbitMQ's default_user does. Also read from "
              "$SHOAL_USERS (space-separated), which keeps passwords out of `ps`.")
@click.option("--users-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Read users from this file, one NAME:PASSWORD per line (# comments): the way "
              "to keep passwords out of `ps` and shell history. Adds to --user / $SHOAL_USERS.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="Logging level.")
@click.option("--control-socket", default=None, type=click.Path(dir_okay=False),
              show_default="$XDG_RUNTIME_DIR/shoal-PORT.sock or /tmp/shoal-UID/shoal-PORT.sock",
              help="Unix socket (mode 0600) on which `shoal list-connections` asks the broker.")
@click.option("--management-port", default=15672, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the management HTTP API (RabbitMQ's, 3.x shapes), served by a process "
              "of its own (0 turns it off).")
@click.option("--management-host", default=None, show_default="--host",
              help="Address the management HTTP API binds to.")
@click.option("--ready-file", default=None, type=click.Path(dir_okay=False),
              help="Write JSON {port, supervisor_pid, worker_pids, instance, control} here once every "
                   "worker accepts connections (rewritten when a worker is replaced).")
def serve(**options: object) -> None:
    """Start the supervisor and its IO workers, and serve AMQP 0-9-1 until SIGTERM/SIGINT."""
    ctx = click.get_current_context()
    if options["users"] and ctx.get_parameter_source("users") is ParameterSource.COMMANDLINE:
        click.echo("warning: passwords given with --user can be read by every user of this host "
                   "(ps, /proc); use --users-file or $SHOAL_USERS instead", err=True)
    if options["trace"]:
        import importlib.util

        if importlib.util.find_spec("pyarrow") is None:
            raise click.ClickException("--trace needs pyarrow: pip install -e '.[report]' "
                                       "(make test installs it)")
    users_file = options.pop("users_file")
    if users_file:
        options["users"] = {**options["users"], **_read_users_file(str(users_file))}  # type: ignore[dict-item]
    if not options["data_dir"]:
        options["data_dir"] = str(default_data_dir(int(options["port"])))  # type: ignore[call-overload]
    # RabbitMQ's management port by default; taken (another broker's), the broker runs without
    # it and says so; asked for with --management-port, a port in use fails the start.
    options["management_required"] = (
        ctx.get_parameter_source("management_port") is not ParameterSource.DEFAULT)
    config = ServeConfig(**options)  # type: ignore[arg-type]
    raise SystemExit(run(config))


main.add_command(report)
main.add_command(list_connections)
main.add_command(list_users)
main.add_command(delete_user)


if __name__ == "__main__":
    main()
