"""Exchanges and routing: direct, fanout, topic and headers, matching as RabbitMQ does.

An :class:`Exchange` keeps its bindings -- ``(destination, routing key, arguments)`` triples,
compared with arguments as an order-insensitive table -- and hands routing to one router per
exchange type. Destinations are opaque hashables: the virtual host binds queue names (``str``)
and, for exchange-to-exchange bindings, :class:`ExchangeDestination`; following those, and the
``alternate-exchange`` argument, is the virtual host's walk (RabbitMQ ``rabbit_exchange:route``).

* direct: routing key → destinations, one dict lookup.
* fanout: every destination.
* topic: a trie of binding-key words, the structure RabbitMQ's ``rabbit_exchange_type_topic``
  uses; it is the "compiled" form of every pattern at once, and results are cached per routing
  key until the bindings change. ``*`` is exactly one word, ``#`` zero or more; words are split
  on ``.`` and the empty routing key has no words (RabbitMQ ``split_topic_key``).
* headers: each binding is compiled once into an ``x-match`` mode and a pattern
  (``rabbit_exchange_type_headers:headers_match``).

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
from typing import Any, NamedTuple, Protocol

from broker.errors import CommandInvalid, PreconditionFailed
from broker.federation import (
    DOWNSTREAM_NAME_ARG,
    DOWNSTREAM_VHOST_ARG,
    MAX_HOPS_ARG,
    UPSTREAM_TYPE,
    should_forward,
)
from broker.messages.field_tables import (
    Arguments,
    Inequivalence,
    amqp_type_name,
    args_inequivalence,
    as_bytes,
    field_inequivalence,
    freeze,
    same_value,
    value_text,
)

# RabbitMQ compares only these exchange arguments on redeclare (rabbit_exchange_type
# assert_args_equivalence → [<<"alternate-exchange">>]); others are accepted as they come.
EXCHANGE_ARG_KEYS = ("alternate-exchange",)

_TOPIC_CACHE_MAX = 4096

BindingKey = tuple[Hashable, str, Hashable]


class ExchangeDestination(NamedTuple):
    """An exchange as the destination of a binding (exchange.bind), never equal to a queue name."""

    name: str


class Binding(NamedTuple):
    """One binding of an exchange, as declared."""

    destination: Hashable
    routing_key: str
    arguments: dict[str, Any]


# ------------------------------------------------------------------------------ routers


class _Router(Protocol):
    uses_routing_key: bool

    def add(self, key: BindingKey, destination: Hashable, routing_key: str, arguments: Arguments) -> None: ...

    def remove(self, key: BindingKey, destination: Hashable, routing_key: str) -> None: ...

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]: ...


def _count_up(counts: dict[Hashable, int], destination: Hashable) -> None:
    counts[destination] = counts.get(destination, 0) + 1


def _count_down(counts: dict[Hashable, int], destination: Hashable) -> None:
    # Several bindings (different arguments) may route one key to one destination.
    left = counts[destination] - 1
    if left:
        counts[destination] = left
    else:
        del counts[destination]


class _DirectRouter:
    """Exact routing-key match (AMQP 0-9-1 §3.1.3.1)."""

    uses_routing_key = True

    def __init__(self) -> None:
        self._by_key: dict[str, dict[Hashable, int]] = {}

    def add(self, key: BindingKey, destination: Hashable, routing_key: str, arguments: Arguments) -> None:
        _count_up(self._by_key.setdefault(routing_key, {}), destination)

    def remove(self, key: BindingKey, destination: Hashable, routing_key: str) -> None:
        counts = self._by_key[routing_key]
        _count_down(counts, destination)
        if not counts:
            del self._by_key[routing_key]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]:
        counts = self._by_key.get(routing_key)
        return set(counts) if counts else set()


class _FanoutRouter:
    """Every bound destination, whatever the routing key (AMQP 0-9-1 §3.1.3.2)."""

    uses_routing_key = False

    def __init__(self) -> None:
        self._counts: dict[Hashable, int] = {}

    def add(self, key: BindingKey, destination: Hashable, routing_key: str, arguments: Arguments) -> None:
        _count_up(self._counts, destination)

    def remove(self, key: BindingKey, destination: Hashable, routing_key: str) -> None:
        _count_down(self._counts, destination)

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]:
        return set(self._counts)


class _TopicNode:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.destinations: dict[Hashable, int] = {}


def topic_words(key: str) -> list[str]:
    """RabbitMQ ``split_topic_key``: ``""`` has no words, ``"a..b"`` has an empty middle word."""
    return key.split(".") if key else []


class _TopicRouter:
    """Binding keys in a word trie; ``*`` one word, ``#`` zero or more (AMQP 0-9-1 §3.1.3.3)."""

    uses_routing_key = True

    def __init__(self) -> None:
        self._root = _TopicNode()
        self._cache: dict[str, frozenset[Hashable]] = {}

    def add(self, key: BindingKey, destination: Hashable, routing_key: str, arguments: Arguments) -> None:
        node = self._root
        for word in topic_words(routing_key):
            node = node.children.setdefault(word, _TopicNode())
        _count_up(node.destinations, destination)
        self._cache.clear()

    def remove(self, key: BindingKey, destination: Hashable, routing_key: str) -> None:
        words = topic_words(routing_key)
        path = [self._root]
        for word in words:
            path.append(path[-1].children[word])
        _count_down(path[-1].destinations, destination)
        # Prune the branch that no longer leads to a binding, deepest node first.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]:
        hit = self._cache.get(routing_key)
        if hit is None:
            hit = frozenset(self._match(topic_words(routing_key)))
            if len(self._cache) >= _TOPIC_CACHE_MAX:
                self._cache.clear()
            self._cache[routing_key] = hit
        return set(hit)

    def _match(self, words: list[str]) -> set[Hashable]:
        # RabbitMQ trie_match as an explicit walk; (node, word index) pairs already explored
        # add nothing to a union, so they are skipped -- "#.#.#" cannot blow up exponentially.
        found: set[Hashable] = set()
        seen: set[tuple[_TopicNode, int]] = set()
        end = len(words)
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            if (node, i) in seen:
                continue
            seen.add((node, i))
            hash_node = node.children.get("#")
            if hash_node is not None:
                stack.extend((hash_node, j) for j in range(i, end + 1))  # '#' eats 0..n words
            if i == end:
                found.update(node.destinations)
                continue
            for word in (words[i], "*"):
                child = node.children.get(word)
                if child is not None:
                    stack.append((child, i + 1))
        return found


class _HeadersMatcher:
    """One headers binding, compiled: ``x-match`` mode plus the (key, value) pairs it tests."""

    __slots__ = ("any", "pattern")

    def __init__(self, arguments: Arguments) -> None:
        mode = _x_match(arguments.get("x-match"))
        with_x = mode.endswith("-with-x")
        self.any = mode.startswith("any")
        # x-match itself never takes part; other x- keys only in the *-with-x modes.
        self.pattern = tuple(
            (k, v) for k, v in sorted(arguments.items())
            if k != "x-match" and (with_x or not k.startswith("x-"))
        )

    def __call__(self, headers: Mapping[str, Any]) -> bool:
        if self.any:
            return any(k in headers and (v is None or same_value(v, headers[k])) for k, v in self.pattern)
        # A binding value with no value (void) asks only that the header be present.
        return all(k in headers and (v is None or same_value(v, headers[k])) for k, v in self.pattern)


_X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def _x_match(value: Any) -> str:
    """Validate ``x-match`` as RabbitMQ's ``validate_binding`` does (absent means all)."""
    if value is None:
        return "all"
    raw = as_bytes(value)
    if raw is None:
        raise PreconditionFailed(
            f"Invalid x-match field type {amqp_type_name(value)} (value {value_text(value)}); "
            "expected longstr"
        )
    mode = raw.decode(errors="replace")
    if mode not in _X_MATCH_MODES:
        raise PreconditionFailed(
            f'Invalid x-match field value <<"{mode}">>; expected all, any, all-with-x, or any-with-x'
        )
    return mode


def _value_key(value: Any) -> Hashable | None:
    """A hashable stand-in for a field value, equal for any two values ``same_value`` takes
    as equal (booleans apart from numbers, str and bytes alike, 1 and 1.0 alike); None for
    a value with none (a table or an array)."""
    if isinstance(value, bool):
        return (bool, value)
    raw = as_bytes(value)
    if raw is not None:
        return (bytes, raw)
    try:
        hash(value)
    except TypeError:
        return None
    return (None, value)


class _HeadersRouter:
    """Match message headers against each binding's arguments (AMQP 0-9-1 §3.1.3.4).

    A message can only match a binding that one of its headers leads to, so the bindings are
    indexed by (header, value) -- by header alone for a pattern field with no value, which
    asks only for presence: an ``all`` binding under one of its fields (the one whose entry
    holds the fewest bindings yet), an ``any`` binding under each. A route matches the
    bindings its headers lead to (and the few that cannot be indexed: no fields, or values
    with no hashable form) in full. RabbitMQ matches every binding of the exchange for each
    message, which with thousands of bindings would hold the supervisor for each one."""

    uses_routing_key = False

    def __init__(self) -> None:
        self._matchers: dict[BindingKey, tuple[Hashable, _HeadersMatcher]] = {}
        # (header, _value_key) or (header,) -> the bindings indexed under it
        self._index: dict[tuple[Hashable, ...], dict[BindingKey, None]] = {}
        self._indexed_under: dict[BindingKey, list[tuple[Hashable, ...]]] = {}
        self._unindexed: dict[BindingKey, None] = {}

    def add(self, key: BindingKey, destination: Hashable, routing_key: str, arguments: Arguments) -> None:
        matcher = _HeadersMatcher(arguments)
        self._matchers[key] = (destination, matcher)
        entries = self._entries(matcher)
        if entries is None:
            self._unindexed[key] = None
            return
        self._indexed_under[key] = entries
        for entry in entries:
            self._index.setdefault(entry, {})[key] = None

    def _entries(self, matcher: _HeadersMatcher) -> list[tuple[Hashable, ...]] | None:
        """Where a binding goes in the index; None: it cannot be indexed."""
        entries: list[tuple[Hashable, ...]] = []
        for k, v in matcher.pattern:
            if v is None:
                entries.append((k,))
                continue
            value = _value_key(v)
            if value is None:
                if matcher.any:  # a header could match this field unseen by the index
                    return None
                continue
            entries.append((k, value))
        if not entries:
            return None
        if matcher.any:
            return entries
        return [min(entries, key=lambda entry: len(self._index.get(entry, ())))]

    def remove(self, key: BindingKey, destination: Hashable, routing_key: str) -> None:
        del self._matchers[key]
        if self._unindexed.pop(key, 0) is None:
            return
        for entry in self._indexed_under.pop(key):
            bindings = self._index[entry]
            del bindings[key]
            if not bindings:
                del self._index[entry]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]:
        data = headers or {}
        index = self._index
        candidates: dict[BindingKey, None] = dict(self._unindexed)
        for k, v in data.items():
            present = index.get((k,))
            if present:
                candidates.update(present)
            value = _value_key(v)
            if value is not None and (equal := index.get((k, value))):
                candidates.update(equal)
        matchers = self._matchers
        return {dest for key in candidates
                for dest, matches in (matchers[key],) if matches(data)}


class _FederationUpstreamRouter(_FanoutRouter):
    """``x-federation-upstream`` (rabbit_federation_upstream_exchange): fanout, less what has
    made ``x-max-hops`` hops or passed through its downstream (broker.federation)."""

    def __init__(self, arguments: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        args = arguments or {}
        self._hops = args.get(MAX_HOPS_ARG)
        self._downstream = (_text(args.get(DOWNSTREAM_NAME_ARG)),
                            _text(args.get(DOWNSTREAM_VHOST_ARG)))

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> set[Hashable]:
        if should_forward(headers, int(self._hops or 0), *self._downstream):
            return set(self._counts)
        return set()


def _text(value: Any) -> str | None:
    return bytes(value).decode(errors="replace") if isinstance(value, (bytes, bytearray)) \
        else value if isinstance(value, str) else None


_ROUTERS: dict[str, type[_DirectRouter | _FanoutRouter | _TopicRouter | _HeadersRouter]] = {
    "direct": _DirectRouter,
    "fanout": _FanoutRouter,
    "topic": _TopicRouter,
    "headers": _HeadersRouter,
    UPSTREAM_TYPE: _FederationUpstreamRouter,
}


def _is_long(arguments: Arguments | None, key: str) -> bool:
    value = (arguments or {}).get(key)
    return isinstance(value, int) and not isinstance(value, bool)


def check_exchange_type(type_name: str) -> str:
    """Raise 503 COMMAND_INVALID for a type this broker does not have (RabbitMQ check_type)."""
    if type_name not in _ROUTERS:
        raise CommandInvalid(f"invalid exchange type '{type_name}'")
    return type_name


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
        if type == UPSTREAM_TYPE and not _is_long(arguments, MAX_HOPS_ARG):
            # rabbit_federation_util:validate_arg
            raise CommandInvalid(f"Missing or invalid argument {MAX_HOPS_ARG}")
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.vhost = vhost
        self._router: _Router = (_FederationUpstreamRouter(arguments) if type == UPSTREAM_TYPE
                                 else _ROUTERS[type]())
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
