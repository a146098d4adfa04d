"""``shoal ctl``'s limit verbs: set_vhost_limits, clear_vhost_limits, list_vhost_limits,
set_user_limits, clear_user_limits, list_user_limits (rabbitmqctl 3.10's arguments, lines and
exit codes; broker.runtime.limits)."""

from __future__ import annotations

import json
from typing import Any

import click

from cli.ctl_group import EX_DATAERR, EX_SOFTWARE, EX_UNAVAILABLE, Options, emit, error, info, request, verb


def _compact(limits: dict[str, Any]) -> str:
    """rabbitmqctl prints a limits map as compact JSON: ``{"max-connections":1}``."""
    return json.dumps(limits, separators=(",", ":"), sort_keys=True)


def _parse(definition: str) -> Any:
    try:
        return json.loads(definition)
    except ValueError:
        error("JSON decoding error. Reason: badarg", EX_UNAVAILABLE)


def _answer(answer: dict[str, Any], vhost: str | None = None, user: str | None = None) -> dict[str, Any]:
    """The answer, or rabbitmqctl's error and exit code for what went wrong."""
    if "error" not in answer:
        return answer
    if answer.get("code") == "missing" and vhost is not None:
        click.echo(f"Virtual host '{vhost}' does not exist", err=True)
        raise SystemExit(EX_DATAERR)
    if answer.get("code") == "missing" and user is not None:
        error(f'{{:no_such_user, "{user}"}}', EX_UNAVAILABLE)
    if answer.get("code") == "invalid":
        text = str(answer["error"])
        error(f"Validation failed\n\n{text}\n" if vhost is not None else text, EX_UNAVAILABLE)
    error(str(answer["error"]), EX_SOFTWARE)


@verb("set_vhost_limits")
@click.argument("definition")
def set_vhost_limits(opts: Options, definition: str) -> None:
    """Set the vhost's (-p) limits, all of them: '{"max-connections": N, "max-queues": N}'."""
    info(opts, f'Setting vhost limits to "{definition}" for vhost "{opts.vhost}" ...')
    _answer(request(opts, {"command": "set_vhost_limits", "vhost": opts.vhost,
                           "limits": _parse(definition)}), vhost=opts.vhost)


@verb("clear_vhost_limits")
def clear_vhost_limits(opts: Options) -> None:
    """Remove the vhost's (-p) limits."""
    info(opts, f'Clearing vhost "{opts.vhost}" limits ...')
    _answer(request(opts, {"command": "clear_vhost_limits", "vhost": opts.vhost}),
            vhost=opts.vhost)


def _list(opts: Options, kind: str, name: str | None) -> None:
    """One vhost's or user's limits as JSON (``name``), or every one's (None) as rows."""
    command = f"list_{kind}_limits"
    plural = "vhosts" if kind == "vhost" else "users"
    if name is None:
        info(opts, f"Listing limits for all {plural} ...")
        rows = _answer(request(opts, {"command": command}))["limits"]
        emit(opts, (kind, "limits"), [{kind: row[kind], "limits": _compact(row["value"])}
                                      for row in rows])
        return
    info(opts, f'Listing limits for {kind} "{name}" ...')
    rows = _answer(request(opts, {"command": command, kind: name}),
                   **{kind: name})["limits"]
    click.echo(_compact(rows[0]["value"] if rows else {}))


@verb("list_vhost_limits")
@click.option("--global", "everywhere", is_flag=True, help="The limits of every vhost.")
def list_vhost_limits(opts: Options, everywhere: bool) -> None:
    """The vhost's (-p) limits as JSON; with --global, every vhost's (vhost, limits)."""
    _list(opts, "vhost", None if everywhere else opts.vhost)


@verb("set_user_limits")
@click.argument("username")
@click.argument("definition")
def set_user_limits(opts: Options, username: str, definition: str) -> None:
    """Set some of a user's limits: '{"max-connections": N, "max-channels": N}' (the others stay)."""
    info(opts, f'Setting user limits to "{definition}" for user "{username}" ...')
    _answer(request(opts, {"command": "set_user_limits", "user": username,
                           "limits": _parse(definition)}), user=username)


@verb("clear_user_limits")
@click.argument("username")
@click.argument("limit")
def clear_user_limits(opts: Options, username: str, limit: str) -> None:
    """Remove one of a user's limits (max-connections, max-channels), or all of them (all)."""
    what = "all limits" if limit == "all" else f'"{limit}" limit'
    info(opts, f'Clearing {what} for user "{username}" ...')
    _answer(request(opts, {"command": "clear_user_limits", "user": username, "name": limit}),
            user=username)


@verb("list_user_limits")
@click.option("--user", "username", default="guest", help="The user whose limits to list.")
@click.option("--global", "everywhere", is_flag=True, help="The limits of every user.")
def list_user_limits(opts: Options, username: str, everywhere: bool) -> None:
    """A user's limits as JSON (--user, default guest); with --global, every user's."""
    _list(opts, "user", None if everywhere else username)
