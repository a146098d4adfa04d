"""A connection's output not yet handed to its socket: frames queued in order, taken as one
bytes or as parts.

``AMQPConnection`` queues every frame it sends here; the runtime takes them (``take_bytes``,
``take_parts``). A big body of a delivery or get-ok is queued as views of its arena block,
never copied in user space, for the runtime to hand the kernel with ``sendmsg``. Such a view
must not outlive the synchronous step that queued it (the block may be freed once the
delivery is settled): the runtime sends it at once or copies it (``seal``).
"""

from __future__ import annotations

from typing import Final

from workers.codec import Buffer
from workers.outgoing import BasicGetOk, Deliveries, deliveries_into, get_ok_into

# What a queued part costs beyond its octets (``OutputQueue.cost``), measured with
# tracemalloc: a bytes is 33 octets of header (sys.getsizeof(b"") == 33) plus its list slot
# (8), 53 octets traced for a 12-octet qos-ok; pymalloc's 16-octet size classes and the
# list's spare slots bring it to about 64. (A memoryview is 184 + 8, but only big bodies are
# queued as views, and their octets dwarf it.)
PART_COST: Final = 64
# Once this many parts are queued (the socket is not taking them: a client that pipelines
# methods and does not read), parts of at most SMALL_PART octets are copied onto one bytearray
# at the end of the queue instead of being kept as objects of their own: 700,000 queued
# qos-ok (8 MiB) cost 8 MiB, not 47. Fewer parts (the usual case: the queue is taken after
# every batch) are never copied, so deliveries to a fast consumer go as before.
COALESCE_AT: Final = 16
SMALL_PART: Final = 512


class OutputQueue:
    """Queued output: its parts in order, their size (``unsent_bytes``) and what they cost in
    memory (``cost``: octets plus PART_COST a part; what the runtime bounds)."""

    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self.unsent_bytes = 0  # queued in parts
        self.cost = 0  # memory the parts take (bounded by the runtime: it stops reading)
        # The bytearray at the end of parts that small parts are copied onto (see COALESCE_AT),
        # or None; ours alone: nobody else holds it while it is queued.
        self._tail: bytearray | None = None
        # Set by the runtime around a pull's deliveries: where each message's frames end
        # (octets from the start of its Deliveries event), for the body views it holds.
        self.message_ends: list[int] | None = None
        # Index in parts of the first part that may be a view of a body (an arena block,
        # codec.content_into) not yet sent or copied; -1: none (see take_parts).
        self._views_at = -1
        self._big = False  # parts hold a big body (a view, or copied by seal)

    def append(self, data: Buffer) -> None:
        out = self.parts
        size = len(data)
        self.unsent_bytes += size
        if size <= SMALL_PART and len(out) >= COALESCE_AT:
            tail = self._tail
            if tail is not None and out[-1] is tail:
                tail += data
                self.cost += size
                return
            tail = bytearray(data)
            self._tail = tail
            data = tail
        out.append(data)
        self.cost += size + PART_COST

    def deliveries(self, event: Deliveries, frame_max: int) -> None:
        """Queue a pull's deliveries as parts, not joined: a big body stays a view of its block."""
        out = self.parts
        start = len(out)
        ends = self.message_ends
        try:
            size = deliveries_into(out, event, frame_max, ends)
        except BaseException:  # nothing of the event is queued (unsent_bytes is right)
            del out[start:]
            if ends is not None:
                ends.clear()
            raise
        self.unsent_bytes += size
        self.cost += size + PART_COST * (len(out) - start)
        # A message copied whole is one part; one with its body as views is more.
        if len(out) - start > len(event.messages) and self._views_at < 0:
            self._views_at = start
            self._big = True

    def get_ok(self, event: BasicGetOk, frame_max: int) -> None:
        """Queue a get-ok and its content, a big body as a view of its block."""
        out = self.parts
        start = len(out)
        size = get_ok_into(out, event, frame_max)
        self.unsent_bytes += size
        self.cost += size + PART_COST * (len(out) - start)
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
        self.cost = 0
        self._tail = None
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
        self.cost = 0
        self._tail = None
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
        self.cost -= PART_COST * (len(out) - start - 1)
        del out[start:]
        out.append(tail)
        self._views_at = -1
        self._tail = None
