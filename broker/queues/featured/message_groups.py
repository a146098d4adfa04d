"""Message groups of a featured queue (Qpid ``qpid.group_header_key``): who may take what.

While a group belongs to one consumer its entries are skipped by the others. An entry of
someone else's group met at the head is parked in that group's own heap (Qpid: "blocked by
message grouping"); when the group is free again its parked entries go back to the queue's
ready heap and one consumer is notified. Shared groups (``qpid.shared_msg_group=1``) belong to
a consumer while it holds unsettled messages of the group; standard groups stay with their
consumer until it goes (Broker-J).

A featured queue holds one of two objects with the same methods: :class:`MessageGroups`, or
:data:`UNGROUPED` for a queue without a group header, which answers "no group" at once. The
queue calls them; it never asks whether it is grouped.

Called from: the supervisor process (``broker.queues.featured.featured_queue``).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from broker.messages.field_tables import freeze
from broker.messages.message import Message
from broker.queues.arguments import QueueSettings
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue_entry import QueueEntry

HeapItem = tuple[int, QueueEntry]


class GetOwner:
    """The owner of the groups one basic.get acquired (Qpid: a one-message subscription)."""

    __slots__ = ()


Owner = QueueConsumer | GetOwner


class Ungrouped:
    """A queue without message groups: nothing is parked, anyone may take anything."""

    __slots__ = ()

    # A higher-priority consumer holds lower ones back (it can take all they could).
    priority_holds_back = True

    def get_owner(self) -> GetOwner | None:
        """Who owns what a basic.get acquires: nobody."""
        return None

    def owner_of(self, message: Message) -> Owner | None:
        """The consumer (or basic.get) whose group ``message`` is in: none."""
        return None

    def park(self, entry: QueueEntry, item: HeapItem) -> bool:
        """Park an entry of an owned group instead of making it ready: never."""
        return False

    def next_heap(self, ready: list[HeapItem], owner: Owner | None) -> list[HeapItem] | None:
        """The heap whose top is ``owner``'s next entry: the ready heap."""
        return ready or None

    def emptied(self, heap: list[HeapItem], entry: QueueEntry) -> None:
        """A parked heap was emptied by taking ``entry`` (never: nothing is parked)."""

    def acquired(self, entry: QueueEntry, owner: Owner | None) -> None:
        """``owner`` acquired ``entry``: nothing to record."""

    def unacquired(self, entry: QueueEntry) -> list[HeapItem] | None:
        """``entry`` was settled or returned; the parked entries of a group it freed: none."""
        return None

    def consumer_gone(self, consumer: QueueConsumer) -> list[list[HeapItem]]:
        """``consumer`` was detached; the parked heaps of the groups that freed: none."""
        return []

    def parked_heaps(self) -> Iterable[list[HeapItem]]:
        """Every parked heap: none."""
        return ()

    def take_parked(self) -> list[list[HeapItem]]:
        """Hand over every parked heap (purge, delete; owners stay): none."""
        return []


UNGROUPED = Ungrouped()


class MessageGroups(Ungrouped):
    """The groups of one queue: each group's owner, its parked entries, its unsettled count."""

    __slots__ = ("_default", "_groups_of", "_header", "_in_flight", "_owner", "_parked", "_shared")

    priority_holds_back = False  # a higher-priority consumer cannot take other owners' groups

    def __init__(self, settings: QueueSettings) -> None:
        assert settings.group_header is not None
        self._header: str = settings.group_header
        self._shared = settings.shared_groups
        self._default: Hashable | None = settings.default_group if settings.shared_groups else None
        self._parked: dict[Hashable, list[HeapItem]] = {}
        self._owner: dict[Hashable, Owner] = {}
        self._groups_of: dict[Owner, dict[Hashable, None]] = {}
        self._in_flight: dict[Hashable, int] = {}

    def get_owner(self) -> GetOwner | None:
        """A basic.get owns the shared groups it acquires until it settles them."""
        return GetOwner() if self._shared else None

    def group(self, message: Message) -> Hashable | None:
        """The message's group: its group header's value, else the default (shared) group."""
        headers = message.headers
        value = headers.get(self._header) if headers else None
        if value is None:
            return self._default
        return freeze(value)

    def owner_of(self, message: Message) -> Owner | None:
        return self._owner.get(self.group(message))

    def park(self, entry: QueueEntry, item: HeapItem) -> bool:
        group = self.group(entry.message)
        if group not in self._owner:
            return False
        heapq.heappush(self._parked.setdefault(group, []), item)
        return True

    def next_heap(self, ready: list[HeapItem], owner: Owner | None) -> list[HeapItem] | None:
        """The heap whose top is ``owner``'s next entry, parking other owners' groups on the way."""
        while ready:
            group = self.group(ready[0][1].message)
            holder = self._owner.get(group)
            if holder is None or holder is owner:
                break
            heapq.heappush(self._parked.setdefault(group, []), heapq.heappop(ready))
        best = ready or None
        for group in self._groups_of.get(owner, ()) if owner is not None else ():
            parked = self._parked.get(group)
            if parked and (best is None or parked[0][0] < best[0][0]):
                best = parked
        return best

    def emptied(self, heap: list[HeapItem], entry: QueueEntry) -> None:
        del self._parked[self.group(entry.message)]

    def acquired(self, entry: QueueEntry, owner: Owner | None) -> None:
        if owner is None:
            return
        group = self.group(entry.message)
        if group is None:
            return
        if group not in self._owner:
            self._owner[group] = owner
            self._groups_of.setdefault(owner, {})[group] = None
        if self._shared:
            self._in_flight[group] = self._in_flight.get(group, 0) + 1

    def unacquired(self, entry: QueueEntry) -> list[HeapItem] | None:
        """A shared group with no unsettled entry left is freed."""
        if not self._shared:
            return None
        group = self.group(entry.message)
        left = self._in_flight.get(group, 0) - 1
        if left > 0:
            self._in_flight[group] = left
            return None
        self._in_flight.pop(group, None)
        return self._free(group)

    def consumer_gone(self, consumer: QueueConsumer) -> list[list[HeapItem]]:
        """A standard group goes with its consumer (Broker-J clearAssignments)."""
        if self._shared or consumer not in self._groups_of:
            return []
        freed = [self._free(group) for group in list(self._groups_of[consumer])]
        return [parked for parked in freed if parked]

    def parked_heaps(self) -> Iterable[list[HeapItem]]:
        return self._parked.values()

    def take_parked(self) -> list[list[HeapItem]]:
        parked = list(self._parked.values())
        self._parked = {}
        return parked

    def _free(self, group: Hashable) -> list[HeapItem] | None:
        """The group may go to anyone again; returns its parked entries (None if not owned)."""
        owner = self._owner.pop(group, None)
        if owner is None:
            return None
        groups = self._groups_of[owner]
        del groups[group]
        if not groups:
            del self._groups_of[owner]
        return self._parked.pop(group, None)


def message_groups(settings: QueueSettings) -> Ungrouped:
    """The groups object for a queue's settings."""
    return MessageGroups(settings) if settings.group_header is not None else UNGROUPED
