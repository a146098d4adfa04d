"""Vhost and user limits, as RabbitMQ 3.10.8 has them: ``max-connections`` and ``max-queues``
per vhost (rabbit_vhost_limit), ``max-connections`` and ``max-channels`` per user
(rabbit_auth_backend_internal). A negative value is no limit, 0 allows nothing.

Theory of operation
-------------------
The supervisor keeps both tables. A change comes over the control socket (``shoal ctl
set_vhost_limits`` and friends, the management API's ``/api/vhost-limits`` and
``/api/user-limits``, a definitions import) and is

1. checked with RabbitMQ's texts (:func:`validate`);
2. written to the data directory's definitions (one transaction, on disk when it returns);
3. applied here, and sent to every worker as ``LimitsChanged``.

``max-queues`` is the supervisor's own check: a queue.declare that would create a queue in a
vhost that has as many as its limit is refused (:meth:`RuntimeLimits.check_queue`, 406, as
rabbit_amqqueue does); redeclaring one that exists is not. The connection and channel limits
are checked by the worker a connection lives in (``workers.limits``): it counts its own
connections and channels, and the supervisor tells it what the other workers have -- each
worker reports its use (``LimitUsage``), and every worker gets the sum of the others' in its
``LimitsChanged``. A dead worker's use is forgotten.

The commands (``{"command": ..., ...}`` on the control socket; each answers the changed limits
or ``{"error", "code": missing | invalid}``):

* ``set_vhost_limits {vhost, limits}``: the vhost's limits become ``limits`` (RabbitMQ: the
  whole ``limits`` parameter is replaced); ``clear_vhost_limits {vhost}``;
* ``set_vhost_limit {vhost, name, value}`` / ``clear_vhost_limit {vhost, name}``: one of them
  (the management API's ``PUT``/``DELETE /api/vhost-limits/V/NAME``);
* ``set_user_limits {user, limits}``: merged into the user's (RabbitMQ: ``add``);
  ``clear_user_limits {user, name}``: one, or ``all``;
* ``list_vhost_limits {vhost?}`` -> ``{"limits": [{vhost, value}]}``, ``list_user_limits
  {user?}`` -> ``{"limits": [{user, value}]}``: only those with a limit set;
* ``limit_usage`` -> ``{vhost_connections, user_connections, user_channels}``: what the workers
  last reported they have open, of the vhosts and users with a limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

from broker.errors import PreconditionFailed
from broker.limits import USER_LIMITS, VHOST_LIMITS, LimitError, validate
from broker.storage.definition_store import DefinitionStore
from ipc import records as r

log = logging.getLogger("shoal.limits")

LIMIT_COMMANDS = frozenset({"set_vhost_limits", "clear_vhost_limits", "set_vhost_limit",
                            "clear_vhost_limit", "list_vhost_limits", "set_user_limits",
                            "clear_user_limits", "list_user_limits", "limit_usage"})


class RuntimeLimits:
    """The supervisor's limits, their changes, and the workers' use of them (module text)."""

    def __init__(self, outbox: list[list[Any]], vhost_names: Callable[[], Collection[str]]) -> None:
        self._outbox = outbox
        self._vhost_names = vhost_names
        self.vhosts: dict[str, dict[str, int]] = {}
        self.users: dict[str, dict[str, int]] = {}
        self._user_names: Mapping[str, str] = {}  # who exists (name -> stored password)
        self._store: DefinitionStore | None = None
        self._flush: Callable[[], None] = lambda: None
        self._usage: dict[int, r.LimitUsage] = {}  # worker -> what it last reported

    def attach(self, store: DefinitionStore | None, users: Mapping[str, str],
               flush: Callable[[], None]) -> None:
        """The supervisor's store, users and flush; the stored limits become these."""
        self._store = store
        self._user_names = users
        self._flush = flush
        if store is not None:
            self.vhosts, self.users = store.vhost_limits(), store.user_limits()

    # -- the control commands -------------------------------------------------------------

    def command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        vhost, user = request.get("vhost"), request.get("user")
        try:
            if command == "limit_usage":
                total = self.for_worker(-1)
                return {"vhost_connections": total.vhost_connections,
                        "user_connections": total.user_connections,
                        "user_channels": total.user_channels}
            if command == "list_vhost_limits":
                return {"limits": self._listing(self.vhosts, "vhost", vhost, self._vhost_exists)}
            if command == "list_user_limits":
                return {"limits": self._listing(self.users, "user", user, self._user_exists)}
            if "vhost_limit" in command:
                return self._vhost_change(command, self._vhost_exists(str(vhost or "/")), request)
            return self._user_change(command, self._user_exists(str(user or "")), request)
        except LimitError as exc:
            return {"error": str(exc), "code": exc.code}

    @staticmethod
    def _listing(table: dict[str, dict[str, int]], kind: str, only: Any,
                 exists: Callable[[str], str]) -> list[dict[str, Any]]:
        """The rows of those with a limit set ({kind: name, "value": limits}), or of ``only``."""
        if only is not None:
            exists(str(only))
        return [{kind: key, "value": dict(limits)} for key, limits in sorted(table.items())
                if limits and (only is None or key == only)]

    def _vhost_change(self, command: str, vhost: str, request: dict[str, Any]) -> dict[str, Any]:
        limits = dict(self.vhosts.get(vhost, {}))
        name = str(request.get("name"))
        if command == "set_vhost_limits":  # the whole set (rabbit_vhost_limit:set)
            limits = validate(request.get("limits"), VHOST_LIMITS, "limits")
        elif command == "set_vhost_limit":  # one of them (update_limit)
            limits.update(validate({name: request.get("value")}, VHOST_LIMITS, "limits"))
        elif command == "clear_vhost_limit":
            limits.pop(name, None)
        else:
            limits = {}
        return {"vhost": vhost, "value": self.set_vhost(vhost, limits)}

    def _user_change(self, command: str, user: str, request: dict[str, Any]) -> dict[str, Any]:
        limits = dict(self.users.get(user, {}))
        if command == "set_user_limits":  # merged (rabbit_auth_backend_internal: add)
            limits.update(validate(request.get("limits"), USER_LIMITS, "user-limits"))
        elif (name := str(request.get("name") or "all")) == "all":
            limits = {}
        else:
            limits.pop(name, None)
        return {"user": user, "value": self.set_user(user, limits)}

    def set_vhost(self, vhost: str, limits: dict[str, int]) -> dict[str, int]:
        """Make ``limits`` (checked) the vhost's; stored, then told to every worker."""
        if self._store is not None:
            self._store.put_vhost_limits(vhost, limits)
        return self._set(self.vhosts, "vhost", vhost, limits)

    def set_user(self, user: str, limits: dict[str, int]) -> dict[str, int]:
        if self._store is not None:
            self._store.put_user_limits(user, limits)
        return self._set(self.users, "user", user, limits)

    def _set(self, table: dict[str, dict[str, int]], kind: str, key: str,
             limits: dict[str, int]) -> dict[str, int]:
        if limits:
            table[key] = dict(limits)
        else:
            table.pop(key, None)
        log.info("limits of %s '%s' set to %s", kind, key, limits or "none")
        self.tell()
        return limits

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's limits go with it (rabbit_vhost:delete clears its parameters)."""
        if vhost in self.vhosts:
            self.set_vhost(vhost, {})

    def forget_user(self, user: str) -> None:
        """A deleted user's limits go with it (the store deleted its rows)."""
        if self.users.pop(user, None) is not None:
            self.tell()

    def _vhost_exists(self, vhost: str) -> str:
        if vhost not in self._vhost_names():
            raise LimitError("missing", f"Virtual host '{vhost}' does not exist")
        return vhost

    def _user_exists(self, user: str) -> str:
        if user not in self._user_names:
            raise LimitError("missing", f'User "{user}" does not exist')
        return user

    # -- the queue limit, the workers' use ------------------------------------------------

    def check_queue(self, vhost: str, queues: Collection[str], name: str) -> None:
        """Refuse a queue.declare that would create a queue past the vhost's max-queues
        (rabbit_amqqueue's text); one that exists is no new queue."""
        limit = self.vhosts.get(vhost, {}).get("max-queues", -1)
        if limit >= 0 and name not in queues and len(queues) >= limit:
            raise PreconditionFailed(
                f"cannot declare queue '{name}': queue limit in vhost '{vhost}' ({limit}) is reached")

    def usage_reported(self, worker: int, rec: r.LimitUsage) -> None:
        """A worker's use changed: the others hear of it (``LimitUsage``)."""
        self._usage[worker] = rec
        self.tell(skip=worker)

    def forget_worker(self, worker: int) -> None:
        if self._usage.pop(worker, None) is not None:
            self.tell(skip=worker)

    def tell(self, skip: int | None = None) -> None:
        """Every worker (but ``skip``) gets the limits and the other workers' use of them."""
        for worker, outbox in enumerate(self._outbox):
            if worker != skip:
                outbox.append(self.for_worker(worker))
        self._flush()

    def for_worker(self, worker: int) -> r.LimitsChanged:
        """The limits, and the use of them of every worker but ``worker``."""
        sums: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
        for other, usage in self._usage.items():
            if other == worker:
                continue
            for total, counts in zip(sums, (usage.vhost_connections, usage.user_connections,
                                            usage.user_channels), strict=True):
                for key, n in counts.items():
                    total[key] = total.get(key, 0) + n
        return r.LimitsChanged({v: dict(x) for v, x in self.vhosts.items()},
                               {u: dict(x) for u, x in self.users.items()}, *sums)

