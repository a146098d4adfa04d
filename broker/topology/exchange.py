"""Exchanges: their bindings, and routing through the router for their type.

An :class:`Exchange` keeps its bindings -- ``(destination, routing key, arguments)`` triples,
compared with arguments as an order-insensitive table -- and hands routing to one router per
exchange type (:mod:`broker.topology.exchange_types`: direct, fanout, topic, headers and
``x-federation-upstream``). Destinations are opaque hashables: the virtual host binds queue
names (``str``) and, for exchange-to-exchange bindings, :class:`ExchangeDestination`; following
those, and the ``alternate-exchange`` argument, is the virtual host's walk (RabbitMQ
``rabbit_exchange:route``).

Sender-selected distribution (RabbitMQ's ``CC`` / ``BCC`` headers): a message may carry extra
routing keys; :func:`broker.messages.headers.header_routes` reads them and
:meth:`Exchange.route_keys` routes with all of them at once (direct and topic take the union,
fanout and headers ignore routing keys anyway).

Field values -- how they freeze, compare and print, and the redeclare checks built on that
(RabbitMQ ``assert_equivalence``) -- are :mod:`broker.messages.field_tables`'s, shared with queues.

Called from: the supervisor process, through :class:`broker.topology.vhost.VirtualHost`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from itertools import islice
from typing import Any, NamedTuple

from broker.messages.field_tables import (
    Arguments,
    Inequivalence,
    args_inequivalence,
    field_inequivalence,
    freeze,
)
from broker.topology.exchange_types import BindingKey, TypeRouter, check_exchange_type, new_router

# RabbitMQ compares only these exchange arguments on redeclare (rabbit_exchange_type
# assert_args_equivalence → [<<"alternate-exchange">>]); others are accepted as they come.
EXCHANGE_ARG_KEYS = ("alternate-exchange",)

class ExchangeDestination(NamedTuple):
    """An exchange as the destination of a binding (exchange.bind), never equal to a queue name."""

    name: str


class Binding(NamedTuple):
    """One binding of an exchange, as declared."""

    destination: Hashable
    routing_key: str
    arguments: dict[str, Any]


# ----------------------------------------------------------------------------- exchange


class Exchange:
    """A named exchange with its bindings; routes a routing key + headers to destinations."""

    def __init__(
        self,
        name: str,
        type: str,  # AMQP calls it type
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Arguments | None = None,
        vhost: str = "/",
    ) -> None:
        self.name = name
        self.type = check_exchange_type(type)
        self._router: TypeRouter = new_router(type, arguments)
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.vhost = vhost
        self._bindings: dict[BindingKey, Binding] = {}
        self._by_destination: dict[Hashable, dict[BindingKey, None]] = {}
        # Bindings to exchanges: while there are none and no alternate exchange, every route
        # is a set of queue names and publishing takes the direct path.
        self.exchange_bindings = 0
        alternate = (arguments or {}).get("alternate-exchange")
        if isinstance(alternate, (bytes, bytearray)):
            alternate = bytes(alternate).decode(errors="replace")
        self.alternate: str | None = alternate if isinstance(alternate, str) else None
        # No exchange-to-exchange binding and no alternate exchange to follow (a plain
        # attribute: publish reads it every time).
        self.routes_only_to_queues = self.alternate is None
        # Message statistics (broker.queues.message_counts): basic.publish to it, and the
        # copies it routed to queues (RabbitMQ's exchange publish_in and publish_out).
        self.publish_in = 0
        self.publish_out = 0

    @property
    def description(self) -> str:
        """RabbitMQ ``rs/1``: ``exchange 'x' in vhost '/'``."""
        return f"exchange '{self.name}' in vhost '{self.vhost}'"

    def __repr__(self) -> str:
        return f"Exchange({self.name!r}, {self.type!r}, bindings={len(self._bindings)})"

    # ---------------------------------------------------------------------- bindings

    def bind(self, destination: Hashable, routing_key: str, arguments: Arguments | None = None) -> bool:
        """Add a binding; False if an identical one exists (queue.bind is idempotent).

        Called by VirtualHost.bind_queue / declare_queue (queue.bind, implicit default binding).
        Raises PreconditionFailed for a headers binding with a bad ``x-match``.
        """
        args = dict(arguments or {})
        key = (destination, routing_key, freeze(args))
        if key in self._bindings:
            return False
        self._router.add(key, destination, routing_key, args)  # validates before any change
        self._bindings[key] = Binding(destination, routing_key, args)
        if type(destination) is ExchangeDestination:
            self.exchange_bindings += 1
            self.routes_only_to_queues = False
        self._by_destination.setdefault(destination, {})[key] = None
        return True

    def unbind(self, destination: Hashable, routing_key: str, arguments: Arguments | None = None) -> bool:
        """Remove one binding; False if there was none. Called by VirtualHost.unbind_queue."""
        key = (destination, routing_key, freeze(dict(arguments or {})))
        if key not in self._bindings:
            return False
        self._forget(key)
        return True

    def unbind_destination(self, destination: Hashable, limit: int | None = None) -> int:
        """Remove every binding to ``destination`` (its queue was deleted), or at most
        ``limit`` of them (a queue bound thousands of times: a slice per step); returns how
        many."""
        keys = self._by_destination.get(destination)
        if not keys:
            return 0
        doomed = list(keys) if limit is None or limit >= len(keys) else list(islice(keys, limit))
        for key in doomed:
            self._forget(key)
        return len(doomed)

    def bindings_to(self, destination: Hashable) -> int:
        """How many bindings lead to ``destination``."""
        return len(self._by_destination.get(destination, ()))

    def unbind_some(self, n: int) -> tuple[int, list[Hashable]]:
        """Remove up to ``n`` bindings, newest first (a deleted exchange's go a slice per step);
        returns how many went, and the destinations left with none."""
        bindings = self._bindings
        count = min(n, len(bindings))
        unbound: list[Hashable] = []
        for _ in range(count):
            key, binding = bindings.popitem()
            if self._unindex(key, binding):
                unbound.append(binding.destination)
        return count, unbound

    def _forget(self, key: BindingKey) -> None:
        self._unindex(key, self._bindings.pop(key))

    def _unindex(self, key: BindingKey, binding: Binding) -> bool:
        """``binding`` (``key``) was taken out of ``_bindings``: out of the router and the
        destination index too. Whether its destination is left with no binding."""
        self._router.remove(key, binding.destination, binding.routing_key)
        if type(binding.destination) is ExchangeDestination:
            self.exchange_bindings -= 1
            self.routes_only_to_queues = not self.exchange_bindings and self.alternate is None
        keys = self._by_destination[binding.destination]
        del keys[key]
        if keys:
            return False
        del self._by_destination[binding.destination]
        return True

    @property
    def has_bindings(self) -> bool:
        """Whether anything is bound (exchange.delete if-unused, auto-delete)."""
        return bool(self._bindings)

    def is_bound(self, destination: Hashable) -> bool:
        """Whether any binding leads to ``destination``."""
        return destination in self._by_destination

    def destinations(self) -> list[Hashable]:
        """Every destination with at least one binding."""
        return list(self._by_destination)

    def bindings(self) -> list[Binding]:
        """Every binding, in the order they were made."""
        return list(self._bindings.values())

    # ------------------------------------------------------------------------ routing

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> set[Hashable]:
        """Destinations a message with this routing key and headers goes to, each once.

        Called by VirtualHost.publish (basic.publish, on the hot path).
        """
        return self._router.route(routing_key, headers)

    def route_keys(self, routing_keys: Iterable[str],
                   headers: Mapping[str, Any] | None = None) -> set[Hashable]:
        """Destinations for a message with several routing keys (the publish key plus CC and
        BCC keys): the union over the keys, each destination once (rabbit_exchange_type_direct /
        _topic route every key of the delivery; fanout and headers ignore routing keys).

        Called by VirtualHost when a message carries CC / BCC headers.
        """
        router = self._router
        if not router.uses_routing_key:
            return router.route("", headers)
        found: set[Hashable] = set()
        for routing_key in routing_keys:
            found |= router.route(routing_key, headers)
        return found

    # -------------------------------------------------------------------- redeclare

    def inequivalent_arg(
        self,
        type: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Arguments | None = None,
    ) -> Inequivalence | None:
        """The first property a redeclare would change, in RabbitMQ's order; None if equivalent."""
        for field, received, current in (
            ("type", type, self.type),
            ("durable", durable, self.durable),
            ("auto_delete", auto_delete, self.auto_delete),
            ("internal", internal, self.internal),
        ):
            diff = field_inequivalence(field, received, current)
            if diff is not None:
                return diff
        return args_inequivalence(arguments, self.arguments, EXCHANGE_ARG_KEYS)

    def equivalent(
        self,
        type: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Arguments | None = None,
    ) -> bool:
        """Whether exchange.declare with these properties may succeed on this exchange."""
        return self.inequivalent_arg(
            type, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
        ) is None
