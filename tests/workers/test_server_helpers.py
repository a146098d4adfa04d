"""The worker runtime's helpers: which peers count as loopback (RabbitMQ's loopback_users),
how much a connection's next read asks for, an accepted socket's options."""

from __future__ import annotations

import socket

import pytest
import trio

from workers.client_socket import SEND_LOWAT, tune
from workers.client_socket import is_loopback as _is_loopback
from workers.socket_reader import (
    RECEIVE_BIG,
    RECEIVE_SIZE,
    RECEIVE_SMALL,
    _next_ask,
)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("192.0.2.2", False), ("10.0.0.1", False), ("fd00::2", False), ("::ffff:10.0.0.1", False),
    ("", False), ("not-an-address", False),
])
def test_loopback_peers(host: str, loopback: bool) -> None:
    assert _is_loopback(host) is loopback


def test_reads_grow_while_they_fill_and_shrink_after_a_pause() -> None:
    """A read that filled its ask is followed by a bigger one; a short one (the client paused)
    by a small one."""
    assert _next_ask(RECEIVE_SMALL, RECEIVE_SMALL, 400) == RECEIVE_SIZE
    assert _next_ask(RECEIVE_SIZE, RECEIVE_SIZE - 1, 1) == RECEIVE_SMALL
    assert _next_ask(RECEIVE_BIG, 100, 0) == RECEIVE_SMALL


def test_only_a_stream_of_big_messages_is_read_a_megabyte_at_a_time() -> None:
    """256 KiB bodies (one publish a full 256 KiB read, four a megabyte) go on at RECEIVE_BIG;
    128-byte or 4 KiB publishes (thousands, or 64, a read) stay at RECEIVE_SIZE, so credit flow
    stops a publisher within a read's worth of them."""
    assert _next_ask(RECEIVE_SIZE, RECEIVE_SIZE, 1) == RECEIVE_BIG
    assert _next_ask(RECEIVE_BIG, RECEIVE_BIG, 4) == RECEIVE_BIG
    assert _next_ask(RECEIVE_SIZE, RECEIVE_SIZE, 1800) == RECEIVE_SIZE
    assert _next_ask(RECEIVE_SIZE, RECEIVE_SIZE, 64) == RECEIVE_SIZE
    assert _next_ask(RECEIVE_BIG, RECEIVE_BIG, 7000) == RECEIVE_SIZE
    assert _next_ask(RECEIVE_SMALL, RECEIVE_SMALL, 0) == RECEIVE_SIZE  # not yet: first 256 KiB


def test_a_client_socket_sends_up_to_a_mebibyte_unsent_over_trios_16_kib() -> None:
    """trio's SocketStream sets TCP_NOTSENT_LOWAT to 16 KiB; the worker's tuning raises it to
    SEND_LOWAT (so a big delivery goes to the kernel in one sendmsg) and keeps TCP_NODELAY."""
    lowat = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if lowat is None:
        pytest.skip("the platform has no TCP_NOTSENT_LOWAT")
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()[:2]):
        accepted, _ = server.accept()
        with accepted:
            trio.SocketStream(trio.socket.from_stdlib_socket(accepted))
            assert accepted.getsockopt(socket.IPPROTO_TCP, lowat) == 16384  # trio's
            tune(accepted)
            assert accepted.getsockopt(socket.IPPROTO_TCP, lowat) == SEND_LOWAT == 1 << 20
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
