"""A connection's output to its socket: the handler's direct send, and the writer task.

The server makes one ``SocketWriter`` per connection, which gives the handler its ``send_now`` as
``wake_writer``. While the writer task is idle (waiting on its doorbell), output is sent from
the caller, on the non-blocking socket: a delivery then costs no task switch and no trip through
trio's ``send_all``. What the socket does not take, and all output while the writer is sending,
goes to the writer task (``run``), which sends it as trio's ``send_all`` would; ``drain`` lets it finish
when the reader is done. Big message bodies reach the socket from their arena blocks (sendmsg),
also when they wait for the writer task: the views are held until the socket took them, and
copied (``seal``) only if a record that may free one of those blocks is about to go to the
supervisor (``ConnectionHandler.seal_held``, called from ``Worker.send``). On an AMQPS
connection the socket is a ``workers.tls_socket.TLSSocket``, which encrypts on the way.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from workers.codec import Buffer
from workers.connection_handler import ConnectionHandler
from workers.tls_socket import TLSSocket

IOV_MAX = 1024  # the most buffers one sendmsg takes (Linux)


def send_parts(sock: socket.socket | TLSSocket, parts: list[Buffer], size: int, errors: bool = False) -> int:
    """Send ``parts`` (``size`` octets in all) on the non-blocking ``sock``, IOV_MAX buffers
    per sendmsg, until the socket takes no more; the octets sent. An error other than a full
    socket is raised with ``errors``, else it ends the sending as a full socket does (the
    writer task meets it again and ends the connection)."""
    sent = 0
    try:
        if len(parts) == 1:
            return sock.send(parts[0])
        for start in range(0, len(parts), IOV_MAX):
            batch = parts if len(parts) <= IOV_MAX else parts[start : start + IOV_MAX]
            want = size - sent if start + IOV_MAX >= len(parts) else sum(map(len, batch))
            took = sock.sendmsg(batch)
            sent += took
            if took < want:
                return sent
    except BlockingIOError:
        return sent
    except OSError:
        if errors:
            raise
        return sent
    return sent


def unsent(parts: list[Buffer], sent: int) -> list[Buffer]:
    """The parts that follow the first ``sent`` octets, the first of them sliced (not copied)."""
    for i, part in enumerate(parts):
        size = len(part)
        if sent < size:
            rest = parts[i:]
            if sent:
                rest[0] = memoryview(part)[sent:]
            return rest
        sent -= size
    return []


def _copied(parts: list[Buffer]) -> list[Buffer]:
    """``parts`` as one bytes (views copied), unless they are that already."""
    if len(parts) == 1 and type(parts[0]) is bytes:
        return parts
    return [b"".join(parts)]


class Doorbell:
    """Wakes a task; rings between waits are folded into one (the task takes all the work
    there is so far)."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def ring(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class SocketWriter:
    """One connection's output: sent at once while the writer task is idle, else by it (on
    ``_sock`` with sendmsg, waiting on it with trio)."""

    __slots__ = (
        "_after_batch",
        "_handler",
        "_sock",
        "bell",
        "busy",
        "drained",
        "last_call",
        "pending",
        "sending",
    )

    def __init__(self, sock: socket.socket | TLSSocket, handler: ConnectionHandler,
                 after_batch: Callable[[], None]) -> None:
        self._sock = sock
        self._handler = handler
        self._after_batch = after_batch  # Worker.after_batch: wake dirty writers, ask for a flush
        self.bell = Doorbell()
        self.last_call = False  # the reader is done: drain, then stop
        self.drained = trio.Event()
        self.busy = True  # the writer is not waiting for a ring (sending, or not started)
        self.pending: list[Buffer] | None = None  # what a direct send left for the writer
        self.sending: list[Buffer] | None = None  # what the writer is sending (_send_all)
        handler.wake_writer = self.send_now
        handler.seal_writer = self.seal

    def send_now(self) -> None:
        """The handler has output: while the writer is idle, send it from here (the socket
        is non-blocking) and wake the writer only for what the socket did not take.

        Big bodies come as views of their arena blocks (``ConnectionHandler.take_parts``):
        they go to the kernel with sendmsg, not copied, and what it did not take waits for the
        writer as it is, views and all (the handler's ``held``; ``seal`` copies them if need
        be). While the writer is busy the output waits in the protocol's buffer."""
        handler = self._handler
        if self.busy or self.last_call:
            if self.last_call:
                handler.seal_output()  # the connection is ending: nothing is held past it
            self.bell.ring()  # the writer is sending: it looks again before it sleeps
            return
        parts = handler.take_parts()
        if not parts:
            return
        size = handler.in_flight
        sent = send_parts(self._sock, parts, size)
        handler.sent(sent)
        if sent < size:
            self.pending = unsent(parts, sent)
            self.busy = True  # until the writer runs: nothing may overtake the rest
            self.bell.ring()
            return
        handler.written()

    def seal(self) -> None:
        """Copy into bytes what the writer holds (a direct send's rest, or what it is sending):
        it may view arena blocks the supervisor is about to be allowed to free."""
        if self.pending is not None:
            self.pending = _copied(self.pending)
        if self.sending is not None:
            self.sending = _copied(self.sending)

    async def run(self) -> None:
        """The writer task: sends what the direct send left, then all output queued since."""
        handler = self._handler
        bell = self.bell
        try:
            while True:
                self.busy = False
                await bell.wait()
                self.busy = True
                pending = self.pending
                if pending is not None:
                    self.pending = None
                    await self._send_all(pending, sum(map(len, pending)))
                # Then what was queued meanwhile. A ring while busy is folded into the one that
                # woke us when it came before we ran (a direct send's rest, then a delivery):
                # that output has no ring of its own left, so it goes now, in the same turn.
                while True:
                    parts = handler.take_parts()
                    if parts:
                        await self._send_all(parts, handler.in_flight)
                    handler.written()
                    self._after_batch()
                    if not handler.proto_has_output():
                        break
                if self.last_call:
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.drained.set()

    async def _send_all(self, parts: list[Buffer], size: int) -> None:
        """trio's ``send_all`` for parts: sendmsg what the socket takes, wait until it is
        writable, on until all is sent. What is left is ``sending`` meanwhile, which ``seal``
        may replace with a copy. An error is trio's BrokenResourceError (the connection ends)."""
        sock = self._sock
        self.sending = parts
        try:
            while True:
                parts = self.sending
                try:
                    sent = send_parts(sock, parts, size, errors=True)
                except OSError as exc:
                    raise trio.BrokenResourceError(str(exc)) from exc
                self._handler.sent(sent)
                if sent >= size:
                    return
                self.sending = unsent(parts, sent)
                size -= sent
                await trio.lowlevel.wait_writable(sock)
        finally:
            self.sending = None

    async def drain(self, grace: float) -> None:
        """The reader is done: let the writer send what is left (close-ok, connection.close),
        never cutting a send_all in half; at most ``grace`` seconds, for dead peers."""
        self.last_call = True
        self.bell.ring()
        with trio.move_on_after(grace):
            await self.drained.wait()
