"""Routing: the queues a message reaches from an exchange of one virtual host.

Routing follows RabbitMQ ``rabbit_exchange:route``: from the published-to exchange through
exchange-to-exchange bindings, each exchange visited once (cycles end), an exchange that routes
nowhere handing over to its ``alternate-exchange``; each queue receives the message once. A
message with ``CC`` / ``BCC`` headers (RabbitMQ's sender-selected distribution) is routed with
its routing key and every CC and BCC key at each step, still reaching each queue once.

The virtual host keeps its own two fast paths (the default exchange, and an exchange bound only
to plain queues) and comes here for everything else: publishes that need checks, and dead-letter
copies (:class:`DeadLetterRouter`; what a copy carries is :mod:`broker.messages.deadletter`'s).
Called from: the supervisor process (``broker.topology.vhost``; dead letters ``broker.topology.step_host``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from broker.errors import PreconditionFailed
from broker.messages.deadletter import DeadLetter, DeadLetterReason, dead_letter_copy, is_cycle
from broker.messages.headers import has_routing_headers, header_routes
from broker.messages.message import (
    BLIND_HEADER,
    BlindCopied,
    FullMessage,
    Message,
    delivered_headers,
    drop_reference,
)
from broker.queues.consumer_manager import QueueConsumer
from broker.queues.queue import Queue
from broker.topology.exchange import (
    Exchange,
    ExchangeDestination,
)


class Router:
    """rabbit_exchange:route over one virtual host's exchanges and queues (shared, not copied)."""

    __slots__ = ("_exchanges", "_queues", "visited")

    def __init__(self, exchanges: Mapping[str, Exchange], queues: Mapping[str, Queue]) -> None:
        self._exchanges = exchanges
        self._queues = queues
        # Exchanges visited by walks of exchange-to-exchange bindings, ever: the runtime counts
        # them as work of its bounded steps (a walk may pass thousands of exchanges).
        self.visited = 0

    def route_published(self, exchange: Exchange, message: Message) -> list[Queue]:
        """:meth:`route` for basic.publish: CC / BCC are checked first (406), and a message with
        a BCC header becomes a BlindCopied (its deliveries are re-encoded without BCC)."""
        queues = self.route(exchange, message)
        headers = message.headers
        if headers is not None and BLIND_HEADER in headers and type(message) is FullMessage:
            message.__class__ = BlindCopied  # same slots: only the reheadered flag changes
        return queues

    def route(self, exchange: Exchange, message: Message) -> list[Queue]:
        """rabbit_exchange:route -- the queues a message reaches from ``exchange``, each once.

        With CC / BCC headers the message is routed with its routing key and every CC and BCC
        key (rabbit_basic header_routes; PreconditionFailed when one is not an array); a
        headers exchange matches the headers without BCC, as RabbitMQ strips it before routing.
        """
        headers = message.headers
        keys: list[str] | None = None
        if headers is not None and has_routing_headers(headers):
            keys = [message.routing_key, *header_routes(headers)]
            headers = delivered_headers(headers)
        if not exchange.routes_only_to_queues:
            names: Iterable[Any] = self._walk(exchange, message.routing_key, keys, headers)
        elif keys is None:
            names = exchange.route(message.routing_key, headers)
        else:
            names = exchange.route_keys(keys, headers)
        return [queue for name in names if (queue := self._queues.get(name)) is not None]

    def _walk(
        self,
        exchange: Exchange,
        routing_key: str,
        keys: list[str] | None,
        headers: Mapping[str, Any] | None,
    ) -> dict[str, None]:
        # Each exchange is visited once, so exchange-to-exchange cycles end; an exchange whose
        # own route is empty hands over to its alternate exchange (process_alternate). ``keys``:
        # every routing key of a CC / BCC message (each hop routes with all of them).
        queues: dict[str, None] = {}
        seen = {exchange.name}
        work = [exchange]
        while work:
            current = work.pop()
            destinations: Iterable[Any] = (
                current.route(routing_key, headers) if keys is None else current.route_keys(keys, headers)
            )
            if current.alternate is not None and not any(
                    d.name in self._exchanges if type(d) is ExchangeDestination else d in self._queues
                    for d in destinations):
                # Nothing, or only bindings of a deleted queue or exchange still going
                # (broker.topology.vhost _unbind_destination), which RabbitMQ would have removed with it.
                destinations = (ExchangeDestination(current.alternate),)
            for destination in destinations:
                if type(destination) is not ExchangeDestination:
                    queues[destination] = None
                elif destination.name not in seen:
                    seen.add(destination.name)
                    following = self._exchanges.get(destination.name)
                    if following is not None:
                        work.append(following)
        self.visited += len(seen)
        return queues


class DeadLetterRouter:
    """Dead-letter copies waiting to be routed, routed in the order they were made.

    A queue that dead-letters a message gets its copy made at once (:meth:`add`, pinning the
    body) and routed later (:meth:`route`), so that routing never re-enters a queue in the
    middle of one of its own operations. RabbitMQ with_dlx: a dead-letter exchange that does
    not exist drops the message; rabbit_dead_letter detect_cycles: automatic cycles are dropped.
    """

    __slots__ = ("_copies", "_exchanges", "_on_drop", "_router", "made")

    def __init__(
        self, router: Router, exchanges: Mapping[str, Exchange], on_drop: Callable[[Message], None] | None
    ) -> None:
        self._router = router
        self._exchanges = exchanges
        self._on_drop = on_drop
        self._copies: deque[tuple[DeadLetter, DeadLetterReason]] = deque()
        self.made = 0  # dead-letter copies made, ever

    def add(self, queue: Queue, message: Message, reason: DeadLetterReason, epoch_seconds: float) -> None:
        """Copy ``message`` for ``queue``'s dead-letter exchange, if it has one that exists."""
        settings = queue.settings
        dlx = settings.dead_letter_exchange
        if dlx is None or dlx not in self._exchanges:
            return
        copy = dead_letter_copy(message, reason, queue.name, dlx, settings.dead_letter_routing_key,
                                epoch_seconds)
        copy.refs += 1  # in flight until routed
        self.made += 1
        self._copies.append((copy, reason))

    @property
    def pending(self) -> bool:
        """Copies wait to be routed."""
        return bool(self._copies)

    def route(self, limit: int | None = None) -> tuple[list[QueueConsumer], int]:
        """Route the waiting copies, oldest first, until ``limit`` queues have been offered
        one (at least one copy; None: all); returns the consumers to notify and the queues
        offered a copy. What is left waits for the next call."""
        notify: list[QueueConsumer] = []
        offered = 0
        while self._copies and (limit is None or offered < limit):
            copy, reason = self._copies.popleft()
            exchange = self._exchanges.get(copy.exchange)
            try:
                queues = self._router.route(exchange, copy) if exchange is not None else []
            except PreconditionFailed:
                queues = []  # CC / BCC not arrays: never published as such, so never seen here
            offered += len(queues) + 1
            for queue in queues:
                if reason == DeadLetterReason.REJECTED or not is_cycle(queue.name, copy.headers):
                    taken = queue.offer(copy)
                    if taken:
                        notify += taken
            drop_reference(copy, self._on_drop)
        return notify, offered
