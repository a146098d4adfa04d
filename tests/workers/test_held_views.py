"""A connection's output holds views of the arena blocks of big deliveries (VIEWED_BODY_MIN
octets or more) until the socket has taken them: the handler knows which deliveries, by where
their frames end in its output stream (``ConnectionHandler.held``, ``views``), and
``seal_held`` copies every view it still has, queued or with the writer."""

from __future__ import annotations

import msgspec
from pamqp import commands

from ipc import records as r
from tests.workers.helpers import CONN, Harness, consumer
from workers.connection_handler import ConnectionHandler

BIG = r.VIEWED_BODY_MIN


def _deliver(h: Harness, entries: list[int], size: int) -> None:
    target = h.channel().consumers["c1"]
    h.supervisor(r.Pulled(target.id, [h.delivery(e, b"x" * size) for e in entries], False))


def test_big_deliveries_are_held_until_the_socket_took_their_frames() -> None:
    h = Harness(arena_size=1 << 22)
    consumer(h)
    handler: ConnectionHandler = h.handler
    _deliver(h, [1, 2], BIG)
    _deliver(h, [3], BIG - 1)  # copied into its frames: nothing holds its block
    assert handler.holds_views
    assert handler.views([1]) and handler.views([2]) and not handler.views([3])
    assert h.proto.holds_views
    parts = handler.take_parts()
    size = handler.in_flight
    assert sum(map(len, parts)) == size
    first_pull = size - len(parts[-1])  # the last part: the small delivery, copied whole
    handler.sent(first_pull - 1)  # the socket took all but the first pull's last octet
    assert handler.views([2, 9])
    handler.sent(1)
    assert not handler.views([1]) and not handler.views([2])
    assert not handler.holds_views


def test_each_delivery_of_a_pull_is_held_until_its_own_frames_are_taken() -> None:
    """Not until the whole pull's are: a client acking the first of three 256 KiB deliveries
    while the other two are being written must not make the worker copy those two."""
    h = Harness(arena_size=1 << 22)
    consumer(h)
    handler: ConnectionHandler = h.handler
    _deliver(h, [1, 2, 3], 16 * BIG)
    handler.take_parts()
    one = handler.in_flight // 3  # the same frames but for the delivery tag's value
    handler.sent(one)
    assert not handler.views([1])
    assert handler.views([2]) and handler.views([3])
    handler.sent(one - 1)
    assert handler.views([2])
    handler.sent(1)
    assert not handler.views([2]) and handler.views([3])
    handler.sent(one)
    assert not handler.views([3])
    assert not handler.holds_views


def test_a_pull_with_a_lost_body_holds_each_delivery_until_the_whole_pull_is_written() -> None:
    """A paged-out body that cannot be read back is not delivered (it is settled): the ends the
    protocol gave no longer line up with the pull's deliveries, so each is held to the pull's end."""
    h = Harness(arena_size=1 << 22)
    consumer(h)
    handler: ConnectionHandler = h.handler
    target = h.channel().consumers["c1"]
    lost = msgspec.structs.replace(h.delivery(2, b"x" * BIG), stored=(0, 0, 0, BIG))
    h.supervisor(r.Pulled(target.id, [h.delivery(1, b"x" * BIG), lost, h.delivery(3, b"x" * BIG)], False))
    assert r.Settle(CONN, 1, [2], r.AUTO_ACK) in h.take()
    handler.take_parts()
    whole = handler.in_flight
    handler.sent(whole // 2 + 1)  # past the first delivery's frames
    assert handler.views([1])
    handler.sent(whole - whole // 2 - 1)
    assert not handler.views([1]) and not handler.views([3])


def test_sealing_copies_what_is_queued_and_forgets_every_delivery() -> None:
    h = Harness(arena_size=1 << 22)
    consumer(h)
    handler: ConnectionHandler = h.handler
    sealed = []
    handler.seal_writer = lambda: sealed.append(True)
    _deliver(h, [1], 3 * BIG)
    assert h.proto.holds_views and handler.views([1])
    handler.seal_held()
    assert not h.proto.holds_views and not handler.holds_views and sealed == [True]


def test_a_big_basic_get_is_held_too() -> None:
    h = Harness(arena_size=1 << 22)
    handler: ConnectionHandler = h.handler
    h.client(1, commands.Basic.Get(queue="q"))
    h.take()
    h.supervisor(r.GetOk(CONN, 1, h.delivery(7, b"y" * BIG), 0))
    assert handler.views([7])
    data = handler.take_output()  # copied into one bytes: held all the same until sent
    assert handler.views([7])
    handler.sent(len(data))
    assert not handler.views([7])
