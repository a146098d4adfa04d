"""Policies at runtime: ``shoal ctl set_policy`` and ``PUT /api/policies/...``, applied by the supervisor.

Theory of operation
-------------------
A change comes over the control socket (``broker.runtime.control``: set_policy, clear_policy,
list_policies, and their ``_operator_`` twins) and is applied in this order, as users are
(``broker.runtime.users``):

1. validated (``broker.topology.policies.make_policy``: RabbitMQ's ``Validation failed`` text);
2. written to the data directory's definitions (``DefinitionStore.put_policy`` /
   ``delete_policy``, on disk when it returns);
3. the virtual host's policy table changes and every queue and exchange gets the policy that
   applies to it now (``VirtualHost.apply_policies``), in a batch of the dispatcher's own: a
   new max-length drops messages at once and their dead letters are routed at the batch's end.

The management process asks ``list_policies`` and reads each queue's and exchange's policy in
the snapshot (``broker.runtime.snapshot``), so nothing is pushed to it. At start the stored
policies are loaded (:func:`load_policies`) before the durable queues are declared again, so
those get their policies as they come back.

Called from: the supervisor process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from broker.runtime.dispatch import Dispatcher
from broker.storage.definition_store import DefinitionStore
from broker.topology.policies import PolicyError, make_policy
from broker.topology.vhost import VirtualHost

log = logging.getLogger("shoal.policies")

POLICY_COMMANDS = frozenset({"set_policy", "clear_policy", "list_policies", "set_operator_policy",
                             "clear_operator_policy", "list_operator_policies"})


def load_policies(vhost: VirtualHost, stored: list[dict[str, Any]]) -> list[str]:
    """The stored policies into ``vhost``'s table (before its queues are declared); one line per
    policy this Shoal refuses now (logged, skipped)."""
    skipped = []
    for p in stored:
        if p.get("vhost") != vhost.name:
            continue
        try:
            policy = make_policy(vhost.name, p["name"], p["pattern"], p["definition"],
                                 p["priority"], p["apply-to"], operator=bool(p.get("operator")))
        except PolicyError as exc:
            line = f"policy '{p['name']}': {exc}".strip()
            log.error("definitions: not restored: %s", line)
            skipped.append(line)
            continue
        vhost.policies.table(bool(p.get("operator")))[policy.name] = policy
    return skipped


class RuntimePolicies:
    """The supervisor's side of the policy commands (module text)."""

    def __init__(self, dispatcher: Dispatcher, store: DefinitionStore | None,
                 flush: Callable[[], None]) -> None:
        self._dispatcher = dispatcher
        self._store = store
        self._flush = flush

    def command(self, command: str, request: dict[str, Any]) -> dict[str, Any]:
        operator = "operator" in command
        vhost_name = str(request.get("vhost") or "/")
        vhost = self._dispatcher.vhosts.get(vhost_name)
        if vhost is None:
            return {"error": f"Virtual host '{vhost_name}' does not exist", "code": "missing"}
        if command.startswith("list_"):
            return {"policies": [p.as_json() for p in vhost.policies.listing(operator)]}
        name = str(request.get("name") or "")
        if command.startswith("clear_"):
            return self.clear(name, operator, vhost=vhost)
        try:
            return self.set(name, request.get("pattern"), request.get("definition"),
                            request.get("priority"), request.get("apply-to"), operator, vhost=vhost)
        except PolicyError as exc:
            return {"error": str(exc), "code": "invalid"}

    def set(self, name: str, pattern: Any, definition: Any, priority: Any, apply_to: Any,
            operator: bool = False, *, vhost: VirtualHost | None = None) -> dict[str, Any]:
        """Add or replace a policy of ``vhost`` (None: "/"); applied to every matching queue
        and exchange of it at once."""
        vhost = vhost or self._dispatcher.vhost
        if not name:
            raise PolicyError("Validation failed\n\na policy needs a non-empty name\n")
        policy = make_policy(vhost.name, name, pattern, definition, priority, apply_to,
                             operator=operator)
        table = vhost.policies.table(operator)
        created = name not in table
        if self._store is not None:
            self._store.put_policy(policy.as_json(), operator)
        table[name] = policy
        self._apply(vhost)
        log.info("%s '%s' set: pattern '%s', apply-to %s, priority %d, %s",
                 "operator policy" if operator else "policy", name, policy.pattern,
                 policy.apply_to, policy.priority, policy.definition)
        return {**policy.as_json(), "created": created}

    def clear(self, name: str, operator: bool = False, *,
              vhost: VirtualHost | None = None) -> dict[str, Any]:
        vhost = vhost or self._dispatcher.vhost
        table = vhost.policies.table(operator)
        if name not in table:
            kind = "operator policy" if operator else "policy"
            return {"error": f"Parameter does not exist ({kind} '{name}' in vhost '{vhost.name}')",
                    "code": "missing"}
        if self._store is not None:
            self._store.delete_policy(vhost.name, name, operator)
        del table[name]
        self._apply(vhost)
        log.info("%s '%s' cleared", "operator policy" if operator else "policy", name)
        return {"cleared": name}

    def _apply(self, vhost: VirtualHost) -> None:
        d = self._dispatcher
        d.begin_batch(time.monotonic())
        try:
            vhost.apply_policies()
        finally:
            d.end_batch()
            self._flush()


def policy_snapshot(vhost: VirtualHost) -> dict[str, Any]:
    """The snapshot's ``policies`` (broker.runtime.snapshot): both tables, and per queue and
    exchange some policy applies to ``[policy, operator policy, effective definition]``."""
    applied: dict[str, dict[str, list[Any]]] = {"queue": {}, "exchange": {}}
    for (kind, name), (policy, operator) in vhost.applied.items():
        applied[kind][name] = [policy.name if policy is not None else None,
                               operator.name if operator is not None else None,
                               vhost.policy_of(kind, name)[1]]
    return {"policies": [p.as_json() for p in vhost.policies.listing()],
            "operator_policies": [p.as_json() for p in vhost.policies.listing(True)],
            "applied": applied}
