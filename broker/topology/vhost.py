"""A virtual host: its exchanges, queues and bindings, with RabbitMQ's declare/delete rules.

Every method maps to one AMQP method the supervisor applies for a worker; each raises the
AMQPError RabbitMQ would reply with, worded as RabbitMQ words it (reply texts are compared by
client test suites and read by people). Where AMQP 0-9-1 is loose, RabbitMQ 3.x/4.x decides:
deleting a missing queue or exchange succeeds, unbinding a missing binding succeeds, an
exclusive queue is never durable, and exclusivity mismatches are 405 RESOURCE_LOCKED.

``owner`` is an opaque connection key (the runtime uses ``(worker, conn)``); exclusive queues
belong to one owner and go with it (:mod:`broker.topology.exclusive_queues`).

The virtual host is this module's declare/delete rules and the parts it derives from, each a
module of its own (as Broker-J's ``virtualhost/`` and LavinMQ's ``vhost``):

* bindings, and the bindings of deleted queues and exchanges going a slice per step:
  :class:`broker.topology.bindings.BindingHost`;
* basic.publish, its fast paths and routing in slices (:class:`PublishOutcome`):
  :class:`broker.topology.publishing.PublishingHost` (routing itself is
  :class:`broker.topology.routing.Router`'s, RabbitMQ ``rabbit_exchange:route``);
* time, timers, dead letters and bounded steps -- what the virtual host is to its queues and to
  the runtime's timer: :class:`broker.topology.step_host.StepHost`.

Called from: the supervisor process (``broker.runtime.dispatch``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from itertools import islice
from types import MappingProxyType
from typing import Any

from broker.errors import AccessRefused, AMQPError, NotFound, PreconditionFailed
from broker.messages.field_tables import args_inequivalence, field_inequivalence
from broker.messages.message import Message
from broker.messages.message_journal import MessageJournal, journal_for
from broker.queues.arguments import (
    QUEUE_ARG_DEFAULTS,
    QUEUE_ARG_KEYS,
    check_resource_arg,
    parse_queue_arguments,
)
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.featured.queue_kinds import make_queue, upgrade
from broker.queues.queue import Queue
from broker.queues.sliced_work import SlicedWork
from broker.topology.binding_index import BindingIndex
from broker.topology.bindings import DEFAULT_EXCHANGE_REFUSED, BindingHost
from broker.topology.definitions import TopologyJournal
from broker.topology.exchange import Exchange, ExchangeDestination, check_exchange_type
from broker.topology.exclusive_queues import ExclusiveQueues
from broker.topology.policies import (
    Policy,
    PolicyTable,
    effective_alternate,
    effective_queue_arguments,
    merged_definition,
)
from broker.topology.publishing import NO_ROUTE, PublishingHost, PublishOutcome, Routing
from broker.topology.routing import DeadLetterRouter, Router

__all__ = ["NO_ROUTE", "PublishOutcome", "Routing", "VirtualHost"]  # the runtime's names for a publish

# AMQP 0-9-1 §3.1.3: the default exchange plus the amq.* ones a broker must pre-declare.
STANDARD_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

# The bindings to a deleted queue or exchange are removed at once up to this many; more go a
# slice per step (docs/design.md, "Bounded step": a queue may be bound tens of thousands of times).
UNBIND_AT_ONCE = 256
# A closed connection's exclusive queues are deleted at once up to this many; more go a slice per
# step (a connection may own tens of thousands), each queue counting this many units of the
# step's work (deleting a queue costs about what unbinding four bindings does).
CLOSE_AT_ONCE = 256
QUEUE_DELETE_WORK = 4


class VirtualHost(BindingHost, PublishingHost):
    """Exchanges, queues and bindings of one vhost; the supervisor's domain entry point."""

    def __init__(
        self,
        name: str = "/",
        on_drop: Callable[[Message], None] | None = None,
        *,
        epoch_offset: float = 0.0,
        now: float = 0.0,
        sliced: SlicedWork | None = None,
    ) -> None:
        self.name = name
        # What rabbitmqctl add_vhost and PUT /api/vhosts/{name} say of it (list_vhosts).
        self.description = ""
        self.tags: list[str] = []
        self.default_queue_type = "undefined"  # rabbitmqctl's word for none given
        self.deleted = False  # delete_all: gone with everything in it
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
        super().__init__(dead_letters, now=now, epoch_offset=epoch_offset, sliced=sliced)
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
        # Index records of persistent messages on durable queues (shoal serve --data-dir):
        # the broker's one journal (``messages``) and, for this vhost's queues, its view that
        # names them with the vhost (``_queue_store``).
        self._messages: MessageJournal | None = None
        self._queue_store: MessageJournal | None = None
        # Policies (broker.topology.policies), and which apply to each queue and exchange:
        # (kind, name) -> (policy, operator policy), for those some policy applies to.
        self.policies = PolicyTable()
        self.applied: dict[tuple[str, str], tuple[Policy | None, Policy | None]] = {}

    @property
    def messages(self) -> MessageJournal | None:
        """The index records' journal (shoal serve --data-dir), shared by every vhost."""
        return self._messages

    @messages.setter
    def messages(self, journal: MessageJournal | None) -> None:
        self._messages = journal
        self._queue_store = None if journal is None else journal_for(journal, self.name)
        for queue in self._queues.values():
            if queue.durable:
                queue.store = self._queue_store

    @property
    def exchanges(self) -> Mapping[str, Exchange]:
        """Exchanges by name (read-only view)."""
        return MappingProxyType(self._exchanges)

    @property
    def queues(self) -> Mapping[str, Queue]:
        """Queues by name (read-only view)."""
        return MappingProxyType(self._queues)

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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
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
            if self.policies:
                self._apply_exchange_policy(exchange)
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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
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
        self.applied.pop(("exchange", exchange.name), None)
        if self.journal is not None:
            self.journal.removed("exchange", exchange.name, durable=exchange.durable)
        # Its own bindings go a slice per step (it may be bound tens of thousands of times):
        # nothing routes through it from now on, and until then the reverse
        # index may still name it as a source of its destinations (see _unbind_deleted).
        if exchange.has_bindings:
            self.defer(partial(self._unbind_deleted, exchange))
        # RabbitMQ remove_for_destination: bindings to it go too, and may auto-delete sources.
        self._unbind_destination(ExchangeDestination(exchange.name),
                                 self._bindings.pop_sources(exchange.name, to_exchange=True))

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
        settings = None
        if self.policies:
            where = self._rs("queue", name)
            parse_queue_arguments(arguments, where)  # its own arguments first: 406 as before
            found = self.policies.resolve("queue", name)
            definition = merged_definition(*found)
            if definition is not None:
                self.applied[("queue", name)] = found
                settings = parse_queue_arguments(effective_queue_arguments(arguments, definition), where)
        queue = make_queue(
            name, durable=durable, exclusive_owner=owner if exclusive else None,
            auto_delete=auto_delete, arguments=arguments, settings=settings, on_drop=self._on_drop,
            vhost=self.name, host=self,
        )
        self._queues[name] = queue
        self._declared += 1
        queue.declared = self._declared
        self._featured_queues += not queue.plain
        if durable and self._queue_store is not None:
            queue.store = self._queue_store
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
        self.applied.pop(("queue", queue.name), None)
        if self.journal is not None:
            self.journal.removed("queue", queue.name, durable=queue.durable)
        if queue.exclusive_owner is not None:
            self._exclusive.remove(queue)
        return queue.delete()

    def delete_all(self) -> list[QueueConsumer]:
        """The vhost is deleted (rabbitmqctl delete_vhost): every queue goes as queue.delete
        takes it (its index records say so); returns their consumers, to cancel. Its durable
        definitions are the runtime's to remove, all at once."""
        self.deleted = True
        self.journal = None
        consumers: list[QueueConsumer] = []
        for queue in list(self._queues.values()):
            consumers += self._delete_queue(queue)
        return consumers

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

        Qpid's Message Delivery, "Removal": "if the queue is of auto-delete type and the subscription being
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

    # -------------------------------------------------------------------- policies

    def apply_policies(self) -> None:
        """The policies changed: every queue and exchange gets the one that applies to it now
        (RabbitMQ update_matched_objects), those whose policy changed their effective arguments."""
        for queue in list(self._queues.values()):
            if not queue.deleted:
                self._apply_queue_policy(queue)
        for exchange in list(self._exchanges.values()):
            if exchange.name:
                self._apply_exchange_policy(exchange)

    def _apply_queue_policy(self, queue: Queue) -> None:
        key = ("queue", queue.name)
        found = self.policies.resolve("queue", queue.name)
        if found == self.applied.get(key, (None, None)):
            return
        if found == (None, None):
            self.applied.pop(key, None)
        else:
            self.applied[key] = found
        effective = effective_queue_arguments(queue.arguments, merged_definition(*found))
        try:
            settings = parse_queue_arguments(effective, queue.description)
        except AMQPError:  # a policy's value a queue argument would refuse: keep the queue's own
            settings = parse_queue_arguments(queue.arguments, queue.description)
        if settings == queue.settings:
            return
        queue.settings = settings
        if queue.plain and settings.needs_featured_storage:
            upgrade(queue)
            self._featured_queues += 1
        queue.change_settings(settings)

    def _apply_exchange_policy(self, exchange: Exchange) -> None:
        key = ("exchange", exchange.name)
        found = self.policies.resolve("exchange", exchange.name)
        if found == (None, None):
            self.applied.pop(key, None)
        else:
            self.applied[key] = found
        exchange.alternate = effective_alternate(exchange.arguments, merged_definition(*found))
        exchange.routes_only_to_queues = not exchange.exchange_bindings and exchange.alternate is None

    def policy_of(self, kind: str, name: str) -> tuple[str | None, dict[str, Any] | None]:
        """The name of the policy applying to ``kind`` ``name`` and the effective definition
        (management's ``policy`` and ``effective_policy_definition``)."""
        policy, operator = self.applied.get((kind, name), (None, None))
        return (policy.name if policy is not None else None, merged_definition(policy, operator))
