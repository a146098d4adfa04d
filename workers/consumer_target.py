"""A consuming client's subscription, as its worker sees it (docs/design.md: Consumer target), and
the credit it draws on.

The target turns what limits a consumer — prefetch credit, channel.flow, a
connection whose socket cannot keep up — into
``setNotifyWorkDesired`` (docs/design.md) (an ``Interest`` record), and a notification
(its notify slot set by the supervisor) into pulls (``deliverSingleMessage``)
while it has credit.

Credit has two owners' worth of counters: the target's own (its unacked deliveries, the pull
it has in flight) and its channel's (flow, basic.qos global=true and what counts against it),
plus one bit of the connection's (its output is backed up). They change together, so one
object changes them: the channel's :class:`ChannelCredit`, which its targets hold and read.
Neither the target nor the credit knows the channel.

:class:`ConsumerTargets` is the worker's registry: ids, the notify slots of its region, and
the targets by slot (a set slot is a notification for the target that holds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

# Most messages one Pull may ask for: bounds the burst one consumer can take
# from the supervisor in one turn when it has unlimited credit.
PULL_BATCH: Final = 128
# Longest a consumer with a backlog waits for half its prefetch to come back before it pulls
# what it has (ConsumerTarget.top_up; the worker's timer, ConsumerTargets.defer).
PULL_DEFER: Final = 0.001


class Backpressure:
    """Whether one connection's output is backed up: set by its connection handler as its
    unsent output crosses the mark, read by the credit of every consumer on the connection."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False


class ChannelCredit:
    """A channel's part of its consumers' credit: channel.flow, basic.qos global=true and what
    counts against it (every consumer's unacked deliveries, the pulls in flight), and the
    connection's back-pressure. The counters shared with a target change here only."""

    __slots__ = ("consumer_unacked", "flow_active", "global_prefetch", "output", "pull_reserved")

    def __init__(self, output: Backpressure) -> None:
        self.output = output
        self.flow_active = True
        self.global_prefetch = 0  # basic.qos global=true: shared by the channel's consumers
        self.consumer_unacked = 0
        self.pull_reserved = 0  # credit held by this channel's pulls in flight

    def pull_sent(self, target: ConsumerTarget, n: int) -> int:
        """A Pull of ``n`` goes out for ``target`` (maybe while another is in flight): its
        number (r.Pull.seq)."""
        target.pull_seq += 1
        target.asks.append(target.pull_seq)
        target.asks.append(n)
        target.pulling += n
        target.reserved += n
        self.pull_reserved += n
        return target.pull_seq

    def pull_answered(self, target: ConsumerTarget, still_open: int = 0, seen: int = 0) -> int:
        """A pull's answer came: what the pulls reserved is back. ``still_open``: the part of
        the standing pulls the supervisor keeps open; ``seen``: the last of our pulls it had
        applied (r.Pulled.seq) -- later ones are still in flight, and what they ask stays
        counted in ``pulling``. Standing pulls reserve nothing of the channel's, as they are
        asked for only without basic.qos global=true (a global prefetch set later may be
        passed by at most that much, once). Returns how much the answered pulls asked for
        (what the supervisor had, less the later ones')."""
        self.pull_reserved -= target.reserved
        target.reserved = 0
        asks = target.asks
        unseen = 0
        if asks:
            i = 0
            while i < len(asks) and asks[i] <= seen:
                i += 2
            del asks[:i]
            for j in range(1, len(asks), 2):
                unseen += asks[j]
        asked = target.pulling - unseen
        target.pulling = still_open + unseen
        return asked

    def held(self, target: ConsumerTarget) -> None:
        """A delivery to ``target`` is held until acked: it counts against prefetch."""
        target.unacked += 1
        self.consumer_unacked += 1

    def settled(self, target: ConsumerTarget) -> None:
        """An unacked delivery of ``target`` was acked, rejected or nacked."""
        target.unacked -= 1
        self.consumer_unacked -= 1


class ConsumerTarget:
    """One basic.consume as its worker sees it (docs/design.md: Consumer target): prefetch credit, whether
    the supervisor was told it is interested, whether it was notified, and the pull in flight.
    ``conn`` and ``ch`` say whose it is; ``pool`` is its channel's credit."""

    __slots__ = (
        "active",
        "asks",
        "awaiting",
        "browse",
        "ch",
        "conn",
        "due",
        "id",
        "interested",
        "more",
        "no_ack",
        "notified",
        "pool",
        "prefetch",
        "pull_seq",
        "pulling",
        "queue",
        "renew",
        "renotified",
        "reserved",
        "slot",
        "tag",
        "top_up",
        "unacked",
    )

    def __init__(
        self, id: int, slot: int, tag: str, pool: ChannelCredit, queue: str, *,
        conn: int = 0, ch: int = 0, no_ack: bool, browse: bool, prefetch: int,
    ) -> None:
        self.id = id
        self.slot = slot
        self.tag = tag
        self.pool = pool
        self.conn = conn
        self.ch = ch
        self.queue = queue
        self.no_ack = no_ack
        self.browse = browse
        self.prefetch = prefetch  # per-consumer basic.qos (global=false) at consume time
        self.unacked = 0
        self.active = False  # consume-ok sent: deliveries may flow
        self.notified = False  # the supervisor set our slot and we have not given it up
        # Asked for and not delivered yet: the pulls in flight and what the supervisor keeps
        # open of standing ones. One pull at a time, except from a backlog (``more``): then the
        # next goes once ``top_up`` is back, before the last is answered.
        self.pulling = 0
        self.pull_seq = 0  # pulls sent (r.Pull.seq)
        self.asks: list[int] = []  # the pulls in flight the supervisor may not have seen: seq, n
        self.reserved = 0  # of it, what the channel's credit holds for it (ChannelCredit)
        self.interested = False  # what the supervisor last heard from us
        # Interested, and no pull of ours answered since we said so: the worker knows nothing
        # of our queue, and a notification may be on its way (basic.qos global=true keeps such
        # a consumer interested while its siblings hold the channel's credit).
        self.awaiting = False
        # Our slot was set while a pull was in flight. The supervisor keeps a consumer
        # Notified until it answers the pull, so such a notification is newer than that
        # answer (the answer can be read after the slot: events are read before slots,
        # and the supervisor may write both in between) and must survive its "more=False".
        self.renotified = False
        # The last pull came back full and the queue said it had more for us. When credit
        # returns (an ack), we pull with our Interest instead of waiting to be notified: a
        # consumer acking each message from a backlog saves a round trip per message.
        self.more = False
        # The last pull was standing and its deliveries used it up (the queue had no more): when
        # credit returns we pull again with our Interest, so that the queue's next message finds
        # a pull open instead of costing a notification and a pull (two more hops).
        self.renew = False
        # Credit to wait for before pulling from a backlog: half the prefetch. A consumer acking
        # each message would otherwise pull one message per ack (Interest, Pull, deliveries,
        # Interest again: four records a message); it waits at most PULL_DEFER for it (``due``
        # once that has passed).
        self.top_up = max(1, min(prefetch, PULL_BATCH) // 2) if prefetch else 1
        self.due = False

    @property
    def settles_on_delivery(self) -> bool:
        """no-ack consumers and browsers hold nothing once the frame is written."""
        return self.no_ack or self.browse

    def credit(self) -> int:
        """How many messages this consumer may take now (0: not interested)."""
        pool = self.pool
        if not pool.flow_active or pool.output.active:
            return 0
        n = PULL_BATCH
        if self.settles_on_delivery:
            return n  # AMQP 0-9-1: prefetch limits apply to acknowledged deliveries only
        if self.prefetch:
            n = min(n, self.prefetch - self.unacked)
        if pool.global_prefetch:  # other consumers' pulls in flight hold part of it
            n = min(n, pool.global_prefetch - pool.consumer_unacked - pool.pull_reserved)
        return max(n, 0)


class ConsumerTargets:
    """A worker's consumer targets: ids, notify slots (one per target, from its region) and
    the targets by id (events name them) and by slot (a set slot names one)."""

    def __init__(self, slots: int) -> None:
        # Targets waiting for credit to come back (ConsumerTarget.top_up) and the worker's timer
        # that pulls for them after PULL_DEFER; without one (``arm_defer`` unset) nothing waits.
        self.deferred: set[ConsumerTarget] = set()
        self.arm_defer: Callable[[], object] | None = None
        self._defer_armed = False
        self.by_id: dict[int, ConsumerTarget] = {}
        self._by_slot: dict[int, ConsumerTarget] = {}
        self._free_slots = list(range(slots - 1, -1, -1))
        self._next_id = 1

    def get(self, target_id: int) -> ConsumerTarget | None:
        return self.by_id.get(target_id)

    def defer(self, target: ConsumerTarget) -> bool:
        """``target`` waits for more credit before pulling: True when a timer will pull for it
        (``take_deferred`` after PULL_DEFER), False when the worker has none (pull now)."""
        arm = self.arm_defer
        if arm is None:
            return False
        self.deferred.add(target)
        if not self._defer_armed:
            self._defer_armed = True
            arm()
        return True

    def take_deferred(self) -> set[ConsumerTarget]:
        """The timer fired: the targets that waited (it is armed again by the next one)."""
        deferred, self.deferred = self.deferred, set()
        self._defer_armed = False
        return deferred

    def by_slot(self, slot: int) -> ConsumerTarget | None:
        return self._by_slot.get(slot)

    def __contains__(self, target_id: int) -> bool:
        return target_id in self.by_id

    def __len__(self) -> int:
        return len(self.by_id)

    def new(self, tag: str, pool: ChannelCredit, queue: str, *, conn: int, ch: int,
            no_ack: bool, browse: bool, prefetch: int) -> ConsumerTarget | None:
        """A target with an id and a free slot; None when every slot is taken."""
        if not self._free_slots:
            return None
        target = ConsumerTarget(self._next_id, self._free_slots.pop(), tag, pool, queue,
                                conn=conn, ch=ch, no_ack=no_ack, browse=browse,
                                prefetch=prefetch)
        self._next_id += 1
        self.by_id[target.id] = target
        self._by_slot[target.slot] = target
        return target

    def drop(self, target: ConsumerTarget, *, closing: bool = False) -> None:
        """Free the target's slot; a target with a pull in flight stays known by id until
        the answer comes (its channel requeues what it brings), unless its channel is
        ``closing`` (the supervisor requeues what the pull took)."""
        if self._by_slot.get(target.slot) is target:
            del self._by_slot[target.slot]
            self._free_slots.append(target.slot)
        if not target.pulling or closing:
            self.by_id.pop(target.id, None)
