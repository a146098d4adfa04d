"""A channel's delivery tags: the deliveries it holds unacked, and which of them an ack names.

Delivery tags are the channel's: each basic.deliver and basic.get-ok on a channel takes the
next one, from 1. The tag of a delivery the client must still settle maps to the
supervisor's entry id and the consumer target that took it (None for basic.get), in tag order;
basic.ack, basic.nack and basic.reject take tags out of the map (one, every tag up to one with
``multiple``, or all with multiple and tag 0), tx.rollback puts them back. The channel owns one
``DeliveryTags`` and keeps the prefetch counts itself; this only numbers, holds and hands back.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from broker import errors

T = TypeVar("T")  # the consumer target a delivery came through


def unknown_tag(tag: int, ids: tuple[int, int]) -> errors.PreconditionFailed:
    """406 for an ack, nack or reject (``ids``: its class and method ids) naming a delivery tag
    the channel does not hold, in RabbitMQ's words."""
    return errors.PreconditionFailed(f"unknown delivery tag {tag}", *ids)


class DeliveryTags(Generic[T]):
    """The last delivery tag a channel gave, and its unacked deliveries by tag."""

    __slots__ = ("held", "last")

    def __init__(self) -> None:
        self.last = 0
        self.held: OrderedDict[int, tuple[int, T | None]] = OrderedDict()

    def tag(self, entry: int, target: T | None, settled: bool) -> int:
        """The next tag, for a delivery of ``entry``; held until acked unless ``settled``."""
        self.last += 1
        if not settled:
            self.held[self.last] = (entry, target)
        return self.last

    def take(self, tag: int, multiple: bool) -> list[tuple[int, int, T | None]]:
        """(tag, entry, target) of the deliveries an ack/nack/reject names; [] for a tag not
        held (with multiple and tag 0: when nothing is held)."""
        if not multiple:
            held = self.held.pop(tag, None)
            return [] if held is None else [(tag, *held)]
        if tag == 0:  # AMQP 0-9-1 §1.8.3.13: multiple with tag 0 means "all"
            tag = self.last
        elif tag not in self.held:
            return []
        taken = []
        while self.held:
            first = next(iter(self.held))
            if first > tag:
                break
            tag_, held = self.held.popitem(last=False)
            taken.append((tag_, *held))
        return taken

    def give_back(self, settles: list[tuple[int, int, T | None, int]]) -> None:
        """Hold again the deliveries of a rolled-back transaction's settles (tag, entry,
        target, action), in tag order."""
        for tag, entry, target, _ in settles:
            self.held[tag] = (entry, target)
        self.held = OrderedDict(sorted(self.held.items()))
