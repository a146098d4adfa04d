"""The dispatcher's open channels: each channel's consumers and unsettled deliveries.

A channel is ``(worker, conn, ch)``; a consumer is ``(worker, consumer id)``, subscribed on one
channel to one queue. What a channel holds is what must go back when it, its connection or its
whole worker goes away: the entries it acquired (requeued to their original positions) and the
browsers' pins (a browsed message's body, kept until the worker has copied it). Delivery ids are
the entry ids for acquired entries and negative numbers for pins, so one map holds both.

The dispatcher holds one :class:`OpenChannels` and does what closing means to the domain
(removing consumers, requeueing, unpinning); this module only keeps the books. That includes
what closed channels held and the dispatcher has not requeued yet (:class:`Returning`): a
channel without prefetch can hold millions of deliveries, and they go back a slice per step.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from broker.messages.body_ref import arena_block, body_log_at, unpack_body_ref, unpack_paged_ref
from broker.messages.message import Message, delivered_headers
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue import Queue
from broker.queues.queue_entry import QueueEntry
from ipc import records as r

ChannelKey = tuple[int, int, int]  # (worker, conn, ch)
ConnectionKey = tuple[int, int]  # (worker, conn): who owns an exclusive queue


class Pin:
    """A browser's delivery in flight: holds the message's body until the
    worker has copied it (browsers do not acquire, so nothing else would)."""

    __slots__ = ("message",)

    def __init__(self, message: Message) -> None:
        self.message = message


Held = QueueEntry | Pin  # what a channel holds per delivery id


class ChannelLedger:
    """One channel's unsettled deliveries (delivery id → what it holds) and consumer ids;
    ``closed`` once the channel is (its consumers may still be on their queues, going a slice
    per step: see :class:`Detaching`)."""

    __slots__ = ("acquired", "closed", "consumers")

    def __init__(self) -> None:
        self.acquired: dict[int, Held] = {}
        self.consumers: set[int] = set()
        self.closed = False


class Subscription:
    """A consumer on a queue, the channel it was started on, and that channel's books
    (``chan``: set by :meth:`OpenChannels.subscribe`)."""

    __slots__ = ("chan", "channel", "consumer", "pull_seq", "queue")

    def __init__(self, consumer: QueueConsumer, queue: Queue, channel: ChannelKey) -> None:
        self.consumer = consumer
        self.queue = queue
        self.channel = channel
        self.chan: ChannelLedger = _NO_CHANNEL
        self.pull_seq = 0  # the consumer's last Pull applied (r.Pull.seq), told in each Pulled


_NO_CHANNEL = ChannelLedger()  # a Subscription's until it is subscribed


class Detaching:
    """A closed channel's consumers still on their queues, which the dispatcher takes off a
    slice per step: ``cids[at:]`` are still to go (:meth:`OpenChannels.forget`)."""

    __slots__ = ("at", "chan", "cids", "worker")

    def __init__(self, worker: int, chan: ChannelLedger) -> None:
        self.worker = worker
        self.chan = chan
        self.cids = sorted(chan.consumers)
        self.at = 0


class Returning:
    """What a closed channel held (its ``acquired``, no longer changed by anyone), going back
    in delivery order: ``rest`` iterates what is still to requeue or unpin, ``done`` counts
    what went."""

    __slots__ = ("done", "held", "rest", "worker")

    def __init__(self, worker: int, held: dict[int, Held]) -> None:
        self.worker = worker
        self.held = held
        self.rest = iter(held.values())
        self.done = 0

    def left(self) -> Iterator[Held]:
        """What is still to go (without taking it)."""
        return itertools.islice(self.held.values(), self.done, None)


class OpenChannels:
    """Every worker's open channels and their consumers, and each connection's channels."""

    __slots__ = ("_channels", "_conns", "_pin_ids", "_viewed", "returning", "subs", "users")

    def __init__(self) -> None:
        self.subs: dict[tuple[int, int], Subscription] = {}  # (worker, consumer id) →
        # Deliveries held of each message with a body of VIEWED_BODY_MIN octets or more (by
        # the id() of the message that owns the body): a worker's unsent output may view its
        # arena block, so the pager leaves it there (``viewed``).
        self._viewed: dict[int, int] = {}
        self._channels: dict[ChannelKey, ChannelLedger] = {}
        self._conns: dict[ConnectionKey, set[int]] = {}  # the channel numbers each connection used
        self.users: dict[ConnectionKey, str] = {}  # who logged in on each (topic permissions)
        self._pin_ids = itertools.count(-1, -1)
        # Closed channels' deliveries still held, oldest channel first (the dispatcher
        # requeues them a slice per step): they count as held until they have gone.
        self.returning: deque[Returning] = deque()

    def channel(self, key: ChannelKey) -> ChannelLedger:
        """The ledger of channel ``key``, opened here on its first use."""
        chan = self._channels.get(key)
        if chan is None:
            chan = self._channels[key] = ChannelLedger()
            self._conns.setdefault(key[:2], set()).add(key[2])
        return chan

    def get(self, key: ChannelKey) -> ChannelLedger | None:
        return self._channels.get(key)

    def open_channels(self) -> list[ChannelLedger]:
        """Every open channel, as they are now (O(channels))."""
        return list(self._channels.values())

    def connection_opened(self, owner: ConnectionKey, user: str = "") -> None:
        self._conns.setdefault(owner, set())
        if user:
            self.users[owner] = user

    def user_of(self, owner: ConnectionKey) -> str | None:
        """Who logged in on connection ``owner`` (topic permissions); None: not known."""
        return self.users.get(owner)

    def connections_on(self, worker: int) -> set[ConnectionKey]:
        """The connections of ``worker`` known here."""
        return {o for o in self._conns if o[0] == worker}

    def close_connection(self, owner: ConnectionKey) -> list[int]:
        """Forget connection ``owner``; returns its channel numbers, in order, to close."""
        self.users.pop(owner, None)
        return sorted(self._conns.pop(owner, ()))

    def close(self, key: ChannelKey) -> ChannelLedger | None:
        """Forget channel ``key``; returns it (None if it held nothing) for the caller to
        release its consumers (:class:`Detaching`, :meth:`forget`) and what it held; marked
        ``closed``."""
        chans = self._conns.get(key[:2])
        if chans is not None:
            chans.discard(key[2])
        chan = self._channels.pop(key, None)
        if chan is not None:
            chan.closed = True
        return chan

    # ------------------------------------------------------------ consumers

    def subscribe(self, worker: int, cid: int, sub: Subscription) -> None:
        self.subs[(worker, cid)] = sub
        sub.chan = self.channel(sub.channel)
        sub.chan.consumers.add(cid)

    def unsubscribe(self, worker: int, cid: int) -> Subscription | None:
        """Consumer ``cid`` of ``worker`` is gone (cancelled, or its queue went away)."""
        sub = self.subs.pop((worker, cid), None)
        if sub is not None:
            sub.chan.consumers.discard(cid)
        return sub

    def forget(self, worker: int, cid: int, chan: ChannelLedger) -> Subscription | None:
        """Consumer ``cid`` of closed channel ``chan``: its subscription, forgotten (None if a
        queue deleted meanwhile took it)."""
        key = (worker, cid)
        sub = self.subs.get(key)
        if sub is None or sub.chan is not chan:
            return None
        del self.subs[key]
        return sub

    # ----------------------------------------------------------- deliveries

    def acquire(self, chan: ChannelLedger, entry: QueueEntry, *, basic_get: bool = False) -> r.Delivery:
        """``chan`` holds ``entry`` until it is settled (``released``); the delivery to send."""
        chan.acquired[entry.id] = entry
        message = entry.message
        if message.body_size >= r.VIEWED_BODY_MIN:
            self._view(message)
        return delivery(entry.id, entry, basic_get=basic_get)

    def pin(self, chan: ChannelLedger, entry: QueueEntry) -> r.Delivery:
        """A browser's delivery: ``chan`` holds a reference to the message until settled."""
        pin_id = next(self._pin_ids)
        message = entry.message
        message.refs += 1
        chan.acquired[pin_id] = Pin(message)
        if message.body_size >= r.VIEWED_BODY_MIN:
            self._view(message)
        return delivery(pin_id, entry)

    def released(self, held: Held) -> None:
        """A channel no longer holds ``held`` (settled, or requeued as its channel closed)."""
        message = held.message
        if message.body_size >= r.VIEWED_BODY_MIN:
            key = id(message.origin or message)
            left = self._viewed[key] - 1
            if left:
                self._viewed[key] = left
            else:
                del self._viewed[key]

    def _view(self, message: Message) -> None:
        key = id(message.origin or message)
        self._viewed[key] = self._viewed.get(key, 0) + 1

    def viewed(self, message: Message) -> bool:
        """A channel holds a delivery of ``message``'s body (of it or of a copy sharing it):
        its worker's unsent output may still view the arena block, which must stay."""
        return id(message.origin or message) in self._viewed

    def held_offsets(self, region: int) -> Iterator[int]:
        """Arena offsets in ``region`` of the messages the channels hold, closed channels'
        not yet returned included."""
        helds: list[Iterable[Held]] = [chan.acquired.values() for chan in self._channels.values()]
        helds += [ret.left() for ret in self.returning]
        for held in itertools.chain.from_iterable(helds):
            message = held.message
            block = arena_block((message.origin or message).body_ref)  # None: paged out
            if block is not None and block[0] == region:
                yield block[1]


def delivery(entry_id: int, entry: QueueEntry, *, basic_get: bool = False) -> r.Delivery:
    """The Delivery record of ``entry`` under delivery id ``entry_id``."""
    message = entry.message
    root = message.origin or message  # a dead-letter copy's body is its origin's
    ref = root.body_ref
    headers = entry.queue.delivery_headers(entry, basic_get=basic_get)
    if ref < 0:  # paged out (broker.storage.paging): the worker reads it from the body log
        return _paged_delivery(entry_id, entry, ref, headers)
    region, offset, header_len, body_len = unpack_body_ref(ref)
    if headers is None:
        return r.Delivery(
            entry_id, entry.redelivered, message.exchange, message.routing_key,
            region, offset, header_len, body_len,
        )
    # A re-encoded header never carries BCC (sender-selected distribution: a message
    # published with BCC is a BlindCopied, always re-encoded; so are its dead-letter copies).
    return r.Delivery(
        entry_id, entry.redelivered, message.exchange, message.routing_key,
        region, offset, header_len, body_len, True, delivered_headers(headers),
        message.expiration,
    )


def _paged_delivery(entry_id: int, entry: QueueEntry, ref: int,
                    headers: dict[str, Any] | None) -> r.Delivery:
    message = entry.message
    region, header_len, body_len, _, _, _ = unpack_paged_ref(ref)
    return r.Delivery(
        entry_id, entry.redelivered, message.exchange, message.routing_key,
        region, 0, header_len, body_len, headers is not None,
        None if headers is None else delivered_headers(headers),
        None if headers is None else message.expiration, body_log_at(ref),
    )
