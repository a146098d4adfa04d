"""The dispatcher's accounts of the workers' arenas: bytes held per arena, blocks handed back.

A message's body stays in its publisher's arena (``(region, offset, header_len, body_len)``)
until the last reference to the message goes: then :meth:`ArenaAccounts.drop` hands the block
back (``free_body``) and takes its size off the arena's count, which the memory alarm reads.
A worker whose arena had no room for a publish waits for ``ArenaFreed`` once enough is freed.
A body paged out to a body log (``broker.storage.paging``) holds its segment instead.

Called from: the supervisor process (``broker.runtime.dispatch`` and its parts).
"""

from __future__ import annotations

from collections.abc import Callable

from broker.messages.body_ref import arena_block, body_log_at, unpack_body_ref
from broker.messages.message import Message
from broker.runtime.open_channels import OpenChannels
from broker.topology.vhosts import VirtualHosts
from ipc import records as r


class ArenaAccounts:
    """Bytes held per arena, blocks to hand back, and the workers waiting for room."""

    __slots__ = ("_arena_freed", "_arena_need", "_channels", "_free_body", "outbox",
                 "region_bytes", "vhosts")

    def __init__(self, vhosts: VirtualHosts, channels: OpenChannels, region_bytes: list[int],
                 outbox: list[list[r.Event]], free_body: Callable[[int, int], None]) -> None:
        self.vhosts = vhosts
        self._channels = channels
        self.region_bytes = region_bytes  # the alarms' (broker.runtime.alarms.Alarms)
        self.outbox = outbox
        self._free_body = free_body
        # A worker whose arena had no room for a publish: bytes it waits for, bytes freed since.
        workers = len(outbox)
        self._arena_need = [0] * workers
        self._arena_freed = [0] * workers

    def drop(self, message: Message) -> None:
        """The last reference to ``message`` went: its body is let go of."""
        journal = self.vhosts.messages
        if message.stored is not None and journal is not None:
            journal.body_dropped(message.stored)
        ref = message.body_ref
        if ref < 0:  # paged out: nothing left in the arena
            if message.stored is None and journal is not None:  # a transient one
                worker, segment, _, _ = body_log_at(ref)
                journal.segment_released(worker, segment)
            return
        region, offset, header_len, body_len = unpack_body_ref(ref)
        self.region_bytes[region] -= header_len + body_len
        self.free(region, offset, header_len + body_len)

    def free(self, region: int, offset: int, size: int) -> None:
        """Hand an arena block back; wake its worker if a publish there waits for room."""
        self._free_body(region, offset)
        if self._arena_need[region]:
            self._arena_freed[region] += size
            if self._arena_freed[region] >= self._arena_need[region]:
                self._arena_need[region] = 0
                self.outbox[region].append(r.ArenaFreed())

    def paged_body(self, worker: int, segment: int) -> None:
        """A transient body was paged out to ``worker``'s body log segment ``segment``."""
        if self.vhosts.messages is not None:
            self.vhosts.messages.segment_used(worker, segment)

    def arena_wait(self, worker: int, rec: r.ArenaWait) -> None:
        """``worker``'s arena had no room for ``rec.size`` bytes: tell it once that is freed."""
        self._arena_need[worker] = rec.size
        self._arena_freed[worker] = 0

    def worker_gone(self, worker: int) -> None:
        self._arena_need[worker] = 0

    def live_offsets(self, region: int) -> set[int]:
        """Arena offsets in ``region`` still referenced by a queue or a channel, or by a
        purged or deleted queue's entry whose body is not freed yet (it will be, once)."""
        live: set[int] = set()
        refs = [ref for q in self.vhosts.queues() for ref in q.body_refs()]
        refs.extend(self.vhosts.buried_body_refs())
        for ref in refs:
            block = arena_block(ref)
            if block is not None and block[0] == region:  # None: paged out
                live.add(block[1])
        live.update(self._channels.held_offsets(region))
        return live
