"""Paging: message bodies out of the arenas when a worker's arena passes its mark.

RabbitMQ pages queued messages to disk once memory passes a fraction of the memory high
watermark (``vm_memory_high_watermark_paging_ratio``, 0.5) and blocks publishers only at the
watermark itself; its classic queues v2 keep only a window of each queue in memory. Shoal does
the same per worker arena, with the data directory's body logs as the place bodies go:

- a **persistent** message (delivery_mode 2) has its header and body in its worker's body log
  before it is queued (``Message.stored``, ``broker.messages.message_journal``): paging it out writes
  nothing; its arena block is freed at once;
- a **transient** one is written there first: the supervisor pins it (one reference, so its
  block stays put), asks the worker that holds it to append it to its body log (``PageOut``),
  and frees the block when the worker says where it went (``PagedOut``). It is never synced and
  never in the index: a restart forgets it, as it must.

A paged message's handle says where its body is (``broker.messages.body_ref.paged_body_ref``); a
delivery names that place (``Delivery.stored``) and the consumer's worker reads the body back
(``workers.arenas.Arenas``). The body log keeps a segment while a message paged into it lives
(``MessageJournal.segment_used`` / ``segment_released``).

Which go first: the newest messages of the arena, the farthest from any queue's head and so the
last to be delivered. An arena holding more than ``high`` bytes of queued messages is paged down
to ``low`` (hysteresis), checked after every batch.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from broker.messages.body_ref import paged_body_ref, unpack_body_ref
from broker.messages.message import Message

log = logging.getLogger("shoal.paging")

# Paging starts at this fraction of the memory high watermark (RabbitMQ's
# vm_memory_high_watermark_paging_ratio) and goes on down to PAGING_LOW of that mark.
PAGING_RATIO = 0.5
PAGING_LOW = 0.9
_COMPACT_MIN = 1024  # a pageable list shorter than this is never compacted
PAGE_OUT_BATCH = 512  # most transient bodies one PageOut asks a worker to write


class Pager:
    """Per worker arena: the queued messages whose bodies are still in it, newest last, the
    transient ones being written out, and the marks between which bodies are paged out."""

    __slots__ = ("_account", "_compact_at", "_free", "_in_flight", "_leaving", "_pageable",
                 "_unpin", "_viewed", "high", "low", "paged", "paging", "region_bytes")

    def __init__(self, region_bytes: list[int], free: Callable[[int, int, int], None],
                 unpin: Callable[[Message], None] = lambda m: None,
                 account: Callable[[int, int], None] = lambda worker, segment: None,
                 viewed: Callable[[Message], bool] = lambda m: False) -> None:
        self.region_bytes = region_bytes  # the dispatcher's: bytes of messages held per arena
        self._free = free  # (region, offset, size): hand an arena block back
        self._unpin = unpin  # drop the reference a transient page-out held
        self._account = account  # (worker, segment): a message now lives in that segment
        # A delivery of the message is held (broker.runtime.open_channels): its block stays, as a
        # worker's unsent output may view it (ipc.records.VIEWED_BODY_MIN); paged later.
        self._viewed = viewed
        # Messages registered per arena, oldest first (some since gone or paged: dropped when
        # the list doubles since it was last compacted).
        self._pageable: list[deque[Message]] = [deque() for _ in region_bytes]
        self._compact_at = [_COMPACT_MIN] * len(region_bytes)
        # Transient messages a worker is writing out: (region, offset) -> message (pinned).
        self._in_flight: dict[tuple[int, int], Message] = {}
        self._leaving = [0] * len(region_bytes)  # bytes of those, per arena
        self.high = 0  # 0: paging off (no --data-dir: nowhere to page to)
        self.low = 0
        self.paged = 0  # bodies paged out so far
        self.paging = [False] * len(region_bytes)  # per arena: paged since it last emptied

    def set_marks(self, high_watermark: int, ratio: float = PAGING_RATIO) -> None:
        """Page above ``ratio`` of the memory high watermark (0: never)."""
        self.high = int(high_watermark * ratio)
        self.low = int(self.high * PAGING_LOW)

    def registers(self, region: int, size: int = 0) -> bool:
        """Whether a message queued now with its body in ``region``'s arena is registered
        (``size``: its header and body, when the arena's count does not hold them yet): only
        once the arena holds half the low mark. What came before is at most that many
        bytes, nearest the queues' heads, and a broker whose consumers keep up pays one
        comparison a message. The dispatcher asks before it makes the message: a plain one
        that will be registered is a ``PageableMessage`` (``broker.queues.fifo_entries``)."""
        return bool(self.high) and self.region_bytes[region] + size >= self.low >> 1

    def add(self, region: int, message: Message) -> None:
        """A message was queued with its body in ``region``'s arena: registered if
        :meth:`registers` says so."""
        if self.registers(region):
            self.register(region, message)

    def register(self, region: int, message: Message) -> None:
        """Register a message queued with its body in ``region``'s arena (newest last)."""
        pageable = self._pageable[region]
        pageable.append(message)
        if len(pageable) >= self._compact_at[region]:
            pageable = self._pageable[region] = deque(
                m for m in pageable if m.refs > 0 and m.body_ref >= 0)
            self._compact_at[region] = 2 * len(pageable) + _COMPACT_MIN

    def check(self) -> dict[int, list[tuple[int, int, int]]]:
        """Page out every arena over the mark, down to the low mark. Persistent bodies go at
        once; what is returned is, per region, the transient bodies (offset, header_len,
        body_len) its worker must write out (``PageOut``)."""
        requests: dict[int, list[tuple[int, int, int]]] = {}
        if not self.high:
            return requests
        for region, held in enumerate(self.region_bytes):
            if held - self._leaving[region] > self.high:
                if not self.paging[region]:
                    self.paging[region] = True
                    log.info("worker %d: its arena holds %s, past the paging mark %s: message "
                             "bodies are paged out to the data directory", region, _mib(held),
                             _mib(self.high))
                writes = self._page_out(region)
                if writes:
                    requests[region] = writes
            elif self.paging[region] and held < self.low // 2:
                self.paging[region] = False
                log.info("worker %d: paging stopped, its arena holds %s", region, _mib(held))
        return requests

    def _page_out(self, region: int) -> list[tuple[int, int, int]]:
        pageable = self._pageable[region]
        region_bytes = self.region_bytes
        leaving = self._leaving
        writes: list[tuple[int, int, int]] = []
        viewed = self._viewed
        delivering: list[Message] = []  # passed over this time, looked at again next time
        while (region_bytes[region] - leaving[region] > self.low and pageable
               and len(writes) < PAGE_OUT_BATCH):
            message = pageable.pop()
            ref = message.body_ref
            if message.refs <= 0 or ref < 0:  # gone already, or paged
                continue
            if viewed(message):
                delivering.append(message)
                continue
            _, offset, header_len, body_len = unpack_body_ref(ref)
            stored = message.stored
            if stored is not None:  # persistent: already in its worker's body log
                self._release(region, message, stored[1], stored[2], stored[3])
                continue
            message.refs += 1  # pinned: its block stays until the worker has written it
            self._in_flight[(region, offset)] = message
            leaving[region] += header_len + body_len
            writes.append((offset, header_len, body_len))
        pageable.extendleft(delivering)  # the oldest end: the last to be looked at again
        return writes

    def _release(self, region: int, message: Message, worker: int, segment: int,
                 at: int) -> None:
        """``message``'s body is at (worker, segment, at) in the body log: free its block."""
        _, offset, header_len, body_len = unpack_body_ref(message.body_ref)
        message.body_ref = paged_body_ref(region, header_len, body_len, worker, segment, at)
        self.region_bytes[region] -= header_len + body_len
        self._free(region, offset, header_len + body_len)
        self.paged += 1

    def paged_out(self, region: int, written: list[tuple[int, int, int]]) -> None:
        """Worker ``region`` wrote these transient bodies out: (arena offset, segment, offset
        in it; segment -1: the write failed and the body stays in the arena)."""
        for offset, segment, at in written:
            message = self._in_flight.pop((region, offset), None)
            if message is None:
                continue
            _, _, header_len, body_len = unpack_body_ref(message.body_ref)
            self._leaving[region] -= header_len + body_len
            if message.refs > 1 and self._viewed(message):
                # Delivered meanwhile: a worker's output may view the block. What was written
                # is not used; the message is paged again later if it stays queued.
                self._pageable[region].appendleft(message)
            elif segment >= 0 and message.refs > 1:  # still queued besides our pin
                self._account(region, segment)
                self._release(region, message, region, segment, at)
            elif segment < 0:
                self._pageable[region].appendleft(message)  # tried again after the others
            self._unpin(message)

    def worker_gone(self, region: int) -> None:
        """Worker ``region`` died: the page-outs it was asked for will not be answered."""
        for key in [key for key in self._in_flight if key[0] == region]:
            message = self._in_flight.pop(key)
            self._pageable[region].appendleft(message)
            self._unpin(message)
        self._leaving[region] = 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
