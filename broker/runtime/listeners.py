"""The supervisor's listening sockets: AMQP, AMQPS and the management API's HTTPS port, bound
before anything else is created (a port in use fails the start) and inherited by the workers
(the management process is handed its own)."""

from __future__ import annotations

import socket

from broker.runtime.management_child import ManagementChild
from broker.runtime.serve_config import ServeConfig
from ipc.tls import TLSSettingsError, server_context


def bind(host: str, port: int) -> socket.socket:
    """A non-blocking TCP listener on ``host:port`` (0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def bind_tls(c: ServeConfig) -> socket.socket:
    """The AMQPS listener: the TLS files are loaded once here to check them (ipc.tls; the
    context is dropped at once, the workers load their own), then the port is bound."""
    if not c.tls_cert or not c.tls_key:
        raise TLSSettingsError("--tls-port needs --tls-cert and --tls-key")
    server_context(c.tls_cert, c.tls_key, c.tls_ca or "", verify_peer=c.tls_verify_peer,
                   fail_if_no_peer_cert=c.tls_fail_if_no_peer_cert)
    try:
        return bind(c.host, c.tls_port)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, f"{c.host}:{c.tls_port}") from None


def bind_management_tls(c: ServeConfig, management: ManagementChild | None) -> None:
    """The management API's HTTPS listener (--management-tls-port): its files are checked
    here (the management process loads its own from the paths), then the port is bound; a
    port in use fails the start, as it was asked for."""
    cert, key = c.management_tls_cert or c.tls_cert, c.management_tls_key or c.tls_key
    if not cert or not key:
        raise TLSSettingsError("--management-tls-port needs --tls-cert and --tls-key (or "
                               "--management-tls-cert and --management-tls-key)")
    if not c.management_port:
        raise TLSSettingsError("--management-tls-port needs the management API "
                               "(--management-port is 0)")
    server_context(cert, key, c.management_tls_ca or c.tls_ca or "")
    if management is None:  # the default management port was taken: said already
        return
    host = c.management_host or c.host
    try:
        management.listen_tls(host, c.management_tls_port, cert, key,
                              c.management_tls_ca or c.tls_ca or "")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, f"{host}:{c.management_tls_port}") from None
