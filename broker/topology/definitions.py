"""Durable topology as data: what a restart must bring back, and the changes to it.

RabbitMQ keeps durable exchanges, durable queues and the bindings between durable ends across
restarts; transient ones, exclusive queues (never durable) and the default bindings (every queue
to ``""`` by its name, made again with the queue) are not kept. The virtual host records each
change to durable topology in a :class:`TopologyJournal` as it happens (creation, deletion --
auto-delete and x-expires included -- binding, unbinding); the runtime takes the changes after
each batch and writes them in one transaction (:mod:`broker.storage.definition_store`) before any reply
of that batch goes out, so a declare-ok is never sent for a definition a crash could lose.
At start the runtime loads the definitions and :func:`broker.storage.definition_store.restore` declares
them again.

Pure: no IO here.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ExchangeDef(NamedTuple):
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


class QueueDef(NamedTuple):
    name: str
    auto_delete: bool
    arguments: dict[str, Any]


class BindingDef(NamedTuple):
    """A binding of ``source`` to a queue, or to an exchange when ``to_exchange``."""

    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: dict[str, Any]


class Removed(NamedTuple):
    """A durable exchange or queue went; its bindings (either end) go with it."""

    kind: str  # "exchange" or "queue"
    name: str


class Unbound(NamedTuple):
    binding: BindingDef


Change = ExchangeDef | QueueDef | BindingDef | Removed | Unbound


class Definitions(NamedTuple):
    """What a store holds: durable exchanges, queues and bindings, each in creation order."""

    exchanges: list[ExchangeDef]
    queues: list[QueueDef]
    bindings: list[BindingDef]


class TopologyJournal:
    """Changes to durable topology not yet written; the virtual host appends, the runtime takes.

    The checks of what is durable live here, so the virtual host calls one method per change:
    an exchange or queue counts if it is durable; a binding if both its ends are.
    """

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def take(self) -> list[Change]:
        changes, self.changes = self.changes, []
        return changes

    def exchange_created(self, name: str, type: str, *, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict[str, Any]) -> None:
        if durable:
            self.changes.append(ExchangeDef(name, type, auto_delete, internal, dict(arguments)))

    def queue_created(self, name: str, *, durable: bool, auto_delete: bool,
                      arguments: dict[str, Any]) -> None:
        if durable:
            self.changes.append(QueueDef(name, auto_delete, dict(arguments)))

    def removed(self, kind: str, name: str, *, durable: bool) -> None:
        if durable:
            self.changes.append(Removed(kind, name))

    def bound(self, source: str, destination: str, routing_key: str, arguments: Any, *,
              to_exchange: bool, durable: bool) -> None:
        """``durable``: both ends are."""
        if durable:
            self.changes.append(BindingDef(source, destination, to_exchange, routing_key,
                                           dict(arguments or {})))

    def unbound(self, source: str, destination: str, routing_key: str, arguments: Any, *,
                to_exchange: bool, durable: bool) -> None:
        if durable:
            self.changes.append(Unbound(BindingDef(source, destination, to_exchange, routing_key,
                                                   dict(arguments or {}))))
