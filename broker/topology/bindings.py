"""Bindings of a virtual host: exchange.bind/unbind, queue.bind/unbind, and the bindings of
deleted queues and exchanges going a slice per step.

As RabbitMQ 3.10 (rabbit_binding): binding twice is a no-op; unbinding what is not bound, or
naming a queue or exchange that does not exist, succeeds; the default exchange is neither end
of a binding (403). An auto-delete exchange goes when its last binding does (RabbitMQ
conditional_delete).

The bindings *to* each queue and exchange are indexed (:mod:`broker.topology.binding_index`),
so that deleting one is O(those). They go ``unbind_at_once`` at once and the rest a slice per
step (docs/design.md, "Bounded step"); until then routes through them lead nowhere: no queue or
exchange has that name, and one declared under it first has them removed at once
(:meth:`BindingHost._finish_unbinding`).

:class:`broker.topology.vhost.VirtualHost` derives from :class:`BindingHost`, which keeps none
of the virtual host's state: it reads the exchanges, queues and indexes the virtual host
declares, and looks exchanges and queues up through it.

Called from: the supervisor process (``broker.runtime.dispatch``, through the virtual host).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from functools import partial
from typing import Any

from broker.errors import AccessRefused
from broker.queues.queue import Queue
from broker.topology.binding_index import BindingIndex
from broker.topology.definitions import TopologyJournal
from broker.topology.exchange import Exchange, ExchangeDestination
from broker.topology.step_host import StepHost

DEFAULT_EXCHANGE_REFUSED = "operation not permitted on the default exchange"


class BindingHost(StepHost):
    """The bindings of a virtual host's exchanges (module docstring)."""

    # The virtual host's (broker.topology.vhost.VirtualHost.__init__).
    _exchanges: dict[str, Exchange]
    _bindings: BindingIndex  # destination → the exchanges bound to it
    # By deleted destination (a queue's name, an exchange's ExchangeDestination), the names of
    # the exchanges still bound to it, while its bindings go a slice per step.
    _unbinding: dict[Hashable, dict[str, None]]
    unbind_at_once: int
    journal: TopologyJournal | None

    def exchange(self, name: str) -> Exchange:
        """Look an exchange up (broker.topology.vhost)."""
        raise NotImplementedError

    def queue(self, name: str, *, owner: Hashable) -> Queue:
        """Look a queue up for ``owner`` (broker.topology.vhost)."""
        raise NotImplementedError

    def _remove_exchange(self, exchange: Exchange) -> None:
        """Delete ``exchange`` and its bindings (broker.topology.vhost)."""
        raise NotImplementedError

    # ------------------------------------------------------------ exchange to exchange

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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
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


    # --------------------------------------------------------------- exchange to queue

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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
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
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSED)
        exchange = self.exchange(exchange_name)
        return exchange, self.queue(queue_name, owner=owner)

    # ---------------------------------------------- bindings of deleted destinations

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        # An auto-delete exchange goes when its last binding -- to a queue or an exchange --
        # does (RabbitMQ conditional_delete: no bindings with it as the source).
        if (exchange.auto_delete and not exchange.has_bindings
                and self._exchanges.get(exchange.name) is exchange):
            self._remove_exchange(exchange)

    def _unbind_destination(self, destination: Hashable, sources: dict[str, None]) -> None:
        """A queue (its name) or an exchange (its ExchangeDestination) is deleted; ``sources``
        name the exchanges bound to it (taken out of the reverse index). Their bindings to it go,
        ``unbind_at_once`` of them now and the rest a slice per step (a queue may be bound tens of
        thousands of times), each source auto-deleting after its last (RabbitMQ
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
