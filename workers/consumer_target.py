"""A consuming client's subscription, as its worker sees it (the seed's ConsumerTarget).

The target turns what limits a consumer — prefetch credit, channel.flow, a
connection whose socket cannot keep up — into the seed's
``setNotifyWorkDesired`` (an ``Interest`` record), and a notification
(its notify slot set by the supervisor) into pulls (``deliverSingleMessage``)
while it has credit.
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class CreditPool(Protocol):
    """What a target's credit depends on beyond its own counters: its channel's flow, its
    connection's back-pressure and the channel's global prefetch (basic.qos global=true)."""

    @property
    def flow_active(self) -> bool: ...
    @property
    def backpressured(self) -> bool: ...
    @property
    def global_prefetch(self) -> int: ...
    @property
    def consumer_unacked(self) -> int: ...
    @property
    def pull_reserved(self) -> int: ...


C = TypeVar("C", bound=CreditPool)

# Most messages one Pull may ask for: bounds the burst one consumer can take
# from the supervisor in one turn when it has unlimited credit.
PULL_BATCH = 128


class ConsumerTarget(Generic[C]):
    """One basic.consume as its worker sees it (seed: ConsumerTarget): prefetch credit, whether
    the supervisor was told it is interested, whether it was notified, and the pull in flight."""

    __slots__ = (
        "active",
        "browse",
        "channel",
        "id",
        "interested",
        "more",
        "no_ack",
        "notified",
        "prefetch",
        "pulling",
        "queue",
        "renotified",
        "slot",
        "tag",
        "unacked",
    )

    def __init__(
        self, id: int, slot: int, tag: str, channel: C, queue: str, *,
        no_ack: bool, browse: bool, prefetch: int,
    ) -> None:
        self.id = id
        self.slot = slot
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.browse = browse
        self.prefetch = prefetch  # per-consumer basic.qos (global=false) at consume time
        self.unacked = 0
        self.active = False  # consume-ok sent: deliveries may flow
        self.notified = False  # the supervisor set our slot and we have not given it up
        self.pulling = 0  # size of the Pull in flight (one at a time), reserved credit
        self.interested = False  # what the supervisor last heard from us
        # Our slot was set while a pull was in flight. The supervisor keeps a consumer
        # Notified until it answers the pull, so such a notification is newer than that
        # answer (the answer can be read after the slot: events are read before slots,
        # and the supervisor may write both in between) and must survive its "more=False".
        self.renotified = False
        # The last pull came back full and the queue said it had more for us. When credit
        # returns (an ack), we pull with our Interest instead of waiting to be notified: a
        # consumer acking each message from a backlog saves a round trip per message.
        self.more = False

    @property
    def settles_on_delivery(self) -> bool:
        """no-ack consumers and browsers hold nothing once the frame is written."""
        return self.no_ack or self.browse

    def credit(self) -> int:
        """How many messages this consumer may take now (0: not interested)."""
        ch = self.channel
        if not ch.flow_active or ch.backpressured:
            return 0
        n = PULL_BATCH
        if self.settles_on_delivery:
            return n  # AMQP 0-9-1: prefetch limits apply to acknowledged deliveries only
        if self.prefetch:
            n = min(n, self.prefetch - self.unacked)
        if ch.global_prefetch:  # other consumers' pulls in flight hold part of it
            n = min(n, ch.global_prefetch - ch.consumer_unacked - ch.pull_reserved)
        return max(n, 0)
