"""A connection's output to its socket: the handler's direct send, and the writer task.

The server makes one ``SocketWriter`` per connection and gives the handler its ``send_now`` as
``wake_writer``. While the writer task is idle (waiting on its doorbell), output is sent from
the caller, on the non-blocking socket: a delivery then costs no task switch and no trip through
trio's ``send_all``. What the socket does not take, and all output while the writer is sending,
goes to the writer task (``run``), which sends it with ``send_all``; ``drain`` lets it finish
when the reader is done.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from workers.connection_handler import ConnectionHandler


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
    """One connection's output: sent at once while the writer task is idle, else by it."""

    __slots__ = (
        "_after_batch",
        "_handler",
        "_sock",
        "_stream",
        "bell",
        "busy",
        "drained",
        "last_call",
        "pending",
    )

    def __init__(self, sock: socket.socket, stream: trio.SocketStream, handler: ConnectionHandler,
                 after_batch: Callable[[], None]) -> None:
        self._sock = sock
        self._stream = stream
        self._handler = handler
        self._after_batch = after_batch  # Worker.after_batch: wake dirty writers, ask for a flush
        self.bell = Doorbell()
        self.last_call = False  # the reader is done: drain, then stop
        self.drained = trio.Event()
        self.busy = True  # the writer is not waiting for a ring (sending, or not started)
        self.pending: memoryview | None = None  # what a direct send left for the writer

    def send_now(self) -> None:
        """The handler has output: while the writer is idle, send it from here (the socket
        is non-blocking) and wake the writer only for what the socket did not take."""
        if self.busy or self.last_call:
            self.bell.ring()  # the writer is sending: it looks again before it sleeps
            return
        handler = self._handler
        data = handler.take_output()
        if not data:
            return
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = 0  # the writer's send_all meets the same error and ends the connection
        if sent < len(data):
            self.pending = memoryview(data)[sent:]
            self.busy = True  # until the writer runs: nothing may overtake the rest
            self.bell.ring()
            return
        handler.written()

    async def run(self) -> None:
        """The writer task: sends what the direct send left, or all output while busy."""
        handler = self._handler
        bell = self.bell
        try:
            while True:
                self.busy = False
                await bell.wait()
                self.busy = True
                data = self.pending if self.pending is not None else handler.take_output()
                self.pending = None
                if data:
                    await self._stream.send_all(data)
                handler.written()
                self._after_batch()
                if self.last_call and not handler.proto_has_output():
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.drained.set()

    async def drain(self, grace: float) -> None:
        """The reader is done: let the writer send what is left (close-ok, connection.close),
        never cutting a send_all in half; at most ``grace`` seconds, for dead peers."""
        self.last_call = True
        self.bell.ring()
        with trio.move_on_after(grace):
            await self.drained.wait()
