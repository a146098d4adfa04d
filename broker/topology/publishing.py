"""basic.publish through a virtual host: its two fast paths, routing in slices, what it did.

A publish to the default exchange, or to an exchange bound only to plain queues, is enqueued
here without :class:`broker.topology.routing.Router` (the default exchange's bindings are
exactly "each queue by its name"); everything else -- CC / BCC headers, an expiration,
exchange-to-exchange bindings, featured queues that may refuse or drop the message -- is
routed by it and offered queue by queue. A publish routed to more queues than one bounded step
offers it to goes on in slices (:class:`Routing`, :meth:`PublishingHost.route_on`).
:class:`PublishOutcome` is all a confirming channel needs of what happened.

:class:`broker.topology.vhost.VirtualHost` derives from :class:`PublishingHost`, which keeps
none of the virtual host's state: it reads the exchanges, queues and router the virtual host
declares.

Called from: the supervisor process (``broker.runtime.dispatch``, through the virtual host).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from broker.errors import AccessRefused, NotFound
from broker.messages.headers import has_routing_headers
from broker.messages.message import Message, drop_reference
from broker.queues.arguments import parse_expiration
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.featured.queue_kinds import upgrade
from broker.queues.queue import Queue
from broker.topology.exchange import Exchange
from broker.topology.routing import Router
from broker.topology.step_host import StepHost

# basic.return's reply code for a mandatory message routed nowhere (AMQP 0-9-1 §1.8.3.9): a
# reply, not an error -- the channel stays open -- so it has no class in broker.errors.
NO_ROUTE = 312


class PublishOutcome(NamedTuple):
    """What basic.publish did (:meth:`PublishingHost.publish`): all a confirming channel needs.

    RabbitMQ nacks a confirm when any queue refused the message (reject-publish) and acks it
    otherwise; a mandatory return is only for a message routed nowhere (``routed == 0``).
    """

    routed: int  # queues the message was routed to (0: basic.return if mandatory, else free it)
    notify: list[QueueConsumer]  # consumers to notifyWork
    rejected: tuple[str, ...] = ()  # queues that refused it (x-overflow reject-publish*): nack
    dead_lettered: int = 0  # dead-letter copies made on the way (drop-head, reject-publish-dlx)
    # Set when the publish is routed to more queues than ``publish``'s ``limit``: the queues
    # still to come (:meth:`PublishingHost.route_on`). ``notify`` is then this slice's only, and the
    # other fields are the last slice's outcome's.
    routing: Routing | None = None


class Routing:
    """A publish routed to more queues than one bounded step offers it to (a fanout to
    thousands): the queues still to come, ``limit`` at a time (:meth:`PublishingHost.route_on`).

    The queues were chosen when it was published; one deleted meanwhile gets nothing (nor does one
    declared again under its name), one bound meanwhile gets nothing either. The message holds
    one reference of its own until the last queue is offered it, so that a queue acking or
    dropping it meanwhile does not free it.
    """

    __slots__ = ("dead_lettered", "declared", "destinations", "message", "next", "now", "offered",
                 "rejected", "routed")

    def __init__(self, message: Message, destinations: list[Any], now: float | None,
                 declared: int) -> None:
        self.message = message
        self.declared = declared  # queues declared before it was published: a later one is new
        # Queue names (the fast path's, looked up as they come) or Queue objects.
        self.destinations = destinations
        self.next = 0  # index of the next destination
        self.now = now
        self.offered = 0  # destinations offered it in the last slice: the step's work
        self.routed = 0
        self.rejected: list[str] = []
        self.dead_lettered = 0


# tuple.__new__ with every field skips the NamedTuple's generated __new__ (defaults, keywords):
# one is made per publish.
_outcome = tuple.__new__


class PublishingHost(StepHost):
    """The part of a virtual host that basic.publish walks (module docstring)."""

    # The virtual host's (broker.topology.vhost.VirtualHost.__init__).
    name: str
    _exchanges: dict[str, Exchange]
    _router: Router
    _on_drop: Callable[[Message], None] | None
    _featured_queues: int  # queues whose kind is not plain
    _declared: int  # queues declared, ever (Queue.declared)

    def _rs(self, kind: str, name: str) -> str:
        """RabbitMQ ``rs/1``: ``queue 'q' in vhost '/'``, the subject of an error text."""
        return f"{kind} '{name}' in vhost '{self.name}'"


    def publish(self, exchange_name: str, message: Message, *, now: float | None = None,
                limit: int | None = None) -> PublishOutcome:
        """basic.publish: enqueue on every matched queue once; what happened (PublishOutcome).

        With 0 queues nothing references the message and ``on_drop`` is not called: the runtime
        returns it (mandatory) or frees it. Otherwise the domain owns it: if every queue refused
        or at once dropped it, ``on_drop`` has been called. The domain's answer does not depend
        on mandatory, so it is not passed in. Checks, in rabbit_channel's order: the exchange
        exists (404), is not internal (403), the expiration is valid (406), the CC / BCC
        headers are arrays (406, rabbit_basic:message).

        CC / BCC headers (sender-selected distribution) add routing keys; a message with BCC
        becomes a :class:`BlindCopied` (delivered without it). Only a message with headers
        pays for the check: one dict lookup per header name.
        """
        exchange = self._exchanges.get(exchange_name)
        if exchange is None:
            raise NotFound(f"no {self._rs('exchange', exchange_name)}")
        if exchange.internal:
            raise AccessRefused(f"cannot publish to internal {exchange.description}")
        exchange.publish_in += 1  # message statistics: an attribute each, no more
        if message.expiration is not None:
            parse_expiration(message.expiration)
            return self._counted(exchange, self._deliver(
                self._router.route_published(exchange, message), message, now, limit))
        headers = message.headers
        if headers is not None and has_routing_headers(headers):
            return self._counted(exchange, self._deliver(
                self._router.route_published(exchange, message), message, now, limit))
        if exchange_name == "":
            # Hot path: the default exchange's bindings are exactly "each queue by its name".
            queue = self._queues.get(message.routing_key)
            if queue is None:
                return _outcome(PublishOutcome, (0, [], (), 0, None))
            exchange.publish_out += 1
            if queue.plain:
                return _outcome(PublishOutcome, (1, queue.enqueue(message), (), 0, None))
            return self._deliver([queue], message, now)
        if not exchange.routes_only_to_queues or self._featured_queues:
            return self._counted(exchange, self._deliver(
                self._router.route(exchange, message), message, now, limit))
        notify: list[QueueConsumer] = []
        routed = 0
        destinations = exchange.route(message.routing_key, message.headers)
        if limit is not None and len(destinations) > limit:
            exchange.publish_out += len(destinations)  # those deleted meanwhile count too
            return self._begin_routing(list(destinations), message, now, limit)
        for destination in destinations:
            queue = self._queues.get(destination)  # type: ignore[call-overload]
            if queue is not None:
                notify += queue.enqueue(message)
                routed += 1
        exchange.publish_out += routed
        return _outcome(PublishOutcome, (routed, notify, (), 0, None))

    @staticmethod
    def _counted(exchange: Exchange, outcome: PublishOutcome) -> PublishOutcome:
        """``outcome``'s copies are the exchange's publish_out (a split publish's: all of them,
        counted when it begins)."""
        routing = outcome.routing
        exchange.publish_out += outcome.routed if routing is None else len(routing.destinations)
        return outcome

    def _begin_routing(self, destinations: list[Any], message: Message, now: float | None,
                       limit: int) -> PublishOutcome:
        message.refs += 1  # the routing's own, dropped when the last queue has been offered it
        return self.route_on(Routing(message, destinations, now, self._declared), limit)

    def route_on(self, routing: Routing, limit: int | None) -> PublishOutcome:
        """Offer ``routing``'s message to its next ``limit`` queues (None: all that are left),
        as ``publish`` would have. The outcome's ``routing`` is ``routing`` while queues are
        left; the last slice's outcome is the whole publish's."""
        message, now = routing.message, routing.now
        if now is not None:
            self.advance(now)
        before = self.dead_lettered
        destinations = routing.destinations
        start = routing.next
        end = len(destinations) if limit is None else min(start + limit, len(destinations))
        queues, declared = self._queues, routing.declared
        # Those deleted since it was published (and maybe declared again) are left out.
        live = [queue for destination in destinations[start:end]
                if (queue := queues.get(destination) if type(destination) is str else destination)
                is not None and not queue.deleted and queue.declared <= declared]
        notify = self._offer(live, message, now, routing.rejected)
        routing.routed += len(live)
        notify += self.drain()
        routing.next, routing.offered = end, end - start
        routing.dead_lettered += self.dead_lettered - before
        if end < len(destinations):
            return PublishOutcome(0, notify, (), 0, routing)
        if routing.routed:
            drop_reference(message, self._on_drop)
        else:
            message.refs -= 1  # every queue went meanwhile: the runtime returns or frees it
        return PublishOutcome(routing.routed, notify, tuple(routing.rejected),
                              routing.dead_lettered)

    def _offer(self, queues: list[Queue], message: Message, now: float | None,
               rejected: list[str]) -> list[QueueConsumer]:
        """Offer ``message`` to each of ``queues`` (a plain queue meeting its first expiration
        is upgraded); the names of those that refuse it go to ``rejected``. Returns whom to
        wake."""
        notify: list[QueueConsumer] = []
        for queue in queues:
            if message.expiration is not None and queue.plain:
                upgrade(queue)
                self._featured_queues += 1
            taken = queue.offer(message, now)
            if taken is None:
                rejected.append(queue.name)
            else:
                notify += taken
        return notify

    def _deliver(self, queues: list[Queue], message: Message, now: float | None,
                 limit: int | None = None) -> PublishOutcome:
        """Offer to queues that may refuse, drop or dead-letter it at once; then drain."""
        if limit is not None and len(queues) > limit:
            return self._begin_routing(queues, message, now, limit)
        if now is not None:
            self.advance(now)
        before = self.dead_lettered
        rejected: list[str] = []
        # Held while routing: a queue dropping it (drop-head, TTL) must not free it under the
        # queues still to come.
        message.refs += 1
        notify = self._offer(queues, message, now, rejected)
        if queues:
            drop_reference(message, self._on_drop)
        else:
            message.refs -= 1  # unroutable: the runtime returns or frees it
        notify += self.drain()
        return PublishOutcome(len(queues), notify, tuple(rejected), self.dead_lettered - before)
