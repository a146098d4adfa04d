"""Virtual hosts at runtime: ``shoal ctl add_vhost`` and friends, applied by the supervisor.

The model is ``broker.runtime.users``. A command comes over the control socket:

* ``add_vhost {name, description?, tags?, default_queue_type?, grant_to?}``: the vhost is
  written to the definitions (on disk when it returns), made in the dispatcher (its standard
  exchanges, no queues), and every worker learns the new set (``VhostsChanged``), so
  connection.open to it succeeds from then on -- for a user with permissions there: a new vhost
  has none, except that ``grant_to`` (the management API's acting user, as
  rabbit_vhost:put_vhost grants it) gets full ones. An existing vhost's description, tags and
  queue type are updated (``{"created": false}``).
* ``delete_vhost {name}``: everything in it goes -- queues (their durable messages' index
  records say so, as queue.delete's do), exchanges, bindings, policies, permissions, runtime
  parameters (a shovel there stops), its rows in the definitions -- and the workers close its
  connections with ``320 CONNECTION_FORCED - vhost 'V' is deleted`` (rabbit_vhost:delete).
  RabbitMQ lets "/" be deleted too, and so does Shoal.
* ``list_vhosts {}`` -> ``{"vhosts": [{name, description, tags, default_queue_type, metadata,
  messages, messages_ready, messages_unacknowledged}]}`` by name.

A missing vhost is ``{"error": "Virtual host 'V' does not exist", "code": "missing"}``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from broker.permissions import FULL
from broker.runtime.dispatch import Dispatcher
from broker.runtime.parameters import RuntimeParameters
from broker.runtime.permissions import RuntimePermissions
from broker.runtime.users import UserError, parse_tags
from broker.storage.definition_store import DefinitionStore
from broker.topology.vhost import VirtualHost
from ipc import records as r

log = logging.getLogger("shoal.vhosts")

VHOST_COMMANDS = frozenset({"add_vhost", "delete_vhost", "list_vhosts"})


def vhost_row(vhost: VirtualHost) -> dict[str, Any]:
    """rabbitmqctl list_vhosts' and GET /api/vhosts' fields for one vhost (the counts are a walk
    over its queues: cheap next to the listing's own cost)."""
    ready = unacked = 0
    for queue in vhost.queues.values():
        if not queue.deleted:
            ready += queue.message_count
            unacked += queue.acquired_count
    return {"name": vhost.name, "description": vhost.description, "tags": list(vhost.tags),
            "default_queue_type": vhost.default_queue_type,
            "metadata": {"description": vhost.description, "tags": list(vhost.tags)},
            "messages": ready + unacked, "messages_ready": ready,
            "messages_unacknowledged": unacked}


class RuntimeVhosts:
    """The supervisor's side of the vhost commands (module text)."""

    def __init__(self, dispatcher: Dispatcher, store: DefinitionStore | None,
                 permissions: RuntimePermissions | None, parameters: RuntimeParameters | None,
                 flush: Callable[[], None]) -> None:
        self._dispatcher = dispatcher
        self._store = store
        self._permissions = permissions
        self._parameters = parameters
        self._flush = flush

    async def command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        if command == "list_vhosts":
            return {"vhosts": self.listing()}
        name = request.get("name")
        try:
            if not isinstance(name, str) or not name:
                raise UserError("invalid", "a vhost needs a non-empty name")
            if command == "add_vhost":
                tags = parse_tags(request["tags"]) if request.get("tags") is not None else None
                return await self.add(name, str(request.get("description") or ""), tags,
                                      str(request.get("default_queue_type") or ""),
                                      request.get("grant_to"))
            return await self.delete(name)
        except UserError as exc:
            return {"error": str(exc), "code": exc.code}

    def listing(self) -> list[dict[str, Any]]:
        return [vhost_row(v) for v in sorted(self._dispatcher.vhosts, key=lambda v: v.name)]

    async def add(self, name: str, description: str = "", tags: list[str] | None = None,
                  default_queue_type: str = "", grant_to: Any = None) -> dict[str, Any]:
        """rabbitmqctl add_vhost / PUT /api/vhosts/{name} (module text)."""
        d = self._dispatcher
        vhost, created = d.add_vhost(name, description, tags, default_queue_type or None)
        if self._store is not None:
            self._store.put_vhost(name, vhost.description, vhost.tags, vhost.default_queue_type)
        if created:
            log.info("vhost '%s' added", name)
            self._tell([])
            if isinstance(grant_to, str) and self._permissions is not None:
                with contextlib.suppress(UserError):  # not a user of ours: nobody to grant
                    await self._permissions.set(grant_to, name, *FULL)
        return {**vhost_row(vhost), "created": created}

    async def delete(self, name: str) -> dict[str, Any]:
        """rabbitmqctl delete_vhost / DELETE /api/vhosts/{name} (module text)."""
        d = self._dispatcher
        if name not in d.vhosts:
            raise UserError("missing", f"Virtual host '{name}' does not exist")
        if self._parameters is not None:  # while the vhost exists: a shovel there stops
            for vhost, component, param in [k for k in self._parameters.table if k[0] == name]:
                await self._parameters.command("clear_parameter", {
                    "vhost": vhost, "component": component, "name": param})
        d.begin_batch(time.monotonic())
        try:
            d.delete_vhost(name)
        finally:
            d.end_batch()
        if self._store is not None:
            self._store.delete_vhost(name)
        if self._permissions is not None:
            self._permissions.forget_vhost(name)
        d.limits.forget_vhost(name)  # its limits go with it (rabbit_vhost:delete)
        log.info("vhost '%s' deleted, with everything in it; closing its connections", name)
        self._tell([name])
        return {"deleted": name}

    def _tell(self, removed: list[str]) -> None:
        """Every worker learns the set (connection.open checks it) and closes the connections
        on a deleted vhost."""
        names = sorted(self._dispatcher.vhosts.by_name)
        for outbox in self._dispatcher.outbox:
            outbox.append(r.VhostsChanged(names, list(removed)))
        self._flush()
