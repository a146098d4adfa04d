"""A virtual host's reverse binding index: for each queue and exchange, the exchanges bound to it.

An exchange holds its own bindings, by destination (:mod:`broker.topology.exchange`). Deleting a queue
or an exchange must find the bindings *to* it without looking at every exchange, so the virtual
host keeps this index beside them: a delete is O(the bindings to it). Queues and exchanges
have separate indexes (a queue and an exchange may share a name).

Called from: the supervisor process (``broker.topology.vhost``).
"""

from __future__ import annotations


class BindingIndex:
    """Destination name → the names of the exchanges holding a binding to it."""

    __slots__ = ("_to_exchange", "_to_queue")

    def __init__(self) -> None:
        self._to_queue: dict[str, dict[str, None]] = {}
        self._to_exchange: dict[str, dict[str, None]] = {}  # exchange.bind

    def _index(self, to_exchange: bool) -> dict[str, dict[str, None]]:
        return self._to_exchange if to_exchange else self._to_queue

    def bound(self, source: str, destination: str, *, to_exchange: bool) -> None:
        """``source`` now holds a binding to ``destination``."""
        self._index(to_exchange).setdefault(destination, {})[source] = None

    def unbound(self, source: str, destination: str, *, to_exchange: bool) -> None:
        """``source`` holds no binding to ``destination`` any more."""
        sources = self._index(to_exchange).get(destination)
        if sources is not None:
            sources.pop(source, None)

    def pop_sources(self, destination: str, *, to_exchange: bool) -> dict[str, None]:
        """The exchanges bound to ``destination``, which is deleted: forgotten here."""
        return self._index(to_exchange).pop(destination, {})
