"""What every ``shoal ctl`` verb shares: the click group with the general options (taken before
or after the verb), rabbitmqctl's exit codes and usage errors, one control request, the
informational lines and a listing's output (table or JSON, from ``cli.ctl_format``).

A verb is a function decorated with :func:`verb`; it gets the :class:`Options` first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import click

from broker.runtime.control import default_control_path
from cli.control import ask
from cli.ctl_format import DEFAULTS, VHOST, json_rows, table

EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE = 64, 65, 67, 69, 70


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


def general_options(f: Callable[..., Any]) -> Callable[..., Any]:
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
        click.option("-p", "--vhost", default=None, help='The virtual host (default "/").'),
        click.option("-t", "--timeout", type=float, default=None, help="Seconds to wait."),
        click.option("-n", "--node", default=None, hidden=True,
                     help="Accepted for rabbitmqctl's sake; --port or --control-socket choose."),
        click.option("-l", "--longnames", is_flag=True, default=None, hidden=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def take_options(ctx: click.Context, given: dict[str, Any]) -> Options:
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
@general_options
@click.pass_context
def ctl(ctx: click.Context, **given: Any) -> None:
    """rabbitmqctl's verbs against a running Shoal (over its control socket): the same
    arguments, and the same tab-separated or JSON output."""
    opts = Options()
    ctx.obj = opts
    take_options(ctx, given)


def verb(name: str, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """A ``shoal ctl`` verb with the general options; the function gets ``opts`` first."""
    def wrap(f: Callable[..., Any]) -> click.Command:
        @click.pass_context
        def run(ctx: click.Context, **given: Any) -> Any:
            opts = take_options(ctx, given)
            return f(opts, **given)
        run.__doc__ = f.__doc__
        run.__name__ = f.__name__
        run.__click_params__ = list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
        return ctl.command(name, cls=CtlCommand, **kwargs)(general_options(run))
    return wrap


def chosen_columns(opts: Options, kind: str, known: Sequence[str], given: tuple[str, ...]) -> list[str]:
    # rabbitmqctl takes columns as separate arguments or comma-separated
    columns = [c for arg in given for c in arg.split(",") if c] or list(DEFAULTS[kind])
    check_columns(columns, known, columns)
    return columns


# Where each snapshot row names its vhost (broker.runtime.snapshot).
_VHOST_AT = {"queues": 16, "exchanges": 8, "bindings": 5, "consumers": 9}


def fetch_snapshot(opts: Options, *, every_vhost: bool = False) -> dict[str, Any]:
    """The supervisor's snapshot, its rows those of the vhost -p names (``every_vhost``: all)."""
    answer = request(opts, {"command": "snapshot"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    if every_vhost:
        return answer
    for key, at in _VHOST_AT.items():
        answer[key] = [row for row in answer.get(key, ())
                       if (row[at] if len(row) > at else VHOST) == opts.vhost]
    return answer


def fetch_connections(opts: Options) -> list[dict[str, Any]]:
    answer = request(opts, {"command": "list_connections"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    rows: list[dict[str, Any]] = answer["connections"]
    return rows


def fetch_users(opts: Options) -> list[dict[str, Any]]:
    answer = request(opts, {"command": "list_users"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    users: list[dict[str, Any]] = answer["users"]
    return users


def check_columns(columns: Sequence[str], known: Sequence[str], given: Sequence[str]) -> None:
    """rabbitmqctl's refusal of unknown info keys (exit 64)."""
    unknown = [c for c in given if c not in known]
    if unknown:
        fail(f"Error (argument validation): Info key(s) {','.join(unknown)} are not supported",
             EX_USAGE)
