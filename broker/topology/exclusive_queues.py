"""Exclusive queues of a virtual host: which connection owns each, and RabbitMQ's access check.

An exclusive queue belongs to the connection that declared it -- ``owner``, an opaque key (the
runtime uses ``(worker, conn)``) -- and goes with it; any other connection using it gets 405
RESOURCE_LOCKED. RabbitMQ check_exclusive_access/3: the lax check (consume, get, purge, bind,
delete) lets anyone use a non-exclusive queue; the strict one (a non-passive redeclare) also
wants the declared exclusivity to match.

Called from: the supervisor process (``broker.topology.vhost``).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable

from broker.errors import ResourceLocked
from broker.queues.queue import Queue


class ExclusiveQueues:
    """The names of the exclusive queues each owner declared, in declaration order."""

    __slots__ = ("_owned",)

    def __init__(self) -> None:
        self._owned: dict[Hashable, dict[str, None]] = {}

    def add(self, owner: Hashable, name: str) -> None:
        """``owner`` declared exclusive queue ``name``."""
        self._owned.setdefault(owner, {})[name] = None

    def remove(self, queue: Queue) -> None:
        """Exclusive ``queue`` is deleted."""
        owned = self._owned.get(queue.exclusive_owner, {})
        owned.pop(queue.name, None)
        if not owned:
            self._owned.pop(queue.exclusive_owner, None)

    def names(self, owner: Hashable) -> Collection[str]:
        """The exclusive queues ``owner`` declared (still there)."""
        return self._owned.get(owner, ())

    @staticmethod
    def check(queue: Queue, owner: Hashable | None, *, strict: bool) -> None:
        """ResourceLocked (405) unless ``owner`` may use ``queue`` (lax or ``strict``, above)."""
        if queue.exclusive_owner == owner or (not strict and queue.exclusive_owner is None):
            return
        raise ResourceLocked(
            f"cannot obtain exclusive access to locked {queue.description}. It could be "
            "originally declared on another connection or the exclusive property value does "
            "not match that of the original declaration."
        )
