"""A channel's inbox: the client's methods and publishes that wait, in order, while the channel
cannot run them yet (RabbitMQ runs a channel's methods one at a time).

Two things make a channel wait: a server-named queue.declare, whose "" (AMQP 0-9-1 §1.7.2.1:
the last declared queue) is unknown until its declare-ok names the queue, and a tx.commit of
persistent messages, whose later methods wait until the body log is synced. The channel
(``workers.channel.Channel``) runs what waited when :meth:`Inbox.release` hands it back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from pamqp import base


class HeldPublish(NamedTuple):
    """A publish waiting in the channel's inbox: ``Channel.publish``'s arguments."""

    exchange: str
    routing_key: str
    mandatory: bool
    offset: int
    header_len: int
    body_len: int
    headers: dict[str, Any] | None
    expiration: str | None
    priority: int | None
    body_at: tuple[int, int, int] | None


class Inbox:
    """What waits, in order; ``held`` is None while nothing makes the channel wait."""

    def __init__(self) -> None:
        self.held: deque[base.Frame | HeldPublish] | None = None

    def wait(self) -> None:
        """From now on, methods and publishes wait here."""
        self.held = deque()

    def release(self, run_method: Callable[[base.Frame], None],
                run_publish: Callable[[HeldPublish], None], closing: Callable[[], bool]) -> None:
        """Run what waited, in order, until the channel closes or a method makes it wait again
        (another server-named declare): what is left then waits on, first."""
        held, self.held = self.held, None
        while held and self.held is None and not closing():
            item = held.popleft()
            if isinstance(item, HeldPublish):
                run_publish(item)
            else:
                run_method(item)
        if held and self.held is not None:
            self.held.extendleft(reversed(held))

    def drop(self, free: Callable[[int], None]) -> None:
        """The channel closed: nothing runs, and held publishes' arena blocks are ``free``d."""
        held, self.held = self.held, None
        for item in held or ():
            if isinstance(item, HeldPublish):
                free(item.offset)
