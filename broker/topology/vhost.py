"""A virtual host: its exchanges, queues and bindings, with RabbitMQ's declare/delete rules.

Every method maps to one AMQP method the supervisor applies for a worker; each raises the
AMQPError RabbitMQ would reply with, worded as RabbitMQ words it (reply texts are compared by
client test suites and read by people). Where AMQP 0-9-1 is loose, RabbitMQ 3.x/4.x decides:
deleting a missing queue or exchange succeeds, unbinding a missing binding succeeds, an
exclusive queue is never durable, and exclusivity mismatches are 405 RESOURCE_LOCKED.

``owner`` is an opaque connection key (the runtime uses ``(worker, conn)``); exclusive queues
belong to one owner and go with it (:mod:`broker.topology.exclusive_queues`). The bindings *to* each
queue and exchange are indexed (:mod:`broker.topology.binding_index`) so that deleting one is O(those).

Routing is :class:`broker.topology.routing.Router`'s (RabbitMQ ``rabbit_exchange:route``); the virtual
host keeps the two fast paths of basic.publish and says what a publish did in a
:class:`PublishOutcome`.

Time, timers, dead letters and bounded steps -- what the virtual host is to its queues and to
the runtime's timer -- are :class:`broker.topology.step_host.StepHost`'s, which it derives from.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from itertools import islice
from types import MappingProxyType
from typing import Any, NamedTuple

from broker.errors import AccessRefused, NotFound, PreconditionFailed
from broker.messages.field_tables import args_inequivalence, field_inequivalence
from broker.messages.headers import has_routing_headers
from broker.messages.message import Message, drop_reference
from broker.messages.message_journal import MessageJournal
from broker.queues.arguments import QUEUE_ARG_DEFAULTS, QUEUE_ARG_KEYS, check_resource_arg, parse_expiration
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.featured.queue_kinds import make_queue, upgrade
from broker.queues.queue import Queue
from broker.topology.binding_index import BindingIndex
from broker.topology.definitions import TopologyJournal
from broker.topology.exchange import (
    Exchange,
    ExchangeDestination,
    check_exchange_type,
)
from broker.topology.exclusive_queues import ExclusiveQueues
from broker.topology.routing import DeadLetterRouter, Router
from broker.topology.step_host import StepHost

# AMQP 0-9-1 §3.1.3: the default exchange plus the amq.* ones a broker must pre-declare.
STANDARD_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

_DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"

# The bindings to a deleted queue or exchange are removed at once up to this many; more go a
# slice per step (a queue bound 50,000 times to a topic exchange held the supervisor 81 ms).
UNBIND_AT_ONCE = 256
# A closed connection's exclusive queues are deleted at once up to this many; more go a slice per
# step (20,000 held the supervisor 58 ms), each queue counting this many units of the step's work
# (~3 µs a queue against ~1 µs a binding).
CLOSE_AT_ONCE = 256
QUEUE_DELETE_WORK = 4


# basic.return's reply code for a mandatory message routed nowhere (AMQP 0-9-1 §1.8.3.9): a
# reply, not an error -- the channel stays open -- so it has no class in broker.errors.
NO_ROUTE = 312


class PublishOutcome(NamedTuple):
    """What basic.publish did (VirtualHost.publish): all a confirming channel needs.

    RabbitMQ nacks a confirm when any queue refused the message (reject-publish) and acks it
    otherwise; a mandatory return is only for a message routed nowhere (``routed == 0``).
    """

    routed: int  # queues the message was routed to (0: basic.return if mandatory, else free it)
    notify: list[QueueConsumer]  # consumers to notifyWork
    rejected: tuple[str, ...] = ()  # queues that refused it (x-overflow reject-publish*): nack
    dead_lettered: int = 0  # dead-letter copies made on the way (drop-head, reject-publish-dlx)
    # Set when the publish is routed to more queues than ``publish``'s ``limit``: the queues
    # still to come (``VirtualHost.route_on``). ``notify`` is then this slice's only, and the
    # other fields are the last slice's outcome's.
    routing: Routing | None = None


class Routing:
    """A publish routed to more queues than one bounded step offers it to (a fanout to
    thousands): the queues still to come, ``limit`` at a time (``VirtualHost.route_on``).

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


class VirtualHost(StepHost):
    """Exchanges, queues and bindings of one vhost; the supervisor's domain entry point."""

    def __init__(
        self,
        name: str = "/",
        on_drop: Callable[[Message], None] | None = None,
        *,
        epoch_offset: float = 0.0,
        now: float = 0.0,
    ) -> None:
        self.name = name
        self._on_drop = on_drop
        self._exchanges: dict[str, Exchange] = {}
        self._queues: dict[str, Queue] = {}
        self._exclusive = ExclusiveQueues()  # exclusive queues by owner
        self._bindings = BindingIndex()  # destination → the exchanges bound to it
        for exchange_name, type_name in STANDARD_EXCHANGES:
            self._exchanges[exchange_name] = Exchange(exchange_name, type_name, durable=True, vhost=name)
        self._router = self.router = Router(self._exchanges, self._queues)
        # Time, steps, deadlines and dead letters (broker.topology.step_host).
        dead_letters = DeadLetterRouter(self._router, self._exchanges, on_drop)
        super().__init__(dead_letters, now=now, epoch_offset=epoch_offset)
        # Queues whose kind is not plain: while there are none, publishing through an exchange
        # needs no per-queue check.
        self._featured_queues = 0
        # The bindings leading to a deleted queue or exchange go this many at once, the rest a
        # slice per step (_unbind_destination); meanwhile, by the deleted destination (a queue's
        # name, an exchange's ExchangeDestination), the names of the exchanges still holding
        # some (_finish_unbinding).
        self.unbind_at_once = UNBIND_AT_ONCE
        self.close_at_once = CLOSE_AT_ONCE
        self._declared = 0  # queues declared, ever (Queue.declared)
        self._unbinding: dict[Hashable, dict[str, None]] = {}
        # Changes to durable topology for the runtime to write (shoal serve --data-dir);
        # None: nothing is kept (and nothing recorded).
        self.journal: TopologyJournal | None = None
        # Index records of persistent messages on durable queues (shoal serve --data-dir).
        self.messages: MessageJournal | None = None

    @property
    def exchanges(self) -> Mapping[str, Exchange]:
        """Exchanges by name (read-only view)."""
        return MappingProxyType(self._exchanges)

    @property
    def queues(self) -> Mapping[str, Queue]:
        """Queues by name (read-only view)."""
        return MappingProxyType(self._queues)

    def _rs(self, kind: str, name: str) -> str:
        return f"{kind} '{name}' in vhost '{self.name}'"

    # ------------------------------------------------------------------- exchanges

    def exchange(self, name: str) -> Exchange:
        """Look an exchange up; NotFound (404) "no exchange 'x' in vhost '/'"."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no {self._rs('exchange', name)}")
        return exchange

    def declare_exchange(
        self,
        name: str,
        type: str,  # AMQP calls it type
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> Exchange:
        """exchange.declare, with RabbitMQ's checks in RabbitMQ's order (rabbit_channel)."""
        if not passive:
            check_exchange_type(type)
        if name == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        if passive:
            return self.exchange(name)
        exchange = self._exchanges.get(name)
        if exchange is None:
            # AMQP 0-9-1: the amq. prefix is reserved on creation only; redeclaring
            # amq.direct as it is succeeds.
            if name.startswith("amq."):
                raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
            check_resource_arg(arguments, "alternate-exchange", self._rs("exchange", name))
            if self._unbinding:
                self._finish_unbinding(ExchangeDestination(name))
            exchange = Exchange(
                name, type, durable=durable, auto_delete=auto_delete, internal=internal,
                arguments=arguments, vhost=self.name,
            )
            self._exchanges[name] = exchange
            if self.journal is not None:
                self.journal.exchange_created(name, type, durable=durable, auto_delete=auto_delete,
                                              internal=internal, arguments=exchange.arguments)
            return exchange
        diff = exchange.inequivalent_arg(
            type, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
        )
        if diff is not None:
            raise diff.error(exchange.description)
        return exchange

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """exchange.delete; deleting a missing exchange succeeds (RabbitMQ ensure_deleted)."""
        if name == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        if name.startswith("amq."):
            raise AccessRefused(f"deletion of system {self._rs('exchange', name)} not allowed")
        exchange = self._exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.has_bindings:
            # Bindings to deleted queues and exchanges not removed yet do not count.
            for destination in [d for d, sources in self._unbinding.items() if name in sources]:
                self._finish_unbinding(destination)
            if self._exchanges.get(name) is not exchange:
                return  # that was its last binding: auto-deleted
            if exchange.has_bindings:
                raise PreconditionFailed(f"{exchange.description} in use")
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self._exchanges[exchange.name]
        if self.journal is not None:
            self.journal.removed("exchange", exchange.name, durable=exchange.durable)
        # Its own bindings go a slice per step (an exchange bound 50,000 times held the
        # supervisor 54 ms): nothing routes through it from now on, and until then the reverse
        # index may still name it as a source of its destinations (see _unbind_deleted).
        if exchange.has_bindings:
            self.defer(partial(self._unbind_deleted, exchange))
        # RabbitMQ remove_for_destination: bindings to it go too, and may auto-delete sources.
        self._unbind_destination(ExchangeDestination(exchange.name),
                                 self._bindings.pop_sources(exchange.name, to_exchange=True))

    def _unbind_deleted(self, exchange: Exchange, n: int) -> int:
        """Up to ``n`` bindings of the deleted ``exchange`` go; the reverse index forgets it as a
        source of each destination left with none, unless an exchange declared again under its
        name is bound there by then. Returns how many went.

        Meanwhile the index may name a source that is gone (or is a new exchange not bound
        there): who reads it (a queue or exchange deleted) finds no binding to remove in it."""
        count, unbound = exchange.unbind_some(n)
        name = exchange.name
        current = self._exchanges.get(name)
        for destination in unbound:
            if current is not None and current.is_bound(destination):
                continue
            if type(destination) is ExchangeDestination:
                self._bindings.unbound(name, destination.name, to_exchange=True)
            else:
                self._bindings.unbound(name, str(destination), to_exchange=False)
        return count

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        # An auto-delete exchange goes when its last binding -- to a queue or an exchange --
        # does (RabbitMQ conditional_delete: no bindings with it as the source).
        if (exchange.auto_delete and not exchange.has_bindings
                and self._exchanges.get(exchange.name) is exchange):
            self._remove_exchange(exchange)

    def bind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """exchange.bind: messages ``source`` routes by this binding go on through ``destination``.

        Binding twice is a no-op. The default exchange can be neither end (403); a missing end
        is 404, the source first (rabbit_binding call_with_source_and_destination).
        """
        if destination == "" or source == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        src = self.exchange(source)
        dst = self.exchange(destination)
        if src.bind(ExchangeDestination(destination), routing_key, arguments):
            self._bindings.bound(source, destination, to_exchange=True)
            if self.journal is not None:
                self.journal.bound(source, destination, routing_key, arguments, to_exchange=True,
                                   durable=src.durable and dst.durable)

    def unbind_exchange(
        self,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """exchange.unbind; may auto-delete the source.

        As RabbitMQ 3.10 (rabbit_binding absent_errs_only): unbinding what is not bound, or
        naming an exchange that does not exist, succeeds; the default exchange is still 403.
        """
        if destination == "" or source == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        src = self._exchanges.get(source)
        as_destination = ExchangeDestination(destination)
        if src is None or not src.unbind(as_destination, routing_key, arguments):
            return
        if self.journal is not None:
            dst = self._exchanges.get(destination)
            self.journal.unbound(source, destination, routing_key, arguments, to_exchange=True,
                                 durable=src.durable and dst is not None and dst.durable)
        if not src.is_bound(as_destination):
            self._bindings.unbound(source, destination, to_exchange=True)
        self._maybe_auto_delete(src)


    # ---------------------------------------------------------------------- queues

    def declare_queue(
        self,
        name: str,
        *,
        owner: Hashable,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        now: float | None = None,
        reserved: bool = False,
    ) -> Queue:
        """queue.declare: create, or check an existing queue is equivalent (rabbit_channel).

        ``reserved``: the broker itself names an ``amq.*`` queue (direct reply-to).

        A new queue's arguments are validated (406 ``invalid arg ...``) and pick its kind. Any
        declare of an existing queue, passive or not, restarts its x-expires lease.
        """
        if now is not None:
            self.advance(now)
        if passive:
            found = self.queue(name, owner=owner)
            found.touch()
            return found
        if name == "":
            name = self._server_name()
        elif name.startswith("amq.") and not reserved:
            # Unlike exchanges, RabbitMQ checks this even when the queue exists.
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        # RabbitMQ: an exclusive queue is never durable (it dies with its connection).
        durable = durable and not exclusive
        queue = self._queues.get(name)
        if queue is None:
            return self._create_queue(name, owner, durable, exclusive, auto_delete, arguments)
        self._exclusive.check(queue, owner if exclusive else None, strict=True)
        diff = (
            field_inequivalence("durable", durable, queue.durable)
            or field_inequivalence("auto_delete", auto_delete, queue.auto_delete)
            or args_inequivalence(arguments, queue.arguments, QUEUE_ARG_KEYS, QUEUE_ARG_DEFAULTS)
        )
        if diff is not None:
            raise diff.error(queue.description)
        queue.touch()
        return queue

    def _server_name(self) -> str:
        # RabbitMQ rabbit_guid: "amq.gen-" + 16 random bytes, base64url without padding.
        while True:
            name = "amq.gen-" + secrets.token_urlsafe(16)
            if name not in self._queues:
                return name

    def _create_queue(
        self,
        name: str,
        owner: Hashable,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any] | None,
    ) -> Queue:
        if self._unbinding:
            self._finish_unbinding(name)
        queue = make_queue(
            name, durable=durable, exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete, arguments=arguments, on_drop=self._on_drop, vhost=self.name,
            host=self,
        )
        self._queues[name] = queue
        self._declared += 1
        queue.declared = self._declared
        self._featured_queues += not queue.plain
        if durable and self.messages is not None:
            queue.store = self.messages
        if self.journal is not None:
            self.journal.queue_created(name, durable=durable, auto_delete=auto_delete,
                                       arguments=queue.arguments)
        if exclusive:
            self._exclusive.add(owner, name)
        # AMQP 0-9-1 §3.1.3.1: every queue is bound to the default exchange by its name.
        self._exchanges[""].bind(name, name, None)
        self._bindings.bound("", name, to_exchange=False)
        return queue

    def restore_message(self, name: str, message: Message, redelivered: bool,
                        enqueued_at: float) -> bool:
        """A persistent message comes back at start (broker.storage.message_store) onto durable queue
        ``name``, as enqueued at Unix time ``enqueued_at``; False if there is no such queue."""
        queue = self._queues.get(name)
        if queue is None or not queue.durable:
            return False
        if message.expiration is not None and queue.plain:
            upgrade(queue)
            self._featured_queues += 1
        queue.restore(message, redelivered=redelivered, now=enqueued_at - self.epoch_offset)
        return True

    def queue(self, name: str, *, owner: Hashable) -> Queue:
        """Look a queue up for consume/get/purge/bind: NotFound (404) or ResourceLocked (405)."""
        queue = self._queues.get(name)
        if queue is None:
            raise NotFound(f"no {self._rs('queue', name)}")
        self._exclusive.check(queue, owner, strict=False)
        return queue

    def purge_queue(self, name: str, *, owner: Hashable) -> int:
        """queue.purge: drop the available messages; returns how many.

        The queue is empty at once; their bodies are freed a slice per step (module docstring).
        """
        return self.queue(name, owner=owner).purge()

    def delete_queue(
        self,
        name: str,
        *,
        owner: Hashable,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> tuple[int, list[QueueConsumer]]:
        """queue.delete: ``(message count, consumers to cancel)``; a missing queue is ``(0, [])``."""
        queue = self._queues.get(name)
        if queue is None:
            return 0, []  # RabbitMQ 3.x: delete-ok for a queue that is not there
        self._exclusive.check(queue, owner, strict=False)
        if if_unused and queue.consumer_count:
            raise PreconditionFailed(f"{queue.description} in use")
        if if_empty and queue.message_count:
            raise PreconditionFailed(f"{queue.description} not empty")
        count = queue.message_count
        return count, self._delete_queue(queue)

    def _delete_queue(self, queue: Queue) -> list[QueueConsumer]:
        self._timers.cancel(queue)
        self._featured_queues -= not queue.plain
        # Routes through the bindings still going find no queue by its name from now on.
        self._unbind_destination(queue.name, self._bindings.pop_sources(queue.name, to_exchange=False))
        del self._queues[queue.name]
        if self.journal is not None:
            self.journal.removed("queue", queue.name, durable=queue.durable)
        if queue.exclusive_owner is not None:
            self._exclusive.remove(queue)
        return queue.delete()

    def _unbind_destination(self, destination: Hashable, sources: dict[str, None]) -> None:
        """A queue (its name) or an exchange (its ExchangeDestination) is deleted; ``sources``
        name the exchanges bound to it (taken out of the reverse index). Their bindings to it go,
        ``unbind_at_once`` of them now and the rest a slice per step (a queue bound 50,000 times
        held the supervisor 81-95 ms), each source auto-deleting after its last (RabbitMQ
        remove_for_destination). Until then routes through them lead nowhere: no queue or
        exchange has that name, and one declared under it first has them removed at once."""
        if not sources:
            return
        self._unbind_from(destination, sources, self.unbind_at_once)
        if sources:
            self._unbinding[destination] = sources
            self.defer(partial(self._unbind_pending, destination, sources))

    def _unbind_pending(self, destination: Hashable, sources: dict[str, None], n: int) -> int:
        """A step's slice of :meth:`_unbind_destination`; none once they were removed at once
        (_finish_unbinding): the bindings to that name now are a new queue's or exchange's."""
        if self._unbinding.get(destination) is not sources:
            return 0
        done = self._unbind_from(destination, sources, n)
        if not sources:
            del self._unbinding[destination]
        return done

    def _unbind_from(self, destination: Hashable, sources: dict[str, None], n: int | None) -> int:
        """Remove up to ``n`` (None: all) bindings to the deleted ``destination`` from the
        exchanges named in ``sources``, dropping each name once its exchange holds none; a
        name with no exchange (deleted: its own bindings go with it, _unbind_deleted) counts
        one. Returns the work done."""
        done = 0
        exchanges = self._exchanges
        while sources and (n is None or done < n):
            name, _ = sources.popitem()
            exchange = exchanges.get(name)
            if exchange is None:
                done += 1
                continue
            removed = exchange.unbind_destination(destination, None if n is None else n - done)
            done += removed or 1
            if exchange.is_bound(destination):
                sources[name] = None  # the rest of its bindings first, next time
            elif removed:
                self._maybe_auto_delete(exchange)
        return done

    def _finish_unbinding(self, destination: Hashable) -> None:
        """Remove now what is left of the bindings to the deleted ``destination`` (a queue or
        exchange is declared under its name, which they must not lead to; an exchange.delete
        if-unused)."""
        sources = self._unbinding.pop(destination, None)
        if sources:
            self._unbind_from(destination, sources, None)

    def queues_owned_by(self, owner: Hashable) -> list[Queue]:
        """Exclusive queues declared by ``owner``."""
        return [self._queues[name] for name in self._exclusive.names(owner)]

    def delete_owned_queues(
        self, owner: Hashable, on_cancel: Callable[[list[QueueConsumer]], object] | None = None,
        *, at_once: bool = False,
    ) -> list[QueueConsumer]:
        """Delete ``owner``'s exclusive queues (its connection closed); returns their consumers.

        Past ``close_at_once`` of them, they go a slice per step instead (the first in this
        one), ``on_cancel`` getting their consumers (if any) as they go; meanwhile they are the
        closed connection's still, which no other connection is (its key is never reused
        while its worker lives), so using one is 405 RESOURCE_LOCKED, as from RabbitMQ until
        the queue has seen its owner go. ``at_once``: all now (a dead worker's connections,
        whose keys its replacement numbers from 1 again)."""
        if at_once or len(self._exclusive.names(owner)) <= self.close_at_once:
            return self._delete_owned(owner, None)
        self.defer(partial(self._delete_owned_slice, owner, on_cancel))
        return []

    def _delete_owned(self, owner: Hashable, n: int | None) -> list[QueueConsumer]:
        """Delete ``owner``'s first ``n`` exclusive queues (None: all); their consumers."""
        names = self._exclusive.names(owner)
        consumers: list[QueueConsumer] = []
        for name in list(names if n is None else islice(names, n)):
            consumers += self._delete_queue(self._queues[name])
        return consumers

    def _delete_owned_slice(self, owner: Hashable,
                            on_cancel: Callable[[list[QueueConsumer]], object] | None, n: int) -> int:
        """A step's slice of a closed connection's exclusive queues (the graveyard's work, in
        units of QUEUE_DELETE_WORK a queue); none once they went at once (a dead worker)."""
        before = len(self._exclusive.names(owner))
        consumers = self._delete_owned(owner, -(-n // QUEUE_DELETE_WORK))
        if consumers and on_cancel is not None:
            on_cancel(consumers)
        return QUEUE_DELETE_WORK * (before - len(self._exclusive.names(owner)))

    def remove_consumer(self, queue: Queue | str, consumer: QueueConsumer) -> list[QueueConsumer]:
        """Detach a consumer; an auto-delete queue goes with its last one. Returns whom to wake.

        seed 001 "Removal": "if the queue is of auto-delete type and the subscription being
        removed is the last subscription attached to the queue, then the queue needs to be
        deleted".
        """
        target = queue if isinstance(queue, Queue) else self._queues.get(queue)
        if target is None:
            return []
        notify = target.remove_consumer(consumer)
        if target.should_auto_delete and self._queues.get(target.name) is target:
            self._delete_queue(target)
            return []
        return notify

    # -------------------------------------------------------------------- bindings

    def bind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        owner: Hashable,
    ) -> None:
        """queue.bind; binding twice is a no-op. The default exchange refuses bindings (403)."""
        exchange, queue = self._binding_ends(queue_name, exchange_name, owner)
        if exchange.bind(queue.name, routing_key, arguments):
            self._bindings.bound(exchange.name, queue.name, to_exchange=False)
            if self.journal is not None:
                self.journal.bound(exchange.name, queue.name, routing_key, arguments, to_exchange=False,
                                   durable=exchange.durable and queue.durable)

    def unbind_queue(
        self,
        queue_name: str,
        exchange_name: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        owner: Hashable,
    ) -> None:
        """queue.unbind; may auto-delete the exchange.

        As RabbitMQ 3.10 (rabbit_binding:remove, absent_errs_only): unbinding what is not bound,
        or naming an exchange or a queue that does not exist (an auto-delete queue gone with its
        last consumer, say, and its exchange with it: aio-pika's RPC.close), succeeds; the
        default exchange is still 403 and someone else's exclusive queue 405.
        """
        if exchange_name == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        exchange = self._exchanges.get(exchange_name)
        if exchange is None or queue_name not in self._queues:
            return
        queue = self.queue(queue_name, owner=owner)
        if not exchange.unbind(queue.name, routing_key, arguments):
            return
        if self.journal is not None:
            self.journal.unbound(exchange.name, queue.name, routing_key, arguments, to_exchange=False,
                                 durable=exchange.durable and queue.durable)
        if not exchange.is_bound(queue.name):
            self._bindings.unbound(exchange.name, queue.name, to_exchange=False)
        self._maybe_auto_delete(exchange)

    def _binding_ends(self, queue_name: str, exchange_name: str, owner: Hashable) -> tuple[Exchange, Queue]:
        # rabbit_channel binding_action_with_checks: default exchange first, then existence
        # (source before destination), then exclusive access to the queue.
        if exchange_name == "":
            raise AccessRefused(_DEFAULT_EXCHANGE_REFUSED)
        exchange = self.exchange(exchange_name)
        return exchange, self.queue(queue_name, owner=owner)

    # ------------------------------------------------------------------ publishing

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
        if message.expiration is not None:
            parse_expiration(message.expiration)
            return self._deliver(self._router.route_published(exchange, message), message, now,
                                 limit)
        headers = message.headers
        if headers is not None and has_routing_headers(headers):
            return self._deliver(self._router.route_published(exchange, message), message, now,
                                 limit)
        if exchange_name == "":
            # Hot path: the default exchange's bindings are exactly "each queue by its name".
            queue = self._queues.get(message.routing_key)
            if queue is None:
                return _outcome(PublishOutcome, (0, [], (), 0, None))
            if queue.plain:
                return _outcome(PublishOutcome, (1, queue.enqueue(message), (), 0, None))
            return self._deliver([queue], message, now)
        if not exchange.routes_only_to_queues or self._featured_queues:
            return self._deliver(self._router.route(exchange, message), message, now, limit)
        notify: list[QueueConsumer] = []
        routed = 0
        destinations = exchange.route(message.routing_key, message.headers)
        if limit is not None and len(destinations) > limit:
            return self._begin_routing(list(destinations), message, now, limit)
        for destination in destinations:
            queue = self._queues.get(destination)  # type: ignore[call-overload]
            if queue is not None:
                notify += queue.enqueue(message)
                routed += 1
        return _outcome(PublishOutcome, (routed, notify, (), 0, None))

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
