"""A queue's host: what a queue needs from its virtual host, the work per step, a stand-in host.

Time and the virtual host. The domain reads no clock: a queue asks its *host* (the
VirtualHost, or a standalone stand-in) for the last ``now`` the runtime passed in, tells it of
its next deadline (``schedule``) and hands it messages to dead-letter (``dead_letter``).
:class:`QueueHost` is generic in the queue type so that this module need not import
:mod:`broker.queues.queue`: a queue's host is a ``QueueHost[Queue]``.

Called from: the supervisor process (``broker.queues.queue``; ``broker.topology.step_host`` is
a virtual host's).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

from broker.messages.deadletter import DeadLetterReason
from broker.messages.message import Message
from broker.queues.graveyard import Graveyard, Words

# Work per step (a batch of requests, a timer tick; see broker.topology.step_host), each about 2 ms on the
# project's shared 2-core machine (perf/bench_supervisor_slices.py): entries of purged and
# deleted queues let go of (a message reference dropped, maybe a body freed) ...
REAP_SLICE = 1000
# ... and messages expired or released from hold. A dead-lettered message costs
# DEAD_LETTER_COST of it: its copy is made, routed and enqueued in the same step.
EXPIRE_SLICE = 250
DEAD_LETTER_COST = 4
# ... and dead-letter copies enqueued (a copy to a dead-letter exchange bound to 1,000 queues
# is 1,000 of them, so a few dozen expiring at once are a step's work). What a step leaves waits
# for the next one, in order, and no more messages expire meanwhile.
DEAD_LETTER_SLICE = 2000

_Queue_contra = TypeVar("_Queue_contra", contravariant=True)


class BodyCodec(Protocol):
    """The runtime's body handles as a plain queue may read them (broker.messages.body_ref): a handle's
    body size, and the handle as two unsigned 64-bit words (None: it does not fit) and back."""

    def size(self, ref: Any) -> int: ...

    def words(self, ref: Any) -> tuple[int, int] | None: ...

    def handle(self, lo: int, hi: int) -> Any: ...


class QueueHost(Protocol[_Queue_contra]):
    """What a queue needs from its virtual host (broker.topology.vhost.VirtualHost implements it:
    StepHost)."""

    now: float  # the latest monotonic time the runtime passed in
    epoch_offset: float  # Unix time minus monotonic time
    expire_budget: int  # messages this step may still expire or release from hold
    # The runtime's reading of body handles, which lets a plain queue keep a waiting message as
    # its handle alone (broker.queues.fifo_entries); None: it never does.
    body_codec: BodyCodec | None

    def advance(self, now: float) -> None: ...

    def schedule(self, queue: _Queue_contra, deadline: float) -> None: ...

    def dead_letter(self, queue: _Queue_contra, message: Message, reason: DeadLetterReason) -> None: ...

    def bury(self, items: list[Any], *, pick: int | None = None, keep: int = 0,
             on_drop: Callable[[Message], None] | None, words: Words | None = None) -> None: ...

    def discard(self, container: list[Any] | dict[Any, Any]) -> None: ...


class StandaloneHost:
    """The host of a queue made outside a virtual host: keeps time, has no exchanges.

    Dead-lettered messages have nowhere to go, so they are simply dropped; purged and deleted
    entries are dropped at once.
    """

    def __init__(self, now: float = 0.0, epoch_offset: float = 0.0,
                 body_codec: BodyCodec | None = None) -> None:
        self.now = now
        self.epoch_offset = epoch_offset
        self.body_codec = body_codec
        self.deadlines: dict[Hashable, float] = {}
        self.expire_budget = EXPIRE_SLICE
        self._graveyard = Graveyard()

    def advance(self, now: float) -> None:
        if now > self.now:
            self.now = now
            self.expire_budget = EXPIRE_SLICE

    def schedule(self, queue: Hashable, deadline: float) -> None:
        self.deadlines[queue] = deadline

    def dead_letter(self, queue: object, message: Message, reason: DeadLetterReason) -> None:
        return None

    def bury(self, items: list[Any], *, pick: int | None = None, keep: int = 0,
             on_drop: Callable[[Message], None] | None, words: Words | None = None) -> None:
        self._graveyard.bury(items, pick=pick, keep=keep, on_drop=on_drop, words=words)
        while self._graveyard.reap(1 << 30):
            pass

    def discard(self, container: list[Any] | dict[Any, Any]) -> None:
        return None
