"""An AMQPS connection on a worker: the TLS handshake (trio's SSLStream over the accepted
socket), then the plain connection's reader and writer over one end of a socket pair, and
two pumps between the other end and the TLS stream.

The plain path pays nothing for TLS; a TLS connection pays a copy through the pair on top
of its crypto. ``workers.server`` hands :func:`serve_tls` its plain connection task.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

import trio

from ipc import tls
from workers.client_socket import addresses

log_connection = logging.getLogger("shoal.connection")

TLS_HANDSHAKE_TIMEOUT = 5.0  # RabbitMQ's ssl_handshake_timeout
TLS_RECEIVE_SIZE = 256 << 10  # a pump's read: a TLS record is 16 KiB at most
TLS_PAIR_BUFFER = 1 << 20  # the socket pair's buffers: a few big messages in flight


class ViaTLS:
    """What a TLS connection's AMQP side takes from the TLS socket: its addresses and the
    user its verified client certificate names (EXTERNAL), if any."""

    __slots__ = ("external_user", "local", "peer")

    def __init__(self, peer: str, local: str, external_user: str | None) -> None:
        self.peer = peer
        self.local = local
        self.external_user = external_user


PlainConnection = Callable[[trio.SocketStream, socket.socket, ViaTLS], Awaitable[None]]


async def serve_tls(stream: trio.SocketStream, sock: socket.socket, context: ssl.SSLContext,
                    connection: PlainConnection, refused: Callable[[], None],
                    grace: float) -> None:
    """Serve the accepted ``sock`` as AMQPS: ``connection`` runs the AMQP protocol over the
    pair; ``refused`` is called when the handshake fails (no connection was served);
    ``grace``: how long what the writer sent last has to go out."""
    stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer, local = addresses(sock)
    tls_stream = trio.SSLStream(stream, context, server_side=True)
    try:
        with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
            await tls_stream.do_handshake()
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
            OSError) as exc:
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
        log_connection.warning("TLS handshake of %s failed: %s", peer or "?",
                               cause or "handshake timeout")
        refused()
        with trio.move_on_after(0.5) as scope:
            scope.shield = True
            await stream.aclose()
        return
    # A certificate is only there when verify_peer checked it against --tls-ca.
    user = tls.common_name(tls_stream.getpeercert())
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, TLS_PAIR_BUFFER)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TLS_PAIR_BUFFER)
        end.setblocking(False)
    inner = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    pumped = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_in, tls_stream, pumped)
            out_done = trio.Event()
            nursery.start_soon(_pump_out, pumped, tls_stream, out_done)
            await connection(inner, ours, ViaTLS(peer, local, user))
            with trio.move_on_after(grace):  # what the writer sent goes out
                await out_done.wait()
            nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(0.5) as scope:
            scope.shield = True
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await tls_stream.aclose()  # close_notify, then the socket
            await pumped.aclose()


async def _pump_in(tls_stream: trio.SSLStream[trio.SocketStream],
                   pumped: trio.SocketStream) -> None:
    """Client → connection: decrypted bytes into the pair (its buffer full, this stops reading
    the TLS socket: credit flow reaches the client's TCP window as on the plain path); the
    client's EOF, or a broken TLS stream, is EOF on the pair."""
    try:
        while data := await tls_stream.receive_some(TLS_RECEIVE_SIZE):
            await pumped.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        await pumped.send_eof()


async def _pump_out(pumped: trio.SocketStream, tls_stream: trio.SSLStream[trio.SocketStream],
                    done: trio.Event) -> None:
    """Connection → client: what the writer sent, encrypted; ``done`` at the pair's EOF (the
    connection's last frame is out)."""
    try:
        while data := await pumped.receive_some(TLS_RECEIVE_SIZE):
            await tls_stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        done.set()
