"""``shoal list-users`` and ``shoal delete-user``: the users kept in a data directory.

Users live in the data directory (``broker.passwords``): ``shoal serve --user`` adds them or
changes their password, and nothing else removes one. These commands read and change
``DIR/definitions.db`` while the broker is stopped: they take the data directory's lock, so
against a running broker they refuse with the line ``shoal serve`` would print.
"""

from __future__ import annotations

from pathlib import Path

import click

from broker.storage.data_dir import DataDir, DataDirDamaged, DataDirInUse, default_data_dir
from broker.storage.definition_store import DefinitionStore, DefinitionStoreError, open_definitions

_DATA_DIR = click.option(
    "--data-dir", default=None, type=click.Path(file_okay=False),
    show_default="the one `shoal serve --port PORT` uses",
    help="The broker's data directory.")
_PORT = click.option("--port", default=5672, show_default=True, type=click.IntRange(1, 65535),
                     help="Whose default data directory (shoal serve --port).")


def _store(data_dir: str | None, port: int) -> tuple[DataDir, DefinitionStore]:
    """The data directory's definitions, checked as ``shoal serve`` checks them: never a new
    directory, and a damaged one refused with the line ``shoal serve`` would print."""
    path = Path(data_dir) if data_dir else default_data_dir(port)
    if not path.is_dir():
        raise click.ClickException(f"no broker data in {path}")
    try:
        data = DataDir(path)
    except DataDirInUse as exc:
        raise click.ClickException(f"{exc}: stop it first") from None
    try:
        return data, open_definitions(data, create=False).store
    except (DataDirDamaged, DefinitionStoreError) as exc:
        data.close()
        raise click.ClickException(str(exc)) from None


@click.command("list-users")
@_DATA_DIR
@_PORT
def list_users(data_dir: str | None, port: int) -> None:
    """The users who may log in (as rabbitmqctl list_users), one per line."""
    data, store = _store(data_dir, port)
    try:
        for name in store.users():
            click.echo(name)
    finally:
        store.close()
        data.close()


@click.command("delete-user")
@click.argument("name")
@_DATA_DIR
@_PORT
def delete_user(name: str, data_dir: str | None, port: int) -> None:
    """Remove a user (as rabbitmqctl delete_user); the broker must be stopped."""
    data, store = _store(data_dir, port)
    try:
        if not store.delete_user(name):
            raise click.ClickException(f"no such user: {name}")
        click.echo(f"Deleting user \"{name}\" ...")
    finally:
        store.close()
        data.close()
