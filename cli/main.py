"""The ``shoal`` command line."""

from __future__ import annotations

import sys

if sys.argv[1:2] == ["serve"]:  # before the imports: their objects go on huge pages too
    from ipc import huge_pages

    huge_pages.start_again_with_tunable()  # glibc's heap too (returns once it has it)
    huge_pages.install()

import os
import re
import stat
from collections.abc import Callable

import click
from click.core import ParameterSource

from broker.runtime.serve import run
from broker.runtime.serve_config import ServeConfig
from broker.storage.data_dir import default_data_dir
from cli.config_file import ConfigFileError, Setting, parse_size
from cli.config_file import read as read_config_file
from cli.control import list_connections
from cli.ctl import ctl
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


def _high_watermark(ctx: click.Context, param: click.Parameter, value: str) -> int | float:
    """--memory-high-watermark: a size, or a fraction of --arena-mb (0.4: with a decimal point),
    which serve() turns into bytes once --arena-mb is known."""
    if "." not in str(value):
        return _size_in(0)(ctx, param, value)
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise click.BadParameter(f"{value}: expected a size, or a fraction above 0 and at most 1")
    return fraction


def _parse_vhost_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value:
        raise click.BadParameter("a vhost needs a non-empty name")
    return value


def _parse_permissions(ctx: click.Context, param: click.Parameter,
                       value: tuple[str, str, str]) -> tuple[str, str, str]:
    for regex in value:
        try:
            re.compile(regex)
        except re.error as exc:
            raise click.BadParameter(f"{regex!r} is not a regular expression: {exc}") from None
    return (value[0], value[1], value[2])


def _parse_loopback_users(ctx: click.Context, param: click.Parameter, value: str) -> frozenset[str]:
    names = [name.strip() for name in str(value).split(",")]
    return frozenset() if value == "none" else frozenset(name for name in names if name)


def _as_option_value(setting: Setting) -> object:
    """A config file's typed value in the form the option takes on the command line."""
    value = setting.value
    if isinstance(value, dict):  # default_user/default_pass: --user's NAME:PASSWORD
        return [f"{name}:{password}" for name, password in value.items()]
    if isinstance(value, frozenset):  # loopback_users
        return ",".join(sorted(value)) or "none"
    return value


def _load_config(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """--config FILE (eager): the file's settings become the options' defaults (ctx.default_map),
    so options given on the command line, or through their environment variables, still win.
    A key or value Shoal cannot take stops the start with FILE:LINE: key: reason."""
    if path is None:
        return None
    options = {p.name: p for p in ctx.command.params if p.name}
    try:
        settings = read_config_file(path, options)
    except ConfigFileError as exc:
        click.echo(str(exc), err=True)
        ctx.exit(1)
    except (OSError, UnicodeDecodeError) as exc:
        click.echo(f"{path}: cannot read it: {exc}", err=True)
        ctx.exit(1)
    defaults: dict[str, object] = {}
    for name, setting in settings.items():
        defaults[name] = _as_option_value(setting)
        try:  # the option's own rules (its range, its callback) apply to the file's value
            options[name].process_value(ctx, defaults[name])
        except click.BadParameter as exc:
            click.echo(f"{path}:{setting.line}: {setting.key}: {exc.message}", err=True)
            ctx.exit(1)
    if "users" in settings and os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH):
        click.echo(f"warning: {path} holds default_pass and is readable by other users "
                   "(chmod 600 it)", err=True)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return path


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
@click.option("--config", default=None, type=click.Path(exists=True, dir_okay=False),
              envvar="SHOAL_CONFIG_FILE", is_eager=True, callback=_load_config,
              expose_value=False, help="Read settings from this rabbitmq.conf (RabbitMQ's "
              "`key = value` format; the keys docs/configuration.md lists); options given here "
              "win over the file. Also read from $SHOAL_CONFIG_FILE.")
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
              callback=_high_watermark, metavar="SIZE",
              help="Messages held in one worker's arena (bytes or RabbitMQ's units, as for "
              "--disk-free-limit, or a fraction of --arena-mb such as 0.4) at which that "
              "worker's publishers get connection.blocked and are paused (0: the default).")
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
@click.option("--default-vhost", default="/", show_default=True, metavar="NAME",
              callback=_parse_vhost_name,
              help="The virtual host a new data directory (or a broker without one) starts with, "
              "in the place of '/'; the default user gets full permissions on it. RabbitMQ's "
              "default_vhost: a data directory already initialised keeps its vhosts.")
@click.option("--default-permissions", nargs=3, default=(".*", ".*", ".*"), show_default=True,
              metavar="CONFIGURE WRITE READ", callback=_parse_permissions,
              help="The permissions (three regular expressions) the users made at the first start "
              "of a new data directory get on --default-vhost (RabbitMQ's default_permissions).")
@click.option("--users-file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Read users from this file, one NAME:PASSWORD per line (# comments): the way "
              "to keep passwords out of `ps` and shell history. Adds to --user / $SHOAL_USERS.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error", "critical"]),
              help="Logging level.")
@click.option("--loopback-users", default="guest", show_default=True, metavar="NAMES",
              callback=_parse_loopback_users,
              help="Users who may log in only from a loopback address, comma-separated "
              "(RabbitMQ's loopback_users); none: no such user.")
@click.option("--tls-port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="AMQPS (AMQP over TLS 1.2/1.3) port on --host's address, shared by all "
              "workers as --port is (RabbitMQ's listeners.ssl.default, 5671; 0: none). Needs "
              "--tls-cert and --tls-key.")
@click.option("--tls-cert", default=None, type=click.Path(dir_okay=False), metavar="PEM",
              help="The server's certificate (chain), PEM (ssl_options.certfile).")
@click.option("--tls-key", default=None, type=click.Path(dir_okay=False), metavar="PEM",
              help="The server certificate's private key, PEM (ssl_options.keyfile); each "
              "worker reads the file itself.")
@click.option("--tls-ca", default=None, type=click.Path(dir_okay=False), metavar="PEM",
              help="CA certificates client certificates must chain to (ssl_options.cacertfile).")
@click.option("--tls-verify-peer/--tls-verify-none", default=False, show_default=True,
              help="Ask clients for a certificate and refuse one that does not chain to --tls-ca "
              "(ssl_options.verify = verify_peer); a verified certificate's CN may log in with "
              "the EXTERNAL mechanism.")
@click.option("--tls-fail-if-no-peer-cert/--tls-allow-no-peer-cert", default=False,
              show_default=True, help="With --tls-verify-peer, refuse a client that sends no "
              "certificate (ssl_options.fail_if_no_peer_cert).")
@click.option("--control-socket", default=None, type=click.Path(dir_okay=False),
              show_default="$XDG_RUNTIME_DIR/shoal-PORT.sock or /tmp/shoal-UID/shoal-PORT.sock",
              help="Unix socket (mode 0600) on which `shoal list-connections` asks the broker.")
@click.option("--management-port", default=15672, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the management HTTP API (RabbitMQ's, 3.x shapes), served by a process "
              "of its own (0 turns it off).")
@click.option("--management-host", default=None, show_default="--host",
              help="Address the management HTTP API binds to.")
@click.option("--management-tls-port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="HTTPS port (TLS 1.2/1.3) of the management API, beside --management-port, on "
              "--management-host's address (RabbitMQ's management.ssl.port; 0: none). Uses "
              "--tls-cert and --tls-key unless --management-tls-cert and --management-tls-key "
              "are given.")
@click.option("--management-tls-cert", default=None, type=click.Path(dir_okay=False),
              metavar="PEM", show_default="--tls-cert",
              help="The management API's certificate (chain), PEM (management.ssl.certfile).")
@click.option("--management-tls-key", default=None, type=click.Path(dir_okay=False),
              metavar="PEM", show_default="--tls-key",
              help="Its private key, PEM (management.ssl.keyfile); the management process reads "
              "the file itself.")
@click.option("--management-tls-ca", default=None, type=click.Path(dir_okay=False),
              metavar="PEM", show_default="--tls-ca",
              help="CA certificates for the management API's TLS (management.ssl.cacertfile).")
@click.option("--prometheus-port", default=15692, show_default=True, type=click.IntRange(0, 65535),
              help="Port of the Prometheus metrics (/metrics, /metrics/per-object: "
              "rabbitmq_prometheus's names), served by the management process (0 turns it off).")
@click.option("--prometheus-host", default=None, show_default="--host",
              help="Address the Prometheus metrics bind to.")
@click.option("--load-definitions", default=None, type=click.Path(), metavar="FILE",
              help="Import this definitions file (RabbitMQ's export JSON; or each *.json of a "
              "directory) at every start, after the data directory is recovered and before a "
              "worker accepts: RabbitMQ's load_definitions. What Shoal does not support is named "
              "at WARNING; a malformed file stops the start.")
@click.option("--ready-file", default=None, type=click.Path(dir_okay=False),
              help="Write JSON {port, supervisor_pid, worker_pids, instance, control} here once every "
                   "worker accepts connections (rewritten when a worker is replaced); with "
                   "management_port, the management API's.")
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
    if isinstance(options["memory_high_watermark"], float):  # a fraction of --arena-mb
        arena = int(options["arena_mb"]) << 20  # type: ignore[call-overload]
        options["memory_high_watermark"] = int(options["memory_high_watermark"] * arena)
    if not options["data_dir"]:
        options["data_dir"] = str(default_data_dir(int(options["port"])))  # type: ignore[call-overload]
    # RabbitMQ's management port by default; taken (another broker's), the broker runs without
    # it and says so; asked for with --management-port, a port in use fails the start.
    options["management_required"] = (
        ctx.get_parameter_source("management_port") is not ParameterSource.DEFAULT)
    options["prometheus_required"] = (
        ctx.get_parameter_source("prometheus_port") is not ParameterSource.DEFAULT)
    if options["load_definitions"]:  # a malformed file stops the start before anything binds
        from broker.runtime.definitions_io import DefinitionsError, read

        try:
            read(str(options["load_definitions"]))
        except DefinitionsError as exc:
            click.echo(f"cannot start: --load-definitions {exc}", err=True)
            raise SystemExit(1) from None
    config = ServeConfig(**options)  # type: ignore[arg-type]
    raise SystemExit(run(config))


main.add_command(report)
main.add_command(list_connections)
main.add_command(ctl)
main.add_command(list_users)
main.add_command(delete_user)


if __name__ == "__main__":
    main()
