"""Paging: persistent message bodies out of the arenas when a worker's arena passes its mark.

RabbitMQ pages queued messages to disk once memory passes a fraction of the memory high
watermark (``vm_memory_high_watermark_paging_ratio``, 0.5) and blocks publishers only at the
watermark itself; its classic queues v2 keep only a window of each queue in memory. Here a
persistent message (delivery_mode 2, ``--data-dir``) has its header and body in its worker's
body log before it is queued (``Message.stored``, ``broker.message_journal``), so paging it out
writes nothing: the supervisor frees its arena block and marks its handle paged
(``broker.body_ref.paged_body_ref``). A delivery of a paged message names where its body is on
disk (``Delivery.stored``) and the consumer's worker reads it from there
(``workers.arenas.Arenas``). The body log keeps the segment as long as the message lives.

Which go first: the newest of the arena's persistent messages, the farthest from any queue's
head and so the last to be delivered. A worker's arena holding more than ``high`` bytes of
queued messages is paged down to ``low`` (hysteresis), checked after every batch.

Transient messages are not paged: nothing of theirs is on disk, and writing them there is the
next step; until then a backlog of transient messages still ends in the memory alarm.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from broker.body_ref import paged_body_ref, unpack_body_ref
from broker.message import Message

log = logging.getLogger("shoal.paging")

# Paging starts at this fraction of the memory high watermark (RabbitMQ's
# vm_memory_high_watermark_paging_ratio) and goes on down to PAGING_LOW of that mark.
PAGING_RATIO = 0.5
PAGING_LOW = 0.9
_COMPACT_MIN = 1024  # a pageable list shorter than this is never compacted


class Pager:
    """Per worker arena: the persistent messages whose bodies are still in it, newest last,
    and the marks between which their bodies are paged out."""

    __slots__ = ("_free", "_live", "_pageable", "high", "low", "paged", "paging", "region_bytes")

    def __init__(self, region_bytes: list[int], free: Callable[[int, int, int], None]) -> None:
        self.region_bytes = region_bytes  # the dispatcher's: bytes of messages held per arena
        self._free = free  # (region, offset, size): hand an arena block back
        # Messages registered per arena (some since gone: compacted when they are the most).
        self._pageable: list[deque[Message]] = [deque() for _ in region_bytes]
        self._live = [0] * len(region_bytes)  # of those, still held with their body in the arena
        self.high = 0  # 0: paging off (no --data-dir, so nothing could be read back)
        self.low = 0
        self.paged = 0  # bodies paged out so far
        self.paging = [False] * len(region_bytes)  # per arena: paged since it last emptied

    def set_marks(self, high_watermark: int, ratio: float = PAGING_RATIO) -> None:
        """Page above ``ratio`` of the memory high watermark (0: never)."""
        self.high = int(high_watermark * ratio)
        self.low = int(self.high * PAGING_LOW)

    def add(self, region: int, message: Message) -> None:
        """A persistent message was queued with its body in ``region``'s arena."""
        if self.high:
            self._pageable[region].append(message)
            self._live[region] += 1

    def dropped(self, region: int) -> None:
        """A registered message went (its last reference) with its body still in the arena."""
        if not self.high:
            return
        live = self._live[region] = self._live[region] - 1
        pageable = self._pageable[region]
        if len(pageable) > _COMPACT_MIN and len(pageable) > 2 * live:
            self._pageable[region] = deque(m for m in pageable if m.refs > 0 and m.body_ref >= 0)

    def check(self) -> int:
        """Page out every arena over the mark, down to the low mark; how many went."""
        paged = 0
        if self.high:
            for region, held in enumerate(self.region_bytes):
                if held > self.high:
                    if not self.paging[region]:
                        self.paging[region] = True
                        log.info("worker %d: its arena holds %s, past the paging mark %s: "
                                 "persistent message bodies are paged out to the data directory",
                                 region, _mib(held), _mib(self.high))
                    paged += self._page_out(region)
                elif self.paging[region] and held < self.low // 2:
                    self.paging[region] = False
                    log.info("worker %d: paging stopped, its arena holds %s", region, _mib(held))
        return paged

    def _page_out(self, region: int) -> int:
        pageable = self._pageable[region]
        region_bytes = self.region_bytes
        paged = 0
        while region_bytes[region] > self.low and pageable:
            message = pageable.pop()
            ref = message.body_ref
            if message.refs <= 0 or ref < 0:  # gone already (counted then), or paged
                continue
            _, offset, header_len, body_len = unpack_body_ref(ref)
            message.body_ref = paged_body_ref(ref)
            self._live[region] -= 1
            region_bytes[region] -= header_len + body_len
            self._free(region, offset, header_len + body_len)
            paged += 1
        self.paged += paged
        return paged


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
