"""``shoal ctl``'s users and permissions: add_user, delete_user, change_password, set_user_tags
(the password from stdin when not given), list_permissions, list_user_permissions,
set/clear_permissions and the topic permissions' verbs; rabbitmqctl's exit codes for a missing or
existing user."""

from __future__ import annotations

import sys
from typing import Any

import click

from cli.ctl_format import format_tags
from cli.ctl_group import (
    EX_DATAERR,
    EX_NOUSER,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    Options,
    emit,
    error,
    info,
    request,
    verb,
)

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


# ------------------------------------------------------------------ permissions


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
