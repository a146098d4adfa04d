"""``shoal ctl``'s listings: list_queues, list_exchanges, list_bindings, list_connections,
list_channels, list_consumers, list_users, list_vhosts (rabbitmqctl's columns, default columns
and informational lines)."""

from __future__ import annotations

from typing import Any

import click

from cli.ctl_format import (
    BINDING_COLUMNS,
    CHANNEL_COLUMNS,
    CONNECTION_COLUMNS,
    CONSUMER_COLUMNS,
    EXCHANGE_COLUMNS,
    QUEUE_COLUMNS,
    USER_COLUMNS,
    VHOST_COLUMNS,
    binding_rows,
    channel_rows,
    connection_rows,
    consumer_rows,
    exchange_rows,
    queue_rows,
    user_rows,
)
from cli.ctl_group import (
    EX_SOFTWARE,
    Options,
    check_columns,
    chosen_columns,
    emit,
    error,
    fetch_connections,
    fetch_snapshot,
    fetch_users,
    info,
    request,
    verb,
)
from cli.ctl_objects import node_name


@verb("list_queues")
@click.argument("columns", nargs=-1)
@click.option("--online", is_flag=True, hidden=True)
@click.option("--offline", is_flag=True, hidden=True)
@click.option("--local", is_flag=True, hidden=True)
def list_queues(opts: Options, columns: tuple[str, ...], **_: Any) -> None:
    """Queues and their properties: name messages messages_ready messages_unacknowledged
    consumers durable auto_delete arguments exclusive state type policy vhost."""
    cols = chosen_columns(opts, "queues", QUEUE_COLUMNS, columns)
    info(opts, f"Timeout: {opts.timeout:.1f} seconds ...")
    info(opts, f"Listing queues for vhost {opts.vhost} ...")
    emit(opts, cols, queue_rows(fetch_snapshot(opts)))


@verb("list_exchanges")
@click.argument("columns", nargs=-1)
def list_exchanges(opts: Options, columns: tuple[str, ...]) -> None:
    """Exchanges: name type durable auto_delete internal arguments policy vhost."""
    cols = chosen_columns(opts, "exchanges", EXCHANGE_COLUMNS, columns)
    info(opts, f"Listing exchanges for vhost {opts.vhost} ...")
    emit(opts, cols, exchange_rows(fetch_snapshot(opts)))


@verb("list_bindings")
@click.argument("columns", nargs=-1)
def list_bindings(opts: Options, columns: tuple[str, ...]) -> None:
    """Bindings: source_name source_kind destination_name destination_kind routing_key arguments."""
    cols = chosen_columns(opts, "bindings", BINDING_COLUMNS, columns)
    info(opts, f"Listing bindings for vhost {opts.vhost}...")
    emit(opts, cols, binding_rows(fetch_snapshot(opts)))


@verb("list_connections")
@click.argument("columns", nargs=-1)
def list_connections(opts: Options, columns: tuple[str, ...]) -> None:
    """Client connections: name user vhost state channels peer_host peer_port recv_oct send_oct
    client connected_at worker protocol (state: running, flow, blocking, blocked, closing)."""
    cols = chosen_columns(opts, "connections", CONNECTION_COLUMNS, columns)
    info(opts, "Listing connections ...")
    emit(opts, cols, connection_rows(fetch_connections(opts)))


@verb("list_channels")
@click.argument("columns", nargs=-1)
def list_channels(opts: Options, columns: tuple[str, ...]) -> None:
    """Channels with a consumer or unacknowledged deliveries: pid connection name number user
    vhost consumer_count messages_unacknowledged."""
    cols = chosen_columns(opts, "channels", CHANNEL_COLUMNS, columns)
    info(opts, "Listing channels ...")
    snapshot = fetch_snapshot(opts)
    emit(opts, cols, channel_rows(snapshot, fetch_connections(opts)) if snapshot.get("channels") else [])


@verb("list_consumers")
@click.argument("columns", nargs=-1)
def list_consumers(opts: Options, columns: tuple[str, ...]) -> None:
    """Consumers: queue_name channel_pid consumer_tag ack_required prefetch_count active
    arguments exclusive."""
    cols = chosen_columns(opts, "consumers", CONSUMER_COLUMNS, columns)
    info(opts, f"Listing consumers in vhost {opts.vhost} ...")
    emit(opts, cols, consumer_rows(fetch_snapshot(opts)))


@verb("list_users")
def list_users(opts: Options) -> None:
    """Users and their tags."""
    info(opts, "Listing users ...")
    emit(opts, USER_COLUMNS, user_rows(fetch_users(opts)))


@verb("list_vhosts")
@click.argument("columns", nargs=-1)
def list_vhosts(opts: Options, columns: tuple[str, ...]) -> None:
    """Virtual hosts: cluster_state default_queue_type description name tags tracing."""
    cols = [c for arg in columns for c in arg.split(",") if c] or ["name"]
    check_columns(cols, VHOST_COLUMNS, cols)
    info(opts, "Listing vhosts ...")
    answer = request(opts, {"command": "list_vhosts"})
    if "error" in answer:
        error(str(answer["error"]), EX_SOFTWARE)
    state = f"[{{{node_name()}, running}}]"
    emit(opts, cols, [{**row, "tracing": False, "cluster_state": state} for row in answer["vhosts"]])
