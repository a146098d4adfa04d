"""A connection's output not yet handed to its socket: frames queued in order, taken as one
bytes or as parts.

``AMQPConnection`` queues every frame it sends here; the runtime takes them (``take_bytes``,
``take_parts``). A big body of a delivery or get-ok is queued as views of its arena block,
never copied in user space, for the runtime to hand the kernel with ``sendmsg``. Such a view
must not outlive the synchronous step that queued it (the block may be freed once the
delivery is settled): the runtime sends it at once or copies it (``seal``).
"""

from __future__ import annotations

from workers.codec import Buffer
from workers.outgoing import BasicGetOk, Deliveries, deliveries_into, get_ok_into


class OutputQueue:
    """Queued output: its parts in order and their size (``unsent_bytes``)."""

    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self.unsent_bytes = 0  # queued in parts (bounded by the runtime: it stops reading)
        # Set by the runtime around a pull's deliveries: where each message's frames end
        # (octets from the start of its Deliveries event), for the body views it holds.
        self.message_ends: list[int] | None = None
        # Index in parts of the first part that may be a view of a body (an arena block,
        # codec.content_into) not yet sent or copied; -1: none (see take_parts).
        self._views_at = -1
        self._big = False  # parts hold a big body (a view, or copied by seal)

    def append(self, data: Buffer) -> None:
        self.parts.append(data)
        self.unsent_bytes += len(data)

    def deliveries(self, event: Deliveries, frame_max: int) -> None:
        """Queue a pull's deliveries as parts, not joined: a big body stays a view of its block."""
        out = self.parts
        start = len(out)
        ends = self.message_ends
        try:
            self.unsent_bytes += deliveries_into(out, event, frame_max, ends)
        except BaseException:  # nothing of the event is queued (unsent_bytes is right)
            del out[start:]
            if ends is not None:
                ends.clear()
            raise
        # A message copied whole is one part; one with its body as views is more.
        if len(out) - start > len(event.messages) and self._views_at < 0:
            self._views_at = start
            self._big = True

    def get_ok(self, event: BasicGetOk, frame_max: int) -> None:
        """Queue a get-ok and its content, a big body as a view of its block."""
        out = self.parts
        start = len(out)
        self.unsent_bytes += get_ok_into(out, event, frame_max)
        if len(out) - start > 1 and self._views_at < 0:
            self._views_at = start
            self._big = True

    def take_bytes(self) -> bytes:
        """Everything queued, as one bytes (copied); the queue is empty again."""
        out = self.parts
        if not out:
            return b""
        # One item (a 256 KiB delivery, say) goes out as it is: joining would copy it.
        data = out[0] if len(out) == 1 and type(out[0]) is bytes else b"".join(out)
        out.clear()
        self._views_at = -1
        self._big = False
        self.unsent_bytes = 0
        return data

    def take_parts(self) -> list[Buffer]:
        """Everything queued, as buffers to send in order: one bytes when no big body is
        queued (small messages cost less joined than as many buffers), else the parts as they
        are, big bodies as views of their arena blocks or as ``seal`` copied them."""
        if not self._big:
            data = self.take_bytes()
            return [data] if data else []
        parts = self.parts
        self.parts = []
        self._views_at = -1
        self._big = False
        self.unsent_bytes = 0
        return parts

    @property
    def holds_views(self) -> bool:
        """Queued output holds views of message bodies (``take_parts``, ``seal``)."""
        return self._views_at >= 0

    def seal(self) -> None:
        """Copy the body views queued since the last call (with the parts after them) into
        bytes: the output may then wait for the socket past the point where the arena blocks
        under them may be freed (a record that allows it is about to go)."""
        start = self._views_at
        if start < 0:
            return
        out = self.parts
        tail = b"".join(out[start:])
        del out[start:]
        out.append(tail)
        self._views_at = -1
