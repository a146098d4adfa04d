"""The router per exchange type: direct, fanout, topic, headers and ``x-federation-upstream``.

Each keeps what it needs to route one message -- a dict of routing keys, a set, a trie of topic
words, compiled header patterns -- and answers ``route(routing_key, headers)`` with destinations;
:class:`broker.topology.exchange.Exchange` owns the bindings and tells its router of each one.

* direct: routing key → destinations, one dict lookup.
* fanout: every destination.
* topic: a trie of binding-key words, the structure RabbitMQ's ``rabbit_exchange_type_topic``
  uses; it is the "compiled" form of every pattern at once, and results are cached per routing
  key until the bindings change. ``*`` is exactly one word, ``#`` zero or more; words are split
  on ``.`` and the empty routing key has no words (RabbitMQ ``split_topic_key``).
* headers: each binding is compiled once into an ``x-match`` mode and a pattern
  (``rabbit_exchange_type_headers:headers_match``).
* ``x-federation-upstream``: fanout, less what federation must not forward again.

Called from: the supervisor process, through :class:`broker.topology.exchange.Exchange`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Protocol

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
    amqp_type_name,
    as_bytes,
    same_value,
    value_text,
)

_TOPIC_CACHE_MAX = 4096

# A binding as an exchange keys it: (destination, routing key, frozen arguments).
BindingKey = tuple[Hashable, str, Hashable]


class TypeRouter(Protocol):
    """What an exchange asks of the router for its type."""

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


def new_router(type_name: str, arguments: Arguments | None) -> TypeRouter:
    """The router for an exchange of this (checked) type; raises 503 COMMAND_INVALID for an
    ``x-federation-upstream`` exchange without a long ``x-max-hops``."""
    if type_name == UPSTREAM_TYPE:
        if not _is_long(arguments, MAX_HOPS_ARG):
            # rabbit_federation_util:validate_arg
            raise CommandInvalid(f"Missing or invalid argument {MAX_HOPS_ARG}")
        return _FederationUpstreamRouter(arguments)
    return _ROUTERS[type_name]()
