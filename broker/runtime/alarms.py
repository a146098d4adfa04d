"""Resource alarms (RabbitMQ's): when publishers are blocked, and what each worker is told.

* **Memory**, per worker arena: bytes of messages held in worker k's arena (``region_bytes[k]``,
  kept by the dispatcher as it enqueues and frees) at or above ``high_watermark`` block that
  worker's publishers; below ``low_watermark`` unblocks them (hysteresis: no flapping).
* **Disk**, for the whole broker: the data directory's free space below ``--disk-free-limit``
  blocks every worker's publishers until it is back above (RabbitMQ's ``disk_free_limit``).

A worker is blocked while any alarm concerns it; it is sent ``Blocked`` only when that changes
(connection.blocked reason ``low on disk`` while the disk alarm is on, else ``low on memory``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ipc import records as r

if TYPE_CHECKING:
    from broker.queues.queue import Queue
    from broker.runtime.open_channels import ChannelLedger

log = logging.getLogger("shoal.dispatch")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class Alarms:
    """The memory alarm per worker, the disk alarm, and what each worker was last told."""

    __slots__ = ("_told", "blocked", "disk", "high_watermark", "low_watermark", "queued_full",
                 "queued_high", "queued_low", "region_bytes")

    def __init__(self, workers: int) -> None:
        self.region_bytes = [0] * workers  # bytes of messages held in each worker's arena
        self.high_watermark = 0  # 0: never block publishers for memory
        self.low_watermark = 0
        self.blocked = [False] * workers  # the memory alarm, per worker arena
        self.disk = False  # the data directory's free space is below its limit
        # The supervisor's own memory: messages queued in all queues (a fanout's copies each
        # count) and deliveries not settled (Dispatcher.queued_messages), at which every
        # publisher is blocked, and below which they are unblocked; 0: never. What it holds
        # per queued copy does not scale with the bodies (those are in the arenas): a
        # publisher to a wide fanout grows it by a copy per queue per message.
        self.queued_high = 0
        self.queued_low = 0
        self.queued_full = False
        self._told = [False] * workers

    def reason(self) -> str:
        return "low on disk" if self.disk else "low on memory"

    def told_blocked(self, worker: int) -> bool:
        return self._told[worker]

    def check_memory(self, outbox: list[list[r.Event]]) -> None:
        """Raise or clear each worker's memory alarm (after a batch, on the timer's tick)."""
        changed = False
        for k, held in enumerate(self.region_bytes):
            if self.blocked[k] and held < self.low_watermark:
                self.blocked[k], changed = False, True
                log.warning("memory alarm cleared on worker %d: its arena holds %s, below the low "
                            "watermark %s; its publishers are unblocked", k, _mib(held),
                            _mib(self.low_watermark))
            elif not self.blocked[k] and held >= self.high_watermark:
                self.blocked[k] = changed = True
                log.warning("memory alarm set on worker %d: its arena holds %s, the high watermark "
                            "is %s. *** Its publishers are blocked until the arena falls below %s ***",
                            k, _mib(held), _mib(self.high_watermark), _mib(self.low_watermark))
        if changed:
            self.tell(outbox)

    def check_queued(self, queued: int, outbox: list[list[r.Event]]) -> None:
        """Raise or clear the alarm on the messages queued in the supervisor (``queued``)."""
        if self.queued_full and queued < self.queued_low:
            self.queued_full = False
            log.warning("memory alarm cleared: %d messages queued, below the low watermark %d; "
                        "publishers are unblocked", queued, self.queued_low)
        elif not self.queued_full and queued >= self.queued_high:
            self.queued_full = True
            log.warning("memory alarm set: %d messages queued in all, the high watermark is %d. "
                        "*** Publishers are blocked until fewer than %d are queued ***",
                        queued, self.queued_high, self.queued_low)
        else:
            return
        self.tell(outbox)

    def set_disk(self, active: bool, outbox: list[list[r.Event]]) -> None:
        self.disk = active
        self.tell(outbox)

    def tell(self, outbox: list[list[r.Event]]) -> None:
        """Send ``Blocked`` to each worker whose blocked state changed."""
        told = self._told
        for k, memory in enumerate(self.blocked):
            active = memory or self.disk or self.queued_full
            if active != told[k]:
                told[k] = active
                outbox[k].append(r.Blocked(True, self.reason()) if active else r.Blocked(False))


class QueuedCount:
    """A count of the messages in every queue and the deliveries held by every channel (the
    supervisor's memory alarm), a slice per step over the queues there were when it began, then
    the channels there were when those were done: an alarm needs the order of magnitude, not
    one instant's exact figure."""

    __slots__ = ("at", "channels", "open_channels", "queues", "total")

    def __init__(self, queues: list[Queue], open_channels: Callable[[], list[ChannelLedger]]) -> None:
        self.queues = queues
        self.open_channels = open_channels
        self.channels: list[ChannelLedger] | None = None
        self.at = 0  # into queues, then into channels
        self.total = 0

    def step(self, n: int) -> bool:
        """Count ``n`` more; True once all are counted."""
        if self.channels is None:
            chunk = self.queues[self.at:self.at + n]
            self.total += sum(q.message_count for q in chunk)
            self.at += len(chunk)
            if self.at < len(self.queues) or len(chunk) == n:
                return False
            n -= len(chunk)
            self.channels, self.at = self.open_channels(), 0
        held = self.channels[self.at:self.at + n]
        self.total += sum(len(chan.acquired) for chan in held)
        self.at += len(held)
        return self.at >= len(self.channels)
