"""An AMQPS connection on a worker: the TLS handshake on the accepted socket, then the plain
connection's own reader and writer over the TLS session (``workers.tls_socket``: memory BIOs,
no task or socket between them and the client's socket). ``workers.server`` hands
:func:`serve_tls` its connection task.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Awaitable, Callable

import trio

from workers.client_socket import addresses
from workers.tls_socket import TLSSocket

log_connection = logging.getLogger("shoal.connection")

TLS_HANDSHAKE_TIMEOUT = 5.0  # RabbitMQ's ssl_handshake_timeout

Connection = Callable[[trio.SocketStream, socket.socket, TLSSocket], Awaitable[None]]


async def serve_tls(stream: trio.SocketStream, sock: socket.socket, context: ssl.SSLContext,
                    connection: Connection, refused: Callable[[], None]) -> None:
    """Serve the accepted ``sock`` as AMQPS: ``connection`` runs the AMQP protocol over the
    session once the handshake is done; ``refused`` is called when it fails (no connection
    was served), after one line in the log."""
    session = TLSSocket(sock, context)
    try:
        with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
            await session.do_handshake()
    except (trio.TooSlowError, OSError) as exc:  # ssl.SSLError is an OSError
        peer, _ = addresses(sock)
        log_connection.warning("TLS handshake of %s failed: %s", peer or "?",
                               exc if str(exc) else "handshake timeout")
        refused()
        with trio.move_on_after(0.5) as scope:
            scope.shield = True
            await stream.aclose()
        return
    await connection(stream, sock, session)
