"""One accepted client socket, as the worker's runtime reads it: its addresses, whether its
peer is on loopback (RabbitMQ's loopback_users), what the kernel still queues for it, and
its lingering close.

Plain functions over a ``socket.socket`` (``workers.server`` and ``workers.tls_connection``
call them): no protocol state here.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import sys
import termios

import trio

from workers.socket_reader import RECEIVE_SIZE

CLOSE_LINGER = 2.0  # how long a closed connection's socket is read (and dropped) for its EOF
# Unsent octets a client's socket may hold before it stops taking more (TCP_NOTSENT_LOWAT).
# trio's SocketStream sets 16 KiB: a 256 KiB delivery then goes to the kernel ~200 KB a
# sendmsg, each after a wake-up for the socket to be writable again. RabbitMQ leaves the
# kernel's (no limit); 1 MiB keeps a bound per connection and sends as much a wake-up
# (docs/performance.md, 256 KiB bodies). Small messages never come near either.
SEND_LOWAT = 1 << 20


def tune(sock: socket.socket) -> None:
    """An accepted client socket's options, over trio's: no Nagle delay (trio's too), and
    SEND_LOWAT unsent octets (where the platform has the option)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lowat = getattr(socket, "TCP_NOTSENT_LOWAT", None)
    if lowat is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, lowat, SEND_LOWAT)


def addresses(sock: socket.socket) -> tuple[str, str]:
    """A client socket's peer and local addresses, HOST:PORT (empty when it is gone)."""
    peer = local = ""
    with contextlib.suppress(OSError):
        peer_host, peer_port = sock.getpeername()[:2]
        peer = f"{peer_host}:{peer_port}"
        local_host, local_port = sock.getsockname()[:2]
        local = f"{local_host}:{local_port}"
    return peer, local


async def linger(sock: socket.socket) -> None:
    """After our last frame (close-ok, or our connection.close): send FIN, then read and drop
    what the client still sends until it closes its end, for at most CLOSE_LINGER seconds.
    Closing a socket with unread input sends a TCP reset, which can reach the client before
    the close-ok it is waiting for (amqplib writes connection.close ahead of publishes it
    still has buffered). RabbitMQ reads on after close-ok the same way."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
    with trio.move_on_after(CLOSE_LINGER):
        while True:
            try:
                await trio.lowlevel.wait_readable(sock)
                if not sock.recv(RECEIVE_SIZE):
                    return
            except BlockingIOError:
                continue
            except (OSError, trio.ClosedResourceError):
                return


def socket_queues(sock: socket.socket) -> tuple[int, int]:
    """Bytes received and not read yet, bytes sent and not acknowledged yet (Linux ioctls)."""
    try:
        unread = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        unacked = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return (-1, -1)
    return int.from_bytes(unread, sys.byteorder), int.from_bytes(unacked, sys.byteorder)


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
