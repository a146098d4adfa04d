"""workers.tls_socket: the server side of TLS on memory BIOs, against trio's SSLStream as the
client, over a socket pair with small kernel buffers (so the socket takes writes in parts)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.integration.certs import server_cert
from workers.codec import Buffer
from workers.socket_writer import send_parts, unsent
from workers.tls_socket import TLSSocket

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
SMALL_BUFFER = 16 << 10


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server_cert(tmp_path_factory.mktemp("tls-socket-certs"))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
        end.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


async def _connected(certs: Path, ours: socket.socket, theirs: socket.socket,
                     ) -> tuple[TLSSocket, trio.SSLStream[trio.SocketStream]]:
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certs / "server.pem", certs / "server.key")
    client_context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    tls = TLSSocket(ours, server_context)
    client = trio.SSLStream(trio.SocketStream(trio.socket.from_stdlib_socket(theirs)),
                            client_context, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        await tls.do_handshake()
    return tls, client


async def _receive_all(tls: TLSSocket, size: int, into: bool) -> bytes:
    """What SocketReader does: wait (TLSSocket.wait_readable), read, until ``size`` octets."""
    got = bytearray()
    while len(got) < size:
        await tls.wait_readable()
        try:
            if into:
                room = memoryview(bytearray(min(100_000, size - len(got))))
                n = tls.recv_into(room)
                data = bytes(room[:n])
            else:
                data = tls.recv(64 << 10)
        except BlockingIOError:
            continue
        assert data, "EOF before all the data came"
        got += data
    return bytes(got)


async def _send_all(tls: TLSSocket, parts: list[Buffer]) -> None:
    """What SocketWriter._send_all does: send_parts, then the rest once writable."""
    size = sum(map(len, parts))
    while True:
        sent = send_parts(tls, parts, size, errors=True)
        if sent >= size:
            return
        parts = unsent(parts, sent)
        size -= sent
        await trio.lowlevel.wait_writable(tls)


@pytest.mark.parametrize("into", [False, True], ids=["recv", "recv_into"])
async def test_what_the_client_sends_is_read_in_order(certs: Path, pair: tuple[socket.socket, socket.socket],
                                                      into: bool) -> None:
    """Records received whole or in pieces are decrypted in order, none lost while the
    socket is empty and the BIO still holds some."""
    tls, client = await _connected(certs, *pair)
    data = os.urandom(3 << 20)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, data)
        assert await _receive_all(tls, len(data), into) == data


async def test_parts_the_socket_takes_in_pieces_arrive_whole(certs: Path,
                                                              pair: tuple[socket.socket, socket.socket]) -> None:
    """What the socket does not take is held as ciphertext and counted unsent until it goes:
    the writer's resend of those octets is not encrypted twice."""
    tls, client = await _connected(certs, *pair)
    parts: list[Buffer] = [os.urandom(n) for n in (7, 300_000, 1, 65_536, 5, 2_000_000, 13)]
    parts.extend(memoryview(os.urandom(4096)) for _ in range(50))
    expected = b"".join(parts)
    received = bytearray()

    async def read() -> None:
        while len(received) < len(expected):
            received.extend(await client.receive_some(1 << 20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await _send_all(tls, parts)
    assert bytes(received) == expected


async def test_a_held_backlog_refuses_new_octets(certs: Path,
                                                 pair: tuple[socket.socket, socket.socket]) -> None:
    """While ciphertext is held a send takes nothing (BlockingIOError): the writer waits."""
    tls, _client = await _connected(certs, *pair)
    big = os.urandom(1 << 20)
    assert tls.send(big) < len(big)
    with pytest.raises(BlockingIOError):
        tls.send(b"more")


async def test_close_notify_and_end_of_input(certs: Path, pair: tuple[socket.socket, socket.socket]) -> None:
    """Our close_notify ends the client's input; the client's ends ours (recv gives b"")."""
    tls, client = await _connected(certs, *pair)
    tls.close_notify()
    assert await client.receive_some(100) == b""
    with pytest.raises(BlockingIOError):
        tls.recv(100)
    await client.aclose()
    await tls.wait_readable()
    assert tls.recv(100) == b""


async def test_a_client_gone_without_close_notify_is_the_end_of_input(
        certs: Path, pair: tuple[socket.socket, socket.socket]) -> None:
    """A TCP EOF without close_notify (a ragged end) ends the input all the same."""
    tls, client = await _connected(certs, *pair)
    await client.send_all(b"last words")
    pair[1].shutdown(socket.SHUT_WR)
    assert await _receive_all(tls, 10, into=False) == b"last words"
    await tls.wait_readable()
    assert tls.recv(100) == b""
