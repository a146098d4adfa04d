"""``shoal list-connections`` in the supervisor's dispatch: one round trip to every worker
that is up, answered once all have answered (or one died), and the CLI's table."""

from __future__ import annotations

import socket
from pathlib import Path

from broker.runtime.control import sweep_stale_sockets
from broker.runtime.dispatch import Dispatcher
from cli.control import format_table
from ipc import records as r


def row(conn: int, state: str = "running") -> r.ConnectionInfo:
    return r.ConnectionInfo(conn, f"127.0.0.1:{40000 + conn}", "guest", "/", state, 1, "pika",
                            10, 20, 0.0)


def test_listing_asks_every_worker_and_completes_when_all_answered() -> None:
    d = Dispatcher(3, lambda region, offset: None)
    done: list[bool] = []
    listing = d.list_connections(7, [0, 2], lambda: done.append(True))
    assert d.outbox[0] == [r.ListConnections(7)] and d.outbox[2] == [r.ListConnections(7)]
    assert d.outbox[1] == []
    d.handle(2, r.ConnectionsListed(7, [row(1, "flow")]))
    assert done == []
    d.handle(0, r.ConnectionsListed(7, [row(3), row(4, "blocked")]))
    assert done == [True]
    assert sorted((w, info.conn, info.state) for w, info in listing.rows) == [
        (0, 3, "running"), (0, 4, "blocked"), (2, 1, "flow")]


def test_a_worker_that_dies_is_not_waited_for() -> None:
    d = Dispatcher(2, lambda region, offset: None)
    done: list[bool] = []
    listing = d.list_connections(1, [0, 1], lambda: done.append(True))
    d.handle(0, r.ConnectionsListed(1, [row(1)]))
    d.worker_died(1)
    assert done == [True] and [info.conn for _, info in listing.rows] == [1]


def test_no_worker_up_answers_at_once_and_a_late_answer_is_ignored() -> None:
    d = Dispatcher(1, lambda region, offset: None)
    done: list[bool] = []
    d.list_connections(1, [], lambda: done.append(True))
    assert done == [True]
    d.listings.clear()
    d.handle(0, r.ConnectionsListed(1, [row(1)]))  # the request was given up: nothing breaks


def test_table_has_a_header_and_a_line_per_connection() -> None:
    text = format_table([{"name": "a -> b", "user": "guest", "state": "flow"}],
                        ("name", "user", "state"))
    assert text.splitlines() == ["name\tuser\tstate", "a -> b\tguest\tflow"]


def test_stale_control_sockets_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    """A broker killed with SIGKILL leaves its socket file; the next one removes it, and
    leaves a live broker's socket alone."""
    stale, live = str(tmp_path / "shoal-1.sock"), str(tmp_path / "shoal-2.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(stale)
    dead.close()  # the file stays, nobody listens
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(live)
    listening.listen(1)
    (tmp_path / "other.sock").write_text("not ours")
    try:
        assert sweep_stale_sockets(str(tmp_path)) == [stale]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sock", "shoal-2.sock"]
    finally:
        listening.close()
