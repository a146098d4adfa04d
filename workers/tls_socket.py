"""An AMQPS connection's socket: TLS on memory BIOs, behind the calls its reader and writer make.

TLS terminates in the worker that owns the connection, in the connection's own reader and
writer. ``TLSSocket`` holds the accepted socket and an ``ssl.SSLObject`` over two
``ssl.MemoryBIO``s, and offers what ``SocketReader`` and ``SocketWriter`` call on a plain
socket -- ``recv``, ``recv_into``, ``send``, ``sendmsg``, ``fileno`` -- with the same
non-blocking meaning: BlockingIOError when nothing can be done until the socket is ready, an
OSError (``ssl.SSLError`` is one) when the connection is broken, no octets at its end. No task,
socket pair or copy stands between the client's socket and the protocol beyond the crypto.

Reading: raw octets are received RAW_RECEIVE at a time into the incoming BIO and decrypted
until the ask is met or the socket has no more. Whole records can then be waiting in the BIO
while the socket itself is not readable: the reader's ``wait_readable`` waits for the socket
only after a read found it empty (``_starved``), else it just lets the other tasks run.

Writing: plaintext is encrypted a batch of parts (up to WRITE_BATCH octets) at a time, small
parts joined into one ``SSLObject.write`` (16 KiB records, not one record per frame), a body's
view encrypted from where it is, and the batch's ciphertext sent with one send().
Ciphertext the socket did not take is held (``_backlog``) and goes first on the next call, and
the plaintext it came from is not reported sent until it has gone (``_ahead``): the writer
offers those octets again (it resends what was not sent) and they count as sent then, without a
second encryption. So "sent" means "in the kernel", as on a plain socket; while ciphertext is
held, a send raises BlockingIOError and the writer waits for the socket to be writable.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import cast

import trio

from workers.codec import Buffer

RAW_RECEIVE = 256 << 10  # ciphertext read from the socket at a time: records are 16 KiB at most
WRITE_BATCH = 256 << 10  # plaintext encrypted per batch, then sent with one send()
RECORD = 16 << 10  # a TLS record's most plaintext: a part this big is a record (or more) itself


# Per worker process, reused by every connection's reads (each is done before the next
# starts): what a read decrypts before it is copied into the bytes it returns, and what a read
# receives before the incoming BIO copies it. Bytes of this size made per read would each be a
# fresh allocation, over glibc's mmap threshold when big.
_PLAINTEXT: list[memoryview] = [memoryview(bytearray(0))]
_CIPHERTEXT: list[memoryview] = [memoryview(bytearray(0))]


def _scratch(size: int, held: list[memoryview] = _PLAINTEXT) -> memoryview:
    """A reusable buffer of at least ``size`` octets."""
    if len(held[0]) < size:
        held[0] = memoryview(bytearray(size))
    return held[0]


class TLSSocket:
    """The server side of one TLS session over a non-blocking socket (see the module's text)."""

    __slots__ = ("_ahead", "_backlog", "_eof", "_incoming", "_outgoing", "_sock", "_ssl",
                 "_starved")

    def __init__(self, sock: socket.socket, context: ssl.SSLContext) -> None:
        self._sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._backlog: memoryview | None = None  # ciphertext the socket has not taken yet
        self._ahead = 0  # plaintext octets whose ciphertext is in the backlog
        self._starved = False  # the last read found the socket empty: wait for it
        self._eof = False  # the client's close_notify or the socket's EOF was read

    def fileno(self) -> int:
        return self._sock.fileno()

    def getpeercert(self) -> dict[str, object] | None:
        """The client's certificate once the handshake checked it (``ssl.SSLObject``)."""
        return self._ssl.getpeercert()  # type: ignore[return-value]

    async def do_handshake(self) -> None:
        """The server's side of the handshake (the caller sets its deadline). An ssl.SSLError
        (its alert is sent first) or an OSError says why it failed."""
        while True:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._send_held()
                while not self._fill():
                    await trio.lowlevel.wait_readable(self._sock)
                continue
            except ssl.SSLError:
                with contextlib.suppress(OSError):
                    self._flush()
                raise
            await self._send_held()  # our Finished; TLS 1.3's session tickets
            return

    def close_notify(self) -> None:
        """Say close_notify, if the socket takes it (the connection is over either way)."""
        with contextlib.suppress(OSError):  # ssl.SSLWantReadError: the client's is not awaited
            self._ssl.unwrap()
        with contextlib.suppress(OSError):
            self._flush()

    # ---------------------------------------------------------------- reading

    async def wait_readable(self, _sock: object = None) -> None:
        """SocketReader's wait: for the socket only when nothing read is left to decrypt."""
        if self._starved:
            await trio.lowlevel.wait_readable(self._sock)
        else:
            await trio.lowlevel.checkpoint()

    def recv(self, size: int) -> bytes:
        """Up to ``size`` octets of plaintext; b"" at the end of the client's input."""
        scratch = _scratch(size)
        return bytes(scratch[: self.recv_into(scratch[:size])])

    def recv_into(self, buffer: memoryview) -> int:
        """Plaintext into ``buffer``; 0 at the end of the client's input."""
        read = self._ssl.read
        # With a buffer, read returns the octets it wrote there (typeshed says bytes).
        return self._decrypt(len(buffer), lambda want, got: cast(int, read(want, buffer[got:])))

    def _decrypt(self, size: int, read_some: Callable[[int, int], int]) -> int:
        """Decrypt up to ``size`` octets with ``read_some(want, got)``, receiving ciphertext
        while records are incomplete; BlockingIOError when none came and the socket is empty."""
        got = 0
        while got < size and not self._eof:
            try:
                n = read_some(size - got, got)
            except ssl.SSLWantReadError:
                if self._fill():
                    continue
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):  # close_notify after ours; a
                n = 0  # socket that ended without one (a ragged end, the end all the same)
            if not n:  # close_notify
                self._eof = True
            got += n
        if self._outgoing.pending:  # what reading made (a TLS 1.3 key update's answer, an alert)
            self._flush()
        if not got and not self._eof:
            raise BlockingIOError
        return got

    def _fill(self) -> bool:
        """Ciphertext from the socket into the incoming BIO; False when it had none."""
        raw = _scratch(RAW_RECEIVE, _CIPHERTEXT)
        try:
            size = self._sock.recv_into(raw)
        except BlockingIOError:
            self._starved = True
            return False
        self._starved = False
        if size:
            self._incoming.write(raw[:size])
        else:
            self._incoming.write_eof()
        return True

    # ---------------------------------------------------------------- writing

    def send(self, data: Buffer) -> int:
        return self.sendmsg([data])

    def sendmsg(self, parts: list[Buffer]) -> int:
        """Encrypt and send ``parts``: the plaintext octets now in the kernel (a prefix of them).
        BlockingIOError while ciphertext of an earlier call is still held."""
        if self._backlog is not None and not self._flush():
            raise BlockingIOError
        skip = self._ahead  # encrypted by an earlier call and gone now: the first octets here
        self._ahead = 0
        sent = skip
        batch: list[Buffer] = []
        size = 0
        for part in parts:
            if skip:
                if skip >= len(part):
                    skip -= len(part)
                    continue
                part = memoryview(part)[skip:]
                skip = 0
            batch.append(part)
            size += len(part)
            if size >= WRITE_BATCH:
                if not self._encrypt(batch, size):
                    return sent
                sent += size
                batch = []
                size = 0
        if batch and self._encrypt(batch, size):
            sent += size
        return sent

    def _encrypt(self, batch: list[Buffer], size: int) -> bool:
        """Encrypt ``batch`` (``size`` octets) and send it; False when the socket did not take
        it all (the rest is held, and the batch counts as ahead)."""
        write = self._ssl.write
        small: list[Buffer] = []  # parts joined into one write: one record, not one per frame
        for part in batch:
            if len(part) < RECORD:
                small.append(part)
                continue
            if small:
                write(b"".join(small))
                small = []
            write(part)  # a body's view: encrypted from where it is, not copied first
        if small:
            write(small[0] if len(small) == 1 else b"".join(small))
        if self._flush():
            return True
        self._ahead = size
        return False

    def _flush(self) -> bool:
        """Send the held ciphertext and what the SSL object made since: True when all went."""
        held: Buffer | None = self._backlog
        if self._outgoing.pending:
            new = self._outgoing.read()
            held = new if held is None else bytes(held) + new
        if held is None:
            return True
        try:
            took = self._sock.send(held)
        except BlockingIOError:
            took = 0
        if took == len(held):
            self._backlog = None
            return True
        self._backlog = memoryview(held)[took:]
        return False

    async def _send_held(self) -> None:
        while not self._flush():
            await trio.lowlevel.wait_writable(self._sock)
